// The model-level CUDA kernels against the CPU path, on random inputs, forward and backward:
// mHC's Sinkhorn normalisation (sinkhorn_cuda.h; CPU: the private loops of Mhc in
// model/variants/mhc.cc, transcribed below as SinkhornReference). Skips without a CUDA build
// or without a GPU. (The depth retrieval of AttnRes/DAR is tested by depth_retrieval_ops_test.)
//
// Tolerance. An element passes when |gpu - cpu| <= rtol * max(|cpu|, rms(cpu)), rms over the
// whole compared array: rtol 1e-5, fp32 only (fp32 on both sides; only the order of additions
// differs). For the Sinkhorn backward (39 chained normalisation backwards, each subtracting a
// dot product) the CPU reference in float differs from the same loops in double by at most
// 9e-7 on these inputs (measured), so 1e-5 leaves a 10x margin.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/dtype.h"
#include "core/ops/matmul.h"
#include "gtest/gtest.h"
#include "model/layers/sinkhorn_cuda.h"

namespace satdar::model {
namespace {

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceArray;
using core::gpu_test::ExpectClose;
using core::gpu_test::RandomNormal;

constexpr double kF32Tol = 1e-5;

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

TEST(LayersCuda, SinkhornF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckSinkhorn());
}

}  // namespace
}  // namespace satdar::model
