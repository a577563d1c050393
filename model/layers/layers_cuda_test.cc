// The model-level CUDA kernels against the CPU path, on random inputs, forward and backward:
// the depth retrieval of AttnRes/DAR
// (depth_retrieval_cuda.h; CPU: model/layers/depth_retrieval.cc, called directly) and mHC's
// Sinkhorn normalisation (sinkhorn_cuda.h; CPU: the private loops of Mhc in
// model/variants/mhc.cc, transcribed below as SinkhornReference). Skips without a CUDA build
// or without a GPU.
//
// Tolerances. An element passes when |gpu - cpu| <= rtol * max(|cpu|, rms(cpu)), rms over the
// whole compared array.
//   f32:  rtol 1e-5 (fp32 on both sides; only the order of additions differs). For the
//         Sinkhorn backward (39 chained normalisation backwards, each subtracting a dot
//         product) the CPU reference in float differs from the same loops in double by at most
//         9e-7 on these inputs (measured), so 1e-5 leaves a 10x margin.
//   bf16: the CPU reference runs in f32 on the same bf16-rounded inputs and initial values.
//         Outputs stored in bf16 (out, dkeys, dvalues) get rtol 1e-2 (one bf16 rounding is
//         <= 2^-9 relative); fp32 outputs (retrieval weights, dw, dg) get rtol 1e-4.
//   Sinkhorn is fp32 only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/dtype.h"
#include "core/ops/matmul.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"
#include "model/layers/depth_retrieval.h"
#include "model/layers/depth_retrieval_cuda.h"
#include "model/layers/sinkhorn_cuda.h"

