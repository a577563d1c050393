// mHC's coefficient ops (hyper_ops.h): the CPU side by f64 central differences (the Sinkhorn's
// logits; H, raw, scale and base through the RMS, the sigmoids and the Sinkhorn, with padding
// columns in raw), and the CUDA side against the CPU side, f32 and bf16 (tag gpu: skipped
// without a GPU), on the inputs the mHC case of residual_mixing_cuda_test and the Sinkhorn case
// of layers_cuda_test used.
//
// Tolerances (gpu_test_util's ExpectClose: |gpu - cpu| <= rtol * max(|cpu|, rms(cpu))):
//   f32: 1e-5 everywhere (fp32 on both sides; only the order of additions and the GPU's fused
//   multiply-adds differ). For the Sinkhorn backward (39 chained normalisation backwards, each
//   subtracting a dot product) the f32 loops differ from the same loops in double by at most
//   9e-7 on these inputs (measured for layers_cuda_test), so 1e-5 leaves a 10x margin.
//   bf16: the CPU runs in f32 on the same bf16-rounded H. Outputs stored in bf16 (draw, dH) get
//   1e-2 (one bf16 rounding is <= 2^-9 relative, plus fp32 sums); the fp32 outputs computed
//   from fp32 inputs per token (rms, coefficients, logits, dz, Sinkhorn) keep 1e-5, and the
//   parameters' gradients (sums over tokens, CPU in double) get 1e-4.
#include "model/variants/hyper_ops.h"

#include <cstdint>
#include <vector>

#include "core/cuda/testing/gpu_test_util.h"
#include "core/ops/gradcheck_testutil.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"
#include "model/variants/hyper_cuda.h"  // kMaxHyperStreams

