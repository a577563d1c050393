// The CUDA kernels of the HC residual (hyper_cuda.h) against host loops transcribed from the
// CPU model (hyper_connections.cc), forward and backward, in f32 and bf16. Skips without a
// CUDA build or a GPU. (mHC's coefficients and Sinkhorn: hyper_ops_test; MUDDFormer's dense
// connection: muddformer_ops_test.)
//
// Tolerances (ExpectClose: |gpu - cpu| <= rtol * max(|cpu|, rms(cpu))). The host loops run in
// f32 (double for sums) on the same bf16-rounded inputs. f32: 1e-5 (only the order of
// additions differs). bf16: outputs stored in bf16 get 1e-2 (one rounding is <= 2^-9
// relative, plus fp32 sums); fp32 outputs (coefficients, dot products, sums) get 1e-4.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cuda/testing/gpu_test_util.h"
#include "gtest/gtest.h"
#include "model/variants/hyper_cuda.h"

namespace satdar::model {
namespace {

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::Bf16;
using core::gpu_test::DeviceArray;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

template <typename T>
double Tol(bool stored) {
  if (!kIsBf16<T>) return 1e-5;
  return stored ? 1e-2 : 1e-4;
}

size_t Sz(int a, int b) { return static_cast<size_t>(a) * b; }

// HC: coefficients from (already projected) rows, the width / depth connections and their
// backward, and the coefficients' backward (HyperConnections::Forward / Backward).
template <typename T>
void CheckHc() {
  const int rows = 13, n = 3, c = 40, ld = 8, cols = n * (n + 2);
  const auto h = Quantize<T>(RandomNormal(Sz(rows * n, c), 1));
  const auto y = Quantize<T>(RandomNormal(Sz(rows, c), 2));
  const auto g = Quantize<T>(RandomNormal(Sz(rows * n, c), 3));
  const auto du = Quantize<T>(RandomNormal(Sz(rows, c), 4));
  const auto proj = RandomNormal(Sz(rows * n, ld), 5);
  const auto sa = RandomNormal(Sz(n, n + 1), 6), sb = RandomNormal(n, 7);
  const std::vector<float> alpha_scale = {0.3f}, beta_scale = {-0.2f};
  // Host.
  std::vector<float> t(proj.size()), coef(Sz(rows, cols));
  for (size_t i = 0; i < t.size(); ++i) t[i] = std::tanh(proj[i]);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k <= n; ++k) {
        coef[r * cols + j * (n + 1) + k] = sa[j * (n + 1) + k] + alpha_scale[0] * t[(r * n + j) * ld + k];
      }
      coef[r * cols + n * (n + 1) + j] = sb[j] + beta_scale[0] * t[(r * n + j) * ld + n + 1];
    }
  }
  auto pre = [&](int r, int j) { return coef[r * cols + j * (n + 1)]; };
  auto res = [&](int r, int j, int m) { return coef[r * cols + j * (n + 1) + 1 + m]; };
  auto post = [&](int r, int m) { return coef[r * cols + n * (n + 1) + m]; };
  std::vector<float> u(Sz(rows, c), 0.0f), hout(h.size()), dy(Sz(rows, c), 0.0f), dh(h.size(), 0.0f),
      dcoef(Sz(rows, cols), 0.0f);
  for (int r = 0; r < rows; ++r) {
    for (int e = 0; e < c; ++e) {
      for (int j = 0; j < n; ++j) u[r * c + e] += pre(r, j) * h[(r * n + j) * c + e];
      for (int m = 0; m < n; ++m) {
        float s = post(r, m) * y[r * c + e];
        for (int j = 0; j < n; ++j) s += res(r, j, m) * h[(r * n + j) * c + e];
        hout[(r * n + m) * c + e] = s;
        const float gm = g[(r * n + m) * c + e];
        dy[r * c + e] += post(r, m) * gm;
        for (int j = 0; j < n; ++j) dh[(r * n + j) * c + e] += res(r, j, m) * gm;
      }
    }
    for (int m = 0; m < n; ++m) {
      double dp = 0;
      for (int e = 0; e < c; ++e) dp += double(y[r * c + e]) * g[(r * n + m) * c + e];
      dcoef[r * cols + n * (n + 1) + m] = static_cast<float>(dp);
      for (int j = 0; j < n; ++j) {
        double d = 0;
        for (int e = 0; e < c; ++e) d += double(h[(r * n + j) * c + e]) * g[(r * n + m) * c + e];
        dcoef[r * cols + j * (n + 1) + 1 + m] = static_cast<float>(d);
      }
    }
    for (int j = 0; j < n; ++j) {
      double d = 0;
      for (int e = 0; e < c; ++e) {
        d += double(h[(r * n + j) * c + e]) * du[r * c + e];
        dh[(r * n + j) * c + e] += pre(r, j) * du[r * c + e];
      }
      dcoef[r * cols + j * (n + 1)] = static_cast<float>(d);
    }
  }
  std::vector<float> dproj(Sz(rows * n, ld), 0.0f), scales(Sz(rows, 2), 0.0f);
  std::vector<float> dstatic_alpha(Sz(n, n + 1), 0.0f);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k <= n + 1; ++k) {
        const bool beta = k == n + 1;
        const float d = beta ? dcoef[r * cols + n * (n + 1) + j] : dcoef[r * cols + j * (n + 1) + k];
        const float tk = t[(r * n + j) * ld + k];
        scales[r * 2 + (beta ? 1 : 0)] += d * tk;
        dproj[(r * n + j) * ld + k] = d * (beta ? beta_scale[0] : alpha_scale[0]) * (1 - tk * tk);
      }
    }
    for (int k = 0; k < n * (n + 1); ++k) dstatic_alpha[k] += dcoef[r * cols + k];
  }
  // Device.
  DeviceArray<T> gh(h), gy(y), gg(g), gdu(du), gu(u.size()), ghout(h.size()), gdy(dy.size()),
      gdh(h.size()), gdproj(dproj.size());
  DeviceArray<float> gproj(proj), gcoef(coef.size()), gdcoef(dcoef.size()), gscales(scales.size()),
      gsa(sa), gsb(sb), gas(alpha_scale), gbs(beta_scale),
      gsum(std::vector<float>(dstatic_alpha.size(), 0.0f));
  const cuda::HcParams p{gsa.f32(), gsb.f32(), gas.f32(), gbs.f32()};
  ASSERT_EQ(cuda::HcCoefForward(gcoef.f32(), gproj.f32(), ld, p, rows, n, nullptr), cudaSuccess);
  const cuda::HyperCoefs co = cuda::HcCoefs(gcoef.f32(), n), dco = cuda::HcCoefs(gdcoef.f32(), n);
  ASSERT_EQ(cuda::HyperWidthForward(gu.get(), gh.get(), co, rows, n, c, nullptr), cudaSuccess);
  ASSERT_EQ(cuda::HyperDepthForward(ghout.get(), gh.get(), gy.get(), co, rows, n, c, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::HyperDepthBackward(gdy.get(), gdh.get(), dco, gg.get(), gy.get(), gh.get(), co,
                                     rows, n, c, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::HyperWidthBackward(gdh.get(), dco, gdu.get(), gh.get(), co, rows, n, c, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::HcCoefBackward(gdproj.get(), gscales.f32(), gdcoef.f32(), gproj.f32(), ld, p,
                                 rows, n, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::ColumnSums(gsum.f32(), gdcoef.f32(), rows, n * (n + 1), cols, nullptr),
            cudaSuccess);
  std::vector<float> got_t = gproj.Download();
  for (int r = 0; r < rows * n; ++r) {  // the padding columns are not the kernel's
    for (int k = n + 2; k < ld; ++k) got_t[r * ld + k] = t[r * ld + k];
  }
  ExpectClose(got_t, t, 1e-5, "hc tanh");
  ExpectClose(gcoef.Download(), coef, 1e-5, "hc coef");
  ExpectClose(gu.Download(), u, Tol<T>(true), "hc width u");
  ExpectClose(ghout.Download(), hout, Tol<T>(true), "hc depth H'");
  ExpectClose(gdy.Download(), dy, Tol<T>(true), "hc dy");
  ExpectClose(gdh.Download(), dh, Tol<T>(true), "hc dH");
  ExpectClose(gdcoef.Download(), dcoef, Tol<T>(false), "hc dcoef");
  ExpectClose(gdproj.Download(), dproj, Tol<T>(true), "hc dproj");
  ExpectClose(gscales.Download(), scales, Tol<T>(false), "hc scale sums");
  ExpectClose(gsum.Download(), dstatic_alpha, Tol<T>(false), "hc static_alpha sums");
  EXPECT_EQ(cuda::HyperWidthForward(gu.get(), gh.get(), co, rows, cuda::kMaxHyperStreams + 1, c,
                                    nullptr),
            cudaErrorInvalidValue);
}

#endif  // SATDAR_WITH_CUDA

TEST(ResidualMixingCuda, HcF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckHc<float>());
}
TEST(ResidualMixingCuda, HcBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckHc<Bf16>());
}

}  // namespace
}  // namespace satdar::model