namespace satdar::model {
namespace {

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::Bf16;
using core::gpu_test::DeviceArray;
using core::gpu_test::DeviceVector;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

constexpr double kF32Tol = 1e-5;

template <typename T>
double StoredTol(double bf16_tol) {
  return kIsBf16<T> ? bf16_tol : kF32Tol;
}

// same_sources: AttnRes (keys == values, dkeys == dvalues); otherwise DAR's cross-stream form
// (keys and values from different arrays) with one key gradient skipped (null).
template <typename T>
void CheckDepthRetrieval(bool same_sources) {
  const int s = 5, n = 19, c = 48;
  const double eps = 1e-6;
  const size_t nc = static_cast<size_t>(n) * c;
  core::ThreadPool pool(2);
  std::vector<std::vector<float>> k(s), v(s), dk0(s), dv0(s);
  for (int i = 0; i < s; ++i) {
    k[i] = Quantize<T>(RandomNormal(nc, 100 + i));
    v[i] = same_sources ? k[i] : Quantize<T>(RandomNormal(nc, 200 + i));
    dk0[i] = Quantize<T>(RandomNormal(nc, 300 + i, 0.1f));
    dv0[i] = same_sources ? dk0[i] : Quantize<T>(RandomNormal(nc, 400 + i, 0.1f));
  }
  const auto w = Quantize<T>(RandomNormal(c, 61, 0.5f));
  const auto g = Quantize<T>(RandomNormal(c, 62, 0.5f));
  const auto dout = Quantize<T>(RandomNormal(nc, 63));
  const auto dw0 = RandomNormal(c, 64, 0.1f), dg0 = RandomNormal(c, 65, 0.1f);
  const int skipped = same_sources ? -1 : 2;  // this source's key gradient is not wanted
  // CPU.
  std::vector<std::vector<float>> dk = dk0, dv = dv0;
  std::vector<const float*> kp(s), vp(s);
  std::vector<float*> dkp(s), dvp(s);
  for (int i = 0; i < s; ++i) {
    kp[i] = k[i].data();
    vp[i] = same_sources ? kp[i] : v[i].data();
    dkp[i] = i == skipped ? nullptr : dk[i].data();
    dvp[i] = same_sources ? dkp[i] : dv[i].data();
  }
  std::vector<float> out(nc), alpha(static_cast<size_t>(n) * s), dw = dw0, dg = dg0;
  DepthRetrievalForward<float>(out.data(), alpha.data(), kp, vp, w.data(), g.data(), n, c, eps,
                               &pool);
  DepthRetrievalBackward<float>(dkp, dvp, dw.data(), dg.data(), dout.data(), alpha.data(), kp, vp,
                                w.data(), g.data(), n, c, eps, &pool);
  // GPU.
  std::vector<std::unique_ptr<DeviceArray<T>>> gk, gv, gdk, gdv;
  std::vector<const T*> gkp(s), gvp(s);
  std::vector<T*> gdkp(s), gdvp(s);
  for (int i = 0; i < s; ++i) {
    gk.push_back(std::make_unique<DeviceArray<T>>(k[i]));
    gdk.push_back(std::make_unique<DeviceArray<T>>(dk0[i]));
    if (!same_sources) {
      gv.push_back(std::make_unique<DeviceArray<T>>(v[i]));
      gdv.push_back(std::make_unique<DeviceArray<T>>(dv0[i]));
    }
    gkp[i] = gk[i]->get();
    gvp[i] = same_sources ? gkp[i] : gv[i]->get();
    gdkp[i] = i == skipped ? nullptr : gdk[i]->get();
    gdvp[i] = same_sources ? gdkp[i] : gdv[i]->get();
  }
  DeviceVector<const T*> dkeys(gkp), dvalues(gvp);
  DeviceVector<T*> ddkeys(gdkp), ddvalues(gdvp);
  DeviceArray<T> gw(w), gg(g), gdout(dout), gout(nc);
  DeviceArray<float> galpha(alpha.size()), gws(alpha.size()), gdw(dw0), gdg(dg0);
  ASSERT_EQ(cuda::DepthRetrievalForward(gout.get(), galpha.get(), dkeys.get(), dvalues.get(), s,
                                        gw.get(), gg.get(), n, c, static_cast<float>(eps), nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::DepthRetrievalBackward(ddkeys.get(), ddvalues.get(), gdw.get(), gdg.get(),
                                         gws.get(), gdout.get(), galpha.get(), dkeys.get(),
                                         dvalues.get(), s, gw.get(), gg.get(), n, c,
                                         static_cast<float>(eps), nullptr),
            cudaSuccess);
  const std::string tag = same_sources ? " (same sources)" : " (cross sources)";
  ExpectClose(gout.Download(), out, StoredTol<T>(1e-2), "retrieval out" + tag);
  ExpectClose(galpha.Download(), alpha, StoredTol<T>(1e-4), "retrieval alpha" + tag);
  for (int i = 0; i < s; ++i) {
    const std::string src = " of source " + std::to_string(i) + tag;
    ExpectClose(gdk[i]->Download(), dk[i], StoredTol<T>(1e-2), "retrieval dkeys" + src);
    if (!same_sources) {
      ExpectClose(gdv[i]->Download(), dv[i], StoredTol<T>(1e-2), "retrieval dvalues" + src);
    }
  }
  ExpectClose(gdw.Download(), dw, StoredTol<T>(1e-4), "retrieval dw" + tag);
  ExpectClose(gdg.Download(), dg, StoredTol<T>(1e-4), "retrieval dg" + tag);
}

// The loops of Mhc::Coefficients (Sinkhorn part) and Mhc::CoefficientsBackward, per token.
void SinkhornReference(std::vector<float>* steps, std::vector<float>* dlogits,
                       const std::vector<float>& logits, const std::vector<float>& dfinal,
                       int rows, int n, int nsteps) {
  const int nn = n * n;
  steps->assign(static_cast<size_t>(rows) * nsteps * nn, 0.0f);
  dlogits->assign(static_cast<size_t>(rows) * nn, 0.0f);
  for (int r = 0; r < rows; ++r) {
    float* m = steps->data() + static_cast<size_t>(r) * nsteps * nn;
    const float* z = logits.data() + static_cast<size_t>(r) * nn;
    for (int j = 0; j < n; ++j) {
      float* row = m + j * n;
      float mx = -1e30f;
      for (int k = 0; k < n; ++k) mx = std::max(mx, z[j * n + k]);
      float sum = 0;
      for (int k = 0; k < n; ++k) sum += row[k] = std::exp(z[j * n + k] - mx);
      for (int k = 0; k < n; ++k) row[k] /= sum;
    }
    for (int step = 1; step < nsteps; ++step) {
      const float* a = m + (step - 1) * nn;
      float* b = m + step * nn;
      const bool column = step % 2 == 1;
      for (int q = 0; q < n; ++q) {
        float sum = 0;
        for (int t = 0; t < n; ++t) sum += column ? a[t * n + q] : a[q * n + t];
        for (int t = 0; t < n; ++t) {
          const int idx = column ? t * n + q : q * n + t;
          b[idx] = a[idx] / sum;
        }
      }
    }
    std::vector<float> dm(dfinal.begin() + static_cast<size_t>(r) * nn,
                          dfinal.begin() + static_cast<size_t>(r + 1) * nn),
        da(nn);
    for (int step = nsteps - 1; step >= 1; --step) {
      const float* a = m + (step - 1) * nn;
      const float* b = m + step * nn;
      const bool column = step % 2 == 1;
      for (int q = 0; q < n; ++q) {
        float sum = 0, dot = 0;
        for (int t = 0; t < n; ++t) {
          const int idx = column ? t * n + q : q * n + t;
          sum += a[idx];
          dot += dm[idx] * b[idx];
        }
        for (int t = 0; t < n; ++t) {
          const int idx = column ? t * n + q : q * n + t;
          da[idx] = (dm[idx] - dot) / sum;
        }
      }
      dm.swap(da);
    }
    float* dz = dlogits->data() + static_cast<size_t>(r) * nn;
    for (int j = 0; j < n; ++j) {
      const float* row = m + j * n;
      float dot = 0;
      for (int k = 0; k < n; ++k) dot += dm[j * n + k] * row[k];
      for (int k = 0; k < n; ++k) dz[j * n + k] = row[k] * (dm[j * n + k] - dot);
    }
  }
}

void CheckSinkhorn() {
  const int rows = 37, n = 4, iterations = 20, nsteps = 2 * iterations;
  auto logits = RandomNormal(static_cast<size_t>(rows) * n * n, 71, 2.0f);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) logits[(static_cast<size_t>(r) * n + j) * n + j] += 4.0f;
  }
  const auto dfinal = RandomNormal(logits.size(), 72);
  std::vector<float> steps, dlogits;
  SinkhornReference(&steps, &dlogits, logits, dfinal, rows, n, nsteps);
  DeviceArray<float> glogits(logits), gdfinal(dfinal), gsteps(steps.size()), gdz(logits.size());
  ASSERT_EQ(cuda::SinkhornForward(gsteps.get(), glogits.get(), rows, n, iterations, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::SinkhornBackward(gdz.get(), gdfinal.get(), gsteps.get(), rows, n, iterations,
                                   nullptr),
            cudaSuccess);
  ExpectClose(gsteps.Download(), steps, kF32Tol, "sinkhorn matrices");
  ExpectClose(gdz.Download(), dlogits, kF32Tol, "sinkhorn dlogits");
  // More streams than the kernel supports is refused, not run.
  EXPECT_EQ(cuda::SinkhornForward(gsteps.get(), glogits.get(), 1, cuda::kMaxSinkhornStreams + 1,
                                  iterations, nullptr),
            cudaErrorInvalidValue);
}

#endif  // SATDAR_WITH_CUDA

TEST(LayersCuda, DepthRetrievalF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckDepthRetrieval<float>(false));
  SATDAR_IF_CUDA(CheckDepthRetrieval<float>(true));
}
TEST(LayersCuda, DepthRetrievalBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckDepthRetrieval<Bf16>(false));
  SATDAR_IF_CUDA(CheckDepthRetrieval<Bf16>(true));
}
TEST(LayersCuda, SinkhornF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckSinkhorn());
}

}  // namespace
}  // namespace satdar::model
