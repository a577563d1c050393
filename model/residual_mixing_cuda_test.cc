// The CUDA kernels of the HC / mHC residuals (hyper_cuda.h) against host loops transcribed
// from the CPU models (hyper_connections.cc, mhc.cc), forward and backward, in f32 and bf16.
// Skips without a CUDA build or a GPU. (MUDDFormer's dense connection: muddformer_ops_test.)
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

// mHC: the RMS of vec(H), coefficients, their backward and the RMS path (Mhc::Coefficients,
// CoefficientsBackward and the draw_ loop of Mhc::Backward).
template <typename T>
void CheckMhc() {
  const int rows = 11, n = 4, c = 24, nc = n * c, mixes = n * (n + 2), ld = 24;
  const float eps = 1e-6f;
  const auto h = Quantize<T>(RandomNormal(Sz(rows, nc), 11));
  const auto raw = RandomNormal(Sz(rows, ld), 12);
  const auto base = RandomNormal(mixes, 13);
  const std::vector<float> scale = {0.7f, -0.4f, 1.3f};
  const auto dcoef = RandomNormal(Sz(rows, mixes), 14);
  const auto dlogits = RandomNormal(Sz(rows, n * n), 15);
  const auto dh0 = Quantize<T>(RandomNormal(h.size(), 16));
  auto sig = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  std::vector<float> rms(rows), coef(Sz(rows, 2 * n)), logits(Sz(rows, n * n)), dz(Sz(rows, mixes)),
      scales(Sz(rows, 3), 0.0f), draw(Sz(rows, ld), 0.0f), rowcoef(rows), dh = dh0;
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int e = 0; e < nc; ++e) ss += double(h[r * nc + e]) * h[r * nc + e];
    const float s = 1.0f / std::sqrt(static_cast<float>(ss / nc) + eps);
    rms[r] = s;
    const float* x = raw.data() + r * ld;
    for (int j = 0; j < n; ++j) {
      coef[r * 2 * n + j] = sig(scale[0] * x[j] * s + base[j]);
      coef[r * 2 * n + n + j] = 2 * sig(scale[1] * x[n + j] * s + base[n + j]);
    }
    for (int k = 0; k < n * n; ++k) logits[r * n * n + k] = scale[2] * x[2 * n + k] * s + base[2 * n + k];
    float* z = dz.data() + r * mixes;
    for (int j = 0; j < n; ++j) {
      const float pre = coef[r * 2 * n + j], post = coef[r * 2 * n + n + j];
      z[j] = dcoef[r * mixes + j] * pre * (1 - pre);
      z[n + j] = dcoef[r * mixes + n + j] * post * (1 - post / 2);
    }
    for (int k = 0; k < n * n; ++k) z[2 * n + k] = dlogits[r * n * n + k];
    double drms = 0;
    for (int k = 0; k < mixes; ++k) {
      const int grp = k < n ? 0 : (k < 2 * n ? 1 : 2);
      scales[r * 3 + grp] += z[k] * x[k] * s;
      drms += double(z[k]) * scale[grp] * x[k];
      draw[r * ld + k] = z[k] * scale[grp] * s;
    }
    rowcoef[r] = static_cast<float>(-drms * s * s * s / nc);
    for (int e = 0; e < nc; ++e) dh[r * nc + e] += rowcoef[r] * h[r * nc + e];
  }
  DeviceArray<T> gh(h), gdraw(draw.size()), gdh(dh0);
  DeviceArray<float> graw(raw), gbase(base), gscale(scale), gdcoef(dcoef), gdlogits(dlogits),
      grms(rows), gcoef(coef.size()), glogits(logits.size()), gdz(dz.size()),
      gscales(scales.size()), growcoef(rows);
  ASSERT_EQ(cuda::MhcRms(grms.f32(), gh.get(), rows, nc, eps, nullptr), cudaSuccess);
  ASSERT_EQ(cuda::MhcCoefForward(gcoef.f32(), glogits.f32(), graw.f32(), ld, grms.f32(),
                                 gscale.f32(), gbase.f32(), rows, n, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::MhcCoefBackward(gdraw.get(), gdz.f32(), gscales.f32(), growcoef.f32(),
                                  gdcoef.f32(), gdlogits.f32(), gcoef.f32(), graw.f32(), ld,
                                  grms.f32(), gscale.f32(), rows, n, nc, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::RowScaleAdd(gdh.get(), growcoef.f32(), gh.get(), rows, nc, nullptr), cudaSuccess);
  ExpectClose(grms.Download(), rms, 1e-5, "mhc rms");
  ExpectClose(gcoef.Download(), coef, 1e-5, "mhc pre/post");
  ExpectClose(glogits.Download(), logits, 1e-5, "mhc logits");
  ExpectClose(gdz.Download(), dz, 1e-5, "mhc dz");
  ExpectClose(gscales.Download(), scales, 1e-5, "mhc scale sums");
  ExpectClose(gdraw.Download(), draw, Tol<T>(true), "mhc draw");
  ExpectClose(growcoef.Download(), rowcoef, 1e-5, "mhc rms path");
  ExpectClose(gdh.Download(), dh, Tol<T>(true), "mhc dH");
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
TEST(ResidualMixingCuda, MhcF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckMhc<float>());
}
TEST(ResidualMixingCuda, MhcBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckMhc<Bf16>());
}

}  // namespace
}  // namespace satdar::model