namespace satdar::model {
namespace {

using core::testing::Dot;
using core::testing::GradError;
using core::testing::RandomVector;
using Vec = std::vector<double>;

size_t Sz(int a, int b) { return static_cast<size_t>(a) * b; }

// loss = <w, M_last>; iterations 3 (5 normalisations) and mHC's 20.
TEST(HyperOps, SinkhornGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int rows = 3, n = 3;
  for (int iterations : {3, kMhcSinkhornIterations}) {
    const int nsteps = 2 * iterations, nn = n * n;
    Vec logits = RandomVector(Sz(rows, nn), 1, 2.0);
    const Vec w = RandomVector(Sz(rows, nn), 2);
    Vec steps(Sz(rows, nsteps * nn)), last(Sz(rows, nn));
    auto loss = [&] {
      cpu::SinkhornForward(steps.data(), logits.data(), rows, n, iterations, &pool);
      for (int r = 0; r < rows; ++r) {
        for (int k = 0; k < nn; ++k) last[r * nn + k] = steps[(r * nsteps + nsteps - 1) * nn + k];
      }
      return Dot(w, last);
    };
    loss();
    Vec dlogits(logits.size(), 7.0);  // overwritten
    cpu::SinkhornBackward(dlogits.data(), w.data(), steps.data(), rows, n, iterations, &pool);
    EXPECT_LT(GradError(&logits, dlogits, loss), 1e-7) << "iterations " << iterations;
    // Every iterate's rows (even steps) or columns (odd steps) sum to 1.
    for (int k = 0; k < n; ++k) {
      double col = 0;
      for (int j = 0; j < n; ++j) col += steps[(nsteps - 1) * nn + j * n + k];
      EXPECT_NEAR(col, 1.0, 1e-12);
    }
  }
}

// loss = <wc, [pre | post]> + <wf, M_last> over h (through the RMS only: raw is an input here,
// the caller's GEMM), raw (two padding columns: gradient 0), scale and base; the parameters'
// gradients accumulate into nonzero values; draw aliasing dcoef (ld == mixes, as mhc.cc calls
// it) equals the out-of-place result exactly.
TEST(HyperOps, MhcCoefGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int rows = 4, n = 3, c = 5, nc = n * c, mixes = n * (n + 2), ld = mixes + 2, nn = n * n;
  const int iterations = 4, nsteps = 2 * iterations;
  const double eps = 1e-6;
  Vec h = RandomVector(Sz(rows, nc), 3);
  Vec raw = RandomVector(Sz(rows, ld), 4, 2.0);
  Vec scale = {0.7, -0.4, 1.3};
  Vec base = RandomVector(mixes, 5);
  const Vec wc = RandomVector(Sz(rows, 2 * n), 6), wf = RandomVector(Sz(rows, nn), 7);
  Vec rms(rows), coef(Sz(rows, 2 * n)), logits(Sz(rows, nn)), steps(Sz(rows, nsteps * nn)),
      last(Sz(rows, nn));
  auto forward = [&] {
    cpu::MhcRms(rms.data(), h.data(), rows, nc, eps, &pool);
    cpu::MhcCoefForward(coef.data(), logits.data(), raw.data(), ld, rms.data(), scale.data(),
                        base.data(), rows, n, &pool);
    cpu::SinkhornForward(steps.data(), logits.data(), rows, n, iterations, &pool);
  };
  auto loss = [&] {
    forward();
    for (int r = 0; r < rows; ++r) {
      for (int k = 0; k < nn; ++k) last[r * nn + k] = steps[(r * nsteps + nsteps - 1) * nn + k];
    }
    return Dot(wc, coef) + Dot(wf, last);
  };
  forward();
  Vec dcoef(Sz(rows, mixes), 9.0);  // [dpre | dpost | ignored]
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < 2 * n; ++j) dcoef[r * mixes + j] = wc[r * 2 * n + j];
  }
  Vec dlogits(Sz(rows, nn)), dz(Sz(rows, mixes)), draw(Sz(rows, ld), 5.0), dh(h.size(), 0.0);
  const Vec gscale0 = {0.1, -0.2, 0.3}, gbase0 = RandomVector(mixes, 8, 0.1);
  Vec gscale = gscale0, gbase = gbase0;
  cpu::SinkhornBackward(dlogits.data(), wf.data(), steps.data(), rows, n, iterations, &pool);
  cpu::MhcCoefBackward(draw.data(), dz.data(), gscale.data(), gbase.data(), dh.data(),
                       dcoef.data(), dlogits.data(), coef.data(), raw.data(), ld, rms.data(),
                       scale.data(), h.data(), rows, n, nc, &pool);
  for (int k = 0; k < 3; ++k) gscale[k] -= gscale0[k];
  for (int k = 0; k < mixes; ++k) gbase[k] -= gbase0[k];
  EXPECT_LT(GradError(&h, dh, loss), 1e-7);
  EXPECT_LT(GradError(&raw, draw, loss), 1e-7);
  EXPECT_LT(GradError(&scale, gscale, loss), 1e-7);
  EXPECT_LT(GradError(&base, gbase, loss), 1e-7);
  // dz is the gradient of the mix logits: base's gradient per token.
  for (int k = 0; k < mixes; ++k) {
    double sum = 0;
    for (int r = 0; r < rows; ++r) sum += dz[r * mixes + k];
    EXPECT_NEAR(sum, gbase[k], 1e-12);
  }
  // In place (ld == mixes): draw is dcoef's buffer.
  Vec raw_m(Sz(rows, mixes));
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < mixes; ++k) raw_m[r * mixes + k] = raw[r * ld + k];
  }
  forward();
  Vec in_place = dcoef, out(Sz(rows, mixes)), gs1(3), gb1(mixes), gs2(3), gb2(mixes),
      dh1(h.size()), dh2(h.size());
  cpu::MhcCoefBackward(out.data(), dz.data(), gs1.data(), gb1.data(), dh1.data(), dcoef.data(),
                       dlogits.data(), coef.data(), raw_m.data(), mixes, rms.data(),
                       scale.data(), h.data(), rows, n, nc, &pool);
  cpu::MhcCoefBackward(in_place.data(), dz.data(), gs2.data(), gb2.data(), dh2.data(),
                       in_place.data(), dlogits.data(), coef.data(), raw_m.data(), mixes,
                       rms.data(), scale.data(), h.data(), rows, n, nc, &pool);
  EXPECT_EQ(in_place, out);
  EXPECT_EQ(gs1, gs2);
  EXPECT_EQ(gb1, gb2);
  EXPECT_EQ(dh1, dh2);
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceArray;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

// The Sinkhorn (fp32 on both devices; the inputs of layers_cuda_test's case).
void CheckSinkhorn() {
  const int rows = 37, n = 4, iterations = kMhcSinkhornIterations, nsteps = 2 * iterations;
  core::ThreadPool pool(2);
  auto logits = RandomNormal(Sz(rows, n * n), 71, 2.0f);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) logits[(static_cast<size_t>(r) * n + j) * n + j] += 4.0f;
  }
  const auto dfinal = RandomNormal(logits.size(), 72);
  std::vector<float> steps(Sz(rows, nsteps * n * n)), dlogits(logits.size());
  cpu::SinkhornForward(steps.data(), logits.data(), rows, n, iterations, &pool);
  cpu::SinkhornBackward(dlogits.data(), dfinal.data(), steps.data(), rows, n, iterations, &pool);
  DeviceArray<float> glogits(logits), gdfinal(dfinal), gsteps(steps.size()), gdz(logits.size());
  ASSERT_TRUE(
      cuda::SinkhornForward(gsteps.get(), glogits.get(), rows, n, iterations, nullptr).ok());
  ASSERT_TRUE(cuda::SinkhornBackward(gdz.get(), gdfinal.get(), gsteps.get(), rows, n, iterations,
                                     nullptr)
                  .ok());
  ExpectClose(gsteps.Download(), steps, 1e-5, "sinkhorn matrices");
  ExpectClose(gdz.Download(), dlogits, 1e-5, "sinkhorn dlogits");
  // More streams than the kernels hold: refused before launching.
  EXPECT_TRUE(absl::IsInvalidArgument(cuda::SinkhornForward(
      gsteps.get(), glogits.get(), 1, cuda::kMaxHyperStreams + 1, iterations, nullptr)));
}

// The RMS of vec(H), the coefficients, their backward and the rms path (the inputs of
// residual_mixing_cuda_test's mHC case), accumulating into nonzero dH and parameter gradients.
template <typename T>
void CheckCudaAgainstCpu() {
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, sums = kIsBf16<T> ? 1e-4 : 1e-5;
  const int rows = 11, n = 4, c = 24, nc = n * c, mixes = n * (n + 2), ld = 24;
  const float eps = 1e-6f;
  core::ThreadPool pool(2);
  const auto h = Quantize<T>(RandomNormal(Sz(rows, nc), 11));
  const auto raw = RandomNormal(Sz(rows, ld), 12);
  const auto base = RandomNormal(mixes, 13);
  const std::vector<float> scale = {0.7f, -0.4f, 1.3f};
  const auto dcoef = RandomNormal(Sz(rows, mixes), 14);
  const auto dlogits = RandomNormal(Sz(rows, n * n), 15);
  const auto dh0 = Quantize<T>(RandomNormal(h.size(), 16));
  const auto gscale0 = RandomNormal(3, 17, 0.1f), gbase0 = RandomNormal(mixes, 18, 0.1f);
  // CPU.
  std::vector<float> rms(rows), coef(Sz(rows, 2 * n)), logits(Sz(rows, n * n)),
      dz(Sz(rows, mixes)), draw(Sz(rows, ld)), dh = dh0, gscale = gscale0, gbase = gbase0;
  cpu::MhcRms(rms.data(), h.data(), rows, nc, eps, &pool);
  cpu::MhcCoefForward(coef.data(), logits.data(), raw.data(), ld, rms.data(), scale.data(),
                      base.data(), rows, n, &pool);
  cpu::MhcCoefBackward(draw.data(), dz.data(), gscale.data(), gbase.data(), dh.data(),
                       dcoef.data(), dlogits.data(), coef.data(), raw.data(), ld, rms.data(),
                       scale.data(), h.data(), rows, n, nc, &pool);
  // GPU.
  DeviceArray<T> gh(h), gdraw(draw.size()), gdh(dh0);
  DeviceArray<float> graw(raw), gbase_p(base), gscale_p(scale), gdcoef(dcoef),
      gdlogits(dlogits), grms(rows), gcoef(coef.size()), glogits(logits.size()), gdz(dz.size()),
      gwork(Sz(rows, 4)), ggscale(gscale0), ggbase(gbase0);
  ASSERT_TRUE(cuda::MhcRms(grms.f32(), gh.get(), rows, nc, eps, nullptr).ok());
  ASSERT_TRUE(cuda::MhcCoefForward(gcoef.f32(), glogits.f32(), graw.f32(), ld, grms.f32(),
                                   gscale_p.f32(), gbase_p.f32(), rows, n, nullptr)
                  .ok());
  ASSERT_TRUE(cuda::MhcCoefBackward(gdraw.get(), gdz.f32(), gwork.f32(), ggscale.f32(),
                                    ggbase.f32(), gdh.get(), gdcoef.f32(), gdlogits.f32(),
                                    gcoef.f32(), graw.f32(), ld, grms.f32(), gscale_p.f32(),
                                    gh.get(), rows, n, nc, nullptr)
                  .ok());
  ExpectClose(grms.Download(), rms, 1e-5, "mhc rms");
  ExpectClose(gcoef.Download(), coef, 1e-5, "mhc pre/post");
  ExpectClose(glogits.Download(), logits, 1e-5, "mhc logits");
  ExpectClose(gdz.Download(), dz, 1e-5, "mhc dz");
  ExpectClose(gdraw.Download(), draw, stored, "mhc draw");
  ExpectClose(gdh.Download(), dh, stored, "mhc dH");
  ExpectClose(ggscale.Download(), gscale, sums, "mhc grad scale");
  ExpectClose(ggbase.Download(), gbase, sums, "mhc grad base");
  // ld narrower than the mixes: refused before launching.
  EXPECT_TRUE(absl::IsInvalidArgument(cuda::MhcCoefForward(
      gcoef.f32(), glogits.f32(), graw.f32(), mixes - 1, grms.f32(), gscale_p.f32(),
      gbase_p.f32(), rows, n, nullptr)));
  if (!kIsBf16<T>) CheckSinkhorn();  // fp32 only
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(HyperOps, CheckCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
