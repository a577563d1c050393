// HC's and mHC's ops (hyper_ops.h): the CPU side by f64 central differences (the stream entry
// and exit; the width and depth connections in HC's and mHC's coefficient layouts; HC's
// coefficients on both the GPU's one-buffer and the CPU model's two-buffer projection layouts;
// the Sinkhorn's logits; H, raw, scale and base through the RMS, the sigmoids and the
// Sinkhorn, with padding columns in raw; a pipeline boundary's join / split exactly against
// hand loops), and the CUDA side against the CPU side, f32 and bf16
// (tag gpu: skipped without a GPU), on the inputs the former residual_mixing_cuda_test and the
// Sinkhorn case of layers_cuda_test used.
//
// Tolerances (gpu_test_util's ExpectClose: |gpu - cpu| <= rtol * max(|cpu|, rms(cpu))):
//   f32: 1e-5 everywhere (fp32 on both sides; only the order of additions and the GPU's fused
//   multiply-adds differ). For the Sinkhorn backward (39 chained normalisation backwards, each
//   subtracting a dot product) the f32 loops differ from the same loops in double by at most
//   9e-7 on these inputs (measured for layers_cuda_test), so 1e-5 leaves a 10x margin.
//   bf16: the CPU runs in f32 on the same bf16-rounded H. Outputs stored in bf16 (draw, dH) get
//   1e-2 (one bf16 rounding is <= 2^-9 relative, plus fp32 sums); the fp32 outputs computed
//   from fp32 inputs per token (rms, coefficients, logits, dz, Sinkhorn) keep 1e-5, and the
//   parameters' gradients (sums over tokens, CPU in double) get 1e-4. The stream mixing: the
//   outputs stored in T (u, H out, dy, dH, the exit's sum) 1e-2, its fp32 dot products (the
//   coefficients' gradients, from the same bf16-rounded operands on both sides) 1e-4; the entry
//   is a copy (0), and so are the boundary's join and split (equal). HC's coefficients: tanh
//   and coef 1e-5 (fp32 from fp32 on both sides), dproj (stored in T) 1e-2, the four
//   parameters' gradients (sums over tokens) 1e-4.
#include "model/variants/hyper_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/testing/gpu_test_util.h"
#include "core/ops/gradcheck_testutil.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"
#include "model/variants/ops_test_exec.h"

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

// Entry and exit are each other's adjoints: loss = <w, Broadcast(x)> has gradient Sum(w), and
// loss = <v, Sum(H)> has gradient Broadcast(v).
TEST(HyperOps, StreamsGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int rows = 3, n = 3, c = 4;
  Vec x = RandomVector(Sz(rows, c), 21), h = RandomVector(Sz(rows * n, c), 22);
  const Vec w = RandomVector(Sz(rows * n, c), 23), v = RandomVector(Sz(rows, c), 24);
  Vec hx(w.size()), sx(v.size());
  auto loss_in = [&] {
    cpu::StreamsBroadcast(hx.data(), x.data(), rows, n, c, &pool);
    return Dot(w, hx);
  };
  auto loss_out = [&] {
    cpu::StreamsSum(sx.data(), h.data(), rows, n, c, &pool);
    return Dot(v, sx);
  };
  Vec dx(x.size(), 7.0), dh(h.size(), 7.0);  // overwritten
  cpu::StreamsSum(dx.data(), w.data(), rows, n, c, &pool);
  cpu::StreamsBroadcast(dh.data(), v.data(), rows, n, c, &pool);
  EXPECT_LT(GradError(&x, dx, loss_in), 1e-7);
  EXPECT_LT(GradError(&h, dh, loss_out), 1e-7);
}

// The row-parallel ops split their rows across the pool's workers (at least 16 rows each):
// on 70 rows, one worker and four give the same bits, f32 (each row's arithmetic is its own).
TEST(HyperOps, OneWorkerAndFourGiveTheSameBits) {
  const int rows = 70, n = 4, c = 24, cols = n * (n + 2);
  auto random = [](size_t size, uint64_t seed) {
    const Vec v = RandomVector(size, seed);
    return std::vector<float>(v.begin(), v.end());
  };
  const std::vector<float> h = random(Sz(rows * n, c), 41), y = random(Sz(rows, c), 42);
  const std::vector<float> g = random(Sz(rows * n, c), 43), du = random(Sz(rows, c), 44);
  std::vector<float> coef = random(Sz(rows, cols), 45);
  const HyperCoefs<float> k = HcCoefs(coef.data(), n);
  auto run = [&](int workers) {
    core::ThreadPool pool(workers);
    std::vector<float> out(Sz(rows, c) * (3 + 3 * n) + Sz(rows, cols) + 2 * Sz(rows, 1 + 2 * n));
    float* u = out.data();
    float* hout = u + Sz(rows, c);
    float* dy = hout + Sz(rows * n, c);
    float* dh = dy + Sz(rows, c);
    float* bcast = dh + Sz(rows * n, c);
    float* sum = bcast + Sz(rows * n, c);
    float* dcoef = sum + Sz(rows, c);
    float* rms = dcoef + Sz(rows, cols);
    const HyperCoefs<float> dk = HcCoefs(dcoef, n);
    cpu::HyperWidthForward(u, h.data(), k, rows, n, c, &pool);
    cpu::HyperDepthForward(hout, h.data(), y.data(), k, rows, n, c, &pool);
    cpu::HyperDepthBackward(dy, dh, dk, g.data(), y.data(), h.data(), k, rows, n, c, &pool);
    cpu::HyperWidthBackward(dh, dk, du.data(), h.data(), k, rows, n, c, &pool);
    cpu::StreamsBroadcast(bcast, y.data(), rows, n, c, &pool);
    cpu::StreamsSum(sum, h.data(), rows, n, c, &pool);
    cpu::MhcRms(rms, h.data(), rows, n * c, 1e-6, &pool);
    return out;
  };
  const std::vector<float> one = run(1), four = run(4);
  ASSERT_EQ(one.size(), four.size());
  EXPECT_EQ(std::memcmp(one.data(), four.data(), one.size() * sizeof(float)), 0);
}

// A pipeline boundary's join and split (pure copies) against hand loops, every element, on
// 37 rows over two workers; the split of the join gives the parts back.
TEST(HyperOps, JoinAndSplitStreamsCopyEveryElement) {
  const int rows = 37, n = 3, c = 10;
  core::ThreadPool pool(2);
  const core::CpuExec x{&pool};
  std::vector<std::vector<float>> parts;
  std::vector<const float*> in;
  for (int j = 0; j < n; ++j) {
    const Vec v = RandomVector(Sz(rows, c), 61 + j);
    parts.emplace_back(v.begin(), v.end());
    in.push_back(parts.back().data());
  }
  std::vector<float> hyper(Sz(rows * n, c), -1.0f), expect(hyper.size());
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      for (int e = 0; e < c; ++e) expect[Sz(r * n + j, c) + e] = parts[j][Sz(r, c) + e];
    }
  }
  ASSERT_TRUE(ops::JoinStreams(x, hyper.data(), in.data(), rows, n, c).ok());
  for (size_t i = 0; i < hyper.size(); ++i) ASSERT_EQ(hyper[i], expect[i]) << i;
  // Split a different state, so that nothing is left over from the parts.
  const Vec hv = RandomVector(hyper.size(), 64);
  const std::vector<float> h(hv.begin(), hv.end());
  std::vector<std::vector<float>> outs(n, std::vector<float>(Sz(rows, c), -1.0f));
  std::vector<float*> out;
  for (int j = 0; j < n; ++j) out.push_back(outs[j].data());
  ASSERT_TRUE(ops::SplitStreams(x, out.data(), h.data(), rows, n, c).ok());
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      for (int e = 0; e < c; ++e) {
        ASSERT_EQ(outs[j][Sz(r, c) + e], h[Sz(r * n + j, c) + e]) << r << " " << j << " " << e;
      }
    }
  }
  // Round trip: split(join(parts)) == parts.
  ASSERT_TRUE(ops::SplitStreams(x, out.data(), hyper.data(), rows, n, c).ok());
  for (int j = 0; j < n; ++j) EXPECT_EQ(outs[j], parts[j]) << j;
}

// The width and depth connections: loss = <wu, u> + <wo, H_out> over H, y and the
// coefficients, in HC's layout (HcCoefs: pre and res interleaved) and in mHC's (pre, post in
// one buffer, res in another with a token stride larger than n*n). dH starts nonzero (the depth
// backward overwrites it) and the width backward adds to it.
TEST(HyperOps, MixingGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int rows = 3, n = 3, c = 5, cols = n * (n + 2), res_token = n * n + 2;
  for (bool hc : {true, false}) {
    Vec h = RandomVector(Sz(rows * n, c), 31), y = RandomVector(Sz(rows, c), 32);
    // HC: coef (N, n(n+2)); mHC: coef (N, 2n) [pre | post] and res (N, res_token).
    Vec coef = RandomVector(Sz(rows, hc ? cols : 2 * n), 33);
    Vec res = RandomVector(Sz(rows, res_token), 34);
    const Vec wu = RandomVector(Sz(rows, c), 35), wo = RandomVector(Sz(rows * n, c), 36);
    auto layout = [&](double* cf, double* rs) {
      if (hc) return HcCoefs(cf, n);
      HyperCoefs<double> k;
      k.pre = cf;
      k.pre_token = 2 * n;
      k.post = cf + n;
      k.post_token = 2 * n;
      k.res = rs;
      k.res_token = res_token;
      k.res_row = n;
      return k;
    };
    Vec u(wu.size()), hout(wo.size());
    auto loss = [&] {
      const HyperCoefs<double> k = layout(coef.data(), res.data());
      cpu::HyperWidthForward(u.data(), h.data(), k, rows, n, c, &pool);
      cpu::HyperDepthForward(hout.data(), h.data(), y.data(), k, rows, n, c, &pool);
      return Dot(wu, u) + Dot(wo, hout);
    };
    loss();
    Vec dh(h.size(), 5.0), dy(y.size(), 5.0), dcoef(coef.size(), 0.0), dres(res.size(), 0.0);
    const HyperCoefs<double> k = layout(coef.data(), res.data()),
                             dk = layout(dcoef.data(), dres.data());
    cpu::HyperDepthBackward(dy.data(), dh.data(), dk, wo.data(), y.data(), h.data(), k, rows, n,
                            c, &pool);
    cpu::HyperWidthBackward(dh.data(), dk, wu.data(), h.data(), k, rows, n, c, &pool);
    EXPECT_LT(GradError(&h, dh, loss), 1e-7) << (hc ? "HC" : "mHC");
    EXPECT_LT(GradError(&y, dy, loss), 1e-7) << (hc ? "HC" : "mHC");
    EXPECT_LT(GradError(&coef, dcoef, loss), 1e-7) << (hc ? "HC" : "mHC");
    // mHC: the padding entries of each token's res row stay untouched (gradient 0).
    if (!hc) {
      EXPECT_LT(GradError(&res, dres, loss), 1e-7);
    }
  }
}

// HC's coefficients: loss = <w, coef> over the projections (before the tanh), the static
// parts and the scales, with the GPU's layout (one buffer, ld = n + 4: ta's n+1 columns, tb's
// one, two padding columns whose gradient stays 0) and the CPU model's (two buffers, lda =
// n + 1, ldb = 1), which give the same results exactly. The gradients accumulate into nonzero
// values.
TEST(HyperOps, HcCoefGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int rows = 4, n = 3, ld = n + 4, cols = n * (n + 2);
  Vec proj = RandomVector(Sz(rows * n, ld), 41, 0.8);
  Vec sa = RandomVector(Sz(n, n + 1), 42), sb = RandomVector(n, 43);
  Vec alpha_scale = {0.7}, beta_scale = {-0.6};
  const Vec w = RandomVector(Sz(rows, cols), 44);
  Vec t(proj.size()), coef(Sz(rows, cols));
  auto loss = [&] {
    t = proj;  // replaced by its tanh
    cpu::HcCoefForward(coef.data(), t.data(), ld, t.data() + n + 1, ld, sa.data(), sb.data(),
                       alpha_scale.data(), beta_scale.data(), rows, n, &pool);
    return Dot(w, coef);
  };
  loss();
  Vec dproj(proj.size(), 0.0);
  const Vec gsa0 = RandomVector(sa.size(), 45, 0.1), gsb0 = RandomVector(n, 46, 0.1);
  Vec gsa = gsa0, gsb = gsb0, gas = {0.25}, gbs = {-0.5};
  cpu::HcCoefBackward(dproj.data(), dproj.data() + n + 1, gsa.data(), gsb.data(), gas.data(),
                      gbs.data(), w.data(), t.data(), ld, t.data() + n + 1, ld,
                      alpha_scale.data(), beta_scale.data(), rows, n, &pool);
  for (size_t i = 0; i < gsa.size(); ++i) gsa[i] -= gsa0[i];
  for (int j = 0; j < n; ++j) gsb[j] -= gsb0[j];
  gas[0] -= 0.25;
  gbs[0] += 0.5;
  EXPECT_LT(GradError(&proj, dproj, loss), 1e-7);
  EXPECT_LT(GradError(&sa, gsa, loss), 1e-7);
  EXPECT_LT(GradError(&sb, gsb, loss), 1e-7);
  EXPECT_LT(GradError(&alpha_scale, gas, loss), 1e-7);
  EXPECT_LT(GradError(&beta_scale, gbs, loss), 1e-7);
  // The CPU model's layout: ta (N*n, n+1) and tb (N*n, 1) apart.
  Vec ta(Sz(rows * n, n + 1)), tb(Sz(rows, n)), coef2(coef.size());
  for (int i = 0; i < rows * n; ++i) {
    for (int k = 0; k <= n; ++k) ta[Sz(i, n + 1) + k] = proj[Sz(i, ld) + k];
    tb[i] = proj[Sz(i, ld) + n + 1];
  }
  loss();
  cpu::HcCoefForward(coef2.data(), ta.data(), n + 1, tb.data(), 1, sa.data(), sb.data(),
                     alpha_scale.data(), beta_scale.data(), rows, n, &pool);
  EXPECT_EQ(coef2, coef);
  Vec dta(ta.size()), dtb(tb.size()), g1(sa.size()), g2(n), g3(1), g4(1);
  Vec h1(sa.size()), h2(n), h3(1), h4(1);
  cpu::HcCoefBackward(dta.data(), dtb.data(), g1.data(), g2.data(), g3.data(), g4.data(),
                      w.data(), ta.data(), n + 1, tb.data(), 1, alpha_scale.data(),
                      beta_scale.data(), rows, n, &pool);
  std::fill(dproj.begin(), dproj.end(), 0.0);
  cpu::HcCoefBackward(dproj.data(), dproj.data() + n + 1, h1.data(), h2.data(), h3.data(),
                      h4.data(), w.data(), t.data(), ld, t.data() + n + 1, ld,
                      alpha_scale.data(), beta_scale.data(), rows, n, &pool);
  for (int i = 0; i < rows * n; ++i) {
    for (int k = 0; k <= n; ++k) EXPECT_EQ(dta[Sz(i, n + 1) + k], dproj[Sz(i, ld) + k]);
    EXPECT_EQ(dtb[i], dproj[Sz(i, ld) + n + 1]);
  }
  EXPECT_EQ(g1, h1);
  EXPECT_EQ(g2, h2);
  EXPECT_EQ(g3, h3);
  EXPECT_EQ(g4, h4);
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceArray;
using core::gpu_test::DeviceVector;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

// The Sinkhorn (fp32 on both devices; the inputs of layers_cuda_test's case).
void CheckSinkhorn() {
  const int rows = 37, n = 4, iterations = kMhcSinkhornIterations, nsteps = 2 * iterations;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  auto logits = RandomNormal(Sz(rows, n * n), 71, 2.0f);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) logits[(static_cast<size_t>(r) * n + j) * n + j] += 4.0f;
  }
  const auto dfinal = RandomNormal(logits.size(), 72);
  std::vector<float> steps(Sz(rows, nsteps * n * n)), dlogits(logits.size());
  EXPECT_TRUE(ops::SinkhornForward(ex.cpu, steps.data(), logits.data(), rows, n, iterations).ok());
  EXPECT_TRUE(ops::SinkhornBackward(ex.cpu, dlogits.data(), dfinal.data(), steps.data(), rows, n,
                                    iterations)
                  .ok());
  DeviceArray<float> glogits(logits), gdfinal(dfinal), gsteps(steps.size()), gdz(logits.size());
  ASSERT_TRUE(ops::SinkhornForward(ex.gpu, gsteps.get(), glogits.get(), rows, n, iterations).ok());
  ASSERT_TRUE(
      ops::SinkhornBackward(ex.gpu, gdz.get(), gdfinal.get(), gsteps.get(), rows, n, iterations)
          .ok());
  ExpectClose(gsteps.Download(), steps, 1e-5, "sinkhorn matrices");
  ExpectClose(gdz.Download(), dlogits, 1e-5, "sinkhorn dlogits");
  // More streams than the kernels hold: refused before launching.
  EXPECT_TRUE(absl::IsInvalidArgument(ops::SinkhornForward(
      ex.gpu, gsteps.get(), glogits.get(), 1, cuda::kMaxHyperStreams + 1, iterations)));
}

// The RMS of vec(H), the coefficients, their backward and the rms path (the inputs of the
// former residual_mixing_cuda_test's mHC case), accumulating into nonzero dH and parameter
// gradients.
template <typename T>
void CheckCudaAgainstCpu() {
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, sums = kIsBf16<T> ? 1e-4 : 1e-5;
  const int rows = 11, n = 4, c = 24, nc = n * c, mixes = n * (n + 2), ld = 24;
  const float eps = 1e-6f;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
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
  EXPECT_TRUE(ops::MhcRms(ex.cpu, rms.data(), h.data(), rows, nc, eps).ok());
  EXPECT_TRUE(ops::MhcCoefForward(ex.cpu, coef.data(), logits.data(), raw.data(), ld, rms.data(),
                                  scale.data(), base.data(), rows, n)
                  .ok());
  EXPECT_TRUE(ops::MhcCoefBackward(ex.cpu, draw.data(), dz.data(), gscale.data(), gbase.data(),
                                   dh.data(), dcoef.data(), dlogits.data(), coef.data(), raw.data(),
                                   ld, rms.data(), scale.data(), h.data(), rows, n, nc)
                  .ok());
  // GPU.
  DeviceArray<T> gh(h), gdraw(draw.size()), gdh(dh0);
  DeviceArray<float> graw(raw), gbase_p(base), gscale_p(scale), gdcoef(dcoef), gdlogits(dlogits),
      grms(rows), gcoef(coef.size()), glogits(logits.size()), gdz(dz.size()), ggscale(gscale0),
      ggbase(gbase0);
  ASSERT_TRUE(ops::MhcRms(ex.gpu, grms.f32(), gh.get(), rows, nc, eps).ok());
  ASSERT_TRUE(ops::MhcCoefForward(ex.gpu, gcoef.f32(), glogits.f32(), graw.f32(), ld, grms.f32(),
                                  gscale_p.f32(), gbase_p.f32(), rows, n)
                  .ok());
  ASSERT_TRUE(ops::MhcCoefBackward(ex.gpu, gdraw.get(), gdz.f32(), ggscale.f32(), ggbase.f32(),
                                   gdh.get(), gdcoef.f32(), gdlogits.f32(), gcoef.f32(), graw.f32(),
                                   ld, grms.f32(), gscale_p.f32(), gh.get(), rows, n, nc)
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
  EXPECT_TRUE(absl::IsInvalidArgument(ops::MhcCoefForward(ex.gpu, gcoef.f32(), glogits.f32(),
                                                          graw.f32(), mixes - 1, grms.f32(),
                                                          gscale_p.f32(), gbase_p.f32(), rows, n)));
  if (!kIsBf16<T>) CheckSinkhorn();  // fp32 only
}

// The stream entry / exit and the width / depth connections, in HC's coefficient layout and in
// mHC's (res strided as the last of the Sinkhorn iterates), forward and backward, dH
// accumulating. The inputs of the former residual_mixing_cuda_test's HC case.
template <typename T>
void CheckMixingCudaAgainstCpu() {
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, dots = kIsBf16<T> ? 1e-4 : 1e-5;
  const int rows = 13, n = 3, c = 40, cols = n * (n + 2), res_token = 3 * n * n;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  const auto h = Quantize<T>(RandomNormal(Sz(rows * n, c), 1));
  const auto y = Quantize<T>(RandomNormal(Sz(rows, c), 2));
  const auto g = Quantize<T>(RandomNormal(Sz(rows * n, c), 3));
  const auto du = Quantize<T>(RandomNormal(Sz(rows, c), 4));
  const auto x0 = Quantize<T>(RandomNormal(Sz(rows, c), 5));
  // Entry and exit.
  std::vector<float> hb(h.size()), xs(x0.size());
  EXPECT_TRUE(ops::StreamsBroadcast(ex.cpu, hb.data(), x0.data(), rows, n, c).ok());
  EXPECT_TRUE(ops::StreamsSum(ex.cpu, xs.data(), h.data(), rows, n, c).ok());
  DeviceArray<T> gx0(x0), gh(h), ghb(hb.size()), gxs(xs.size());
  ASSERT_TRUE(ops::StreamsBroadcast(ex.gpu, ghb.get(), gx0.get(), rows, n, c).ok());
  ASSERT_TRUE(ops::StreamsSum(ex.gpu, gxs.get(), gh.get(), rows, n, c).ok());
  ExpectClose(ghb.Download(), hb, 0.0, "entry");  // a copy
  ExpectClose(gxs.Download(), xs, stored, "exit");
  for (bool hc : {true, false}) {
    const char* name = hc ? "HC" : "mHC";
    const auto coef = RandomNormal(Sz(rows, hc ? cols : 2 * n), 6);
    const auto res = RandomNormal(Sz(rows, res_token), 7);
    auto layout = [&](float* cf, float* rs) {
      if (hc) return HcCoefs(cf, n);
      HyperCoefs<float> k;
      k.pre = cf;
      k.pre_token = 2 * n;
      k.post = cf + n;
      k.post_token = 2 * n;
      k.res = rs + 2 * n * n;  // the last of three iterates
      k.res_token = res_token;
      k.res_row = n;
      return k;
    };
    // CPU (f32 on the same T-rounded inputs).
    std::vector<float> ccoef = coef, cres = res, u(Sz(rows, c)), hout(h.size()), dy(y.size()),
                       dh(h.size()), dcoef(coef.size(), 0.0f), dres(res.size(), 0.0f);
    const HyperCoefs<float> k = layout(ccoef.data(), cres.data()),
                            dk = layout(dcoef.data(), dres.data());
    EXPECT_TRUE(ops::HyperWidthForward(ex.cpu, u.data(), h.data(), k, rows, n, c).ok());
    EXPECT_TRUE(
        ops::HyperDepthForward(ex.cpu, hout.data(), h.data(), y.data(), k, rows, n, c).ok());
    EXPECT_TRUE(ops::HyperDepthBackward(ex.cpu, dy.data(), dh.data(), dk, g.data(), y.data(),
                                        h.data(), k, rows, n, c)
                    .ok());
    EXPECT_TRUE(
        ops::HyperWidthBackward(ex.cpu, dh.data(), dk, du.data(), h.data(), k, rows, n, c).ok());
    // GPU.
    DeviceArray<T> gy(y), gg(g), gdu(du), gu(u.size()), ghout(hout.size()), gdy(dy.size()),
        gdh(dh.size());
    DeviceArray<float> gcoef(coef), gres(res), gdcoef(dcoef), gdres(dres);
    const HyperCoefs<float> gk = layout(gcoef.f32(), gres.f32()),
                            gdk = layout(gdcoef.f32(), gdres.f32());
    ASSERT_TRUE(ops::HyperWidthForward(ex.gpu, gu.get(), gh.get(), gk, rows, n, c).ok());
    ASSERT_TRUE(
        ops::HyperDepthForward(ex.gpu, ghout.get(), gh.get(), gy.get(), gk, rows, n, c).ok());
    ASSERT_TRUE(ops::HyperDepthBackward(ex.gpu, gdy.get(), gdh.get(), gdk, gg.get(), gy.get(),
                                        gh.get(), gk, rows, n, c)
                    .ok());
    ASSERT_TRUE(
        ops::HyperWidthBackward(ex.gpu, gdh.get(), gdk, gdu.get(), gh.get(), gk, rows, n, c).ok());
    ExpectClose(gu.Download(), u, stored, std::string(name) + " u");
    ExpectClose(ghout.Download(), hout, stored, std::string(name) + " H out");
    ExpectClose(gdy.Download(), dy, stored, std::string(name) + " dy");
    ExpectClose(gdh.Download(), dh, stored, std::string(name) + " dH");
    ExpectClose(gdcoef.Download(), dcoef, dots, std::string(name) + " dcoef");
    ExpectClose(gdres.Download(), dres, dots, std::string(name) + " dres");
  }
  // More streams than the kernels hold: refused before launching.
  EXPECT_TRUE(absl::IsInvalidArgument(ops::HyperWidthForward(
      ex.gpu, ghb.get(), gh.get(), HyperCoefs<float>(), 1, cuda::kMaxHyperStreams + 1, c)));
}

// HC's coefficients and their fused backward, on the GPU's layout (one projection buffer,
// ld = 8 > n + 2), the parameters' gradients accumulating into nonzero values.
template <typename T>
void CheckHcCoefCudaAgainstCpu() {
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, sums = kIsBf16<T> ? 1e-4 : 1e-5;
  const int rows = 13, n = 3, ld = 8, cols = n * (n + 2);
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  const auto proj = RandomNormal(Sz(rows * n, ld), 51);
  const auto sa = RandomNormal(Sz(n, n + 1), 52), sb = RandomNormal(n, 53);
  const std::vector<float> alpha_scale = {0.3f}, beta_scale = {-0.2f};
  const auto dcoef = RandomNormal(Sz(rows, cols), 54);
  const auto gsa0 = RandomNormal(sa.size(), 55, 0.1f), gsb0 = RandomNormal(n, 56, 0.1f);
  const std::vector<float> gas0 = {0.05f}, gbs0 = {-0.07f};
  // CPU.
  std::vector<float> t = proj, coef(Sz(rows, cols)), dproj(proj.size(), 0.0f), gsa = gsa0,
                     gsb = gsb0, gas = gas0, gbs = gbs0;
  EXPECT_TRUE(ops::HcCoefForward(ex.cpu, coef.data(), t.data(), ld, t.data() + n + 1, ld, sa.data(),
                                 sb.data(), alpha_scale.data(), beta_scale.data(), rows, n)
                  .ok());
  EXPECT_TRUE(ops::HcCoefBackward(ex.cpu, dproj.data(), dproj.data() + n + 1, gsa.data(),
                                  gsb.data(), gas.data(), gbs.data(), dcoef.data(), t.data(), ld,
                                  t.data() + n + 1, ld, alpha_scale.data(), beta_scale.data(), rows,
                                  n)
                  .ok());
  // GPU.
  DeviceArray<float> gt(proj), gcoef(coef.size()), gsa_p(sa), gsb_p(sb), gas_p(alpha_scale),
      gbs_p(beta_scale), gdcoef(dcoef), ggsa(gsa0), ggsb(gsb0), ggas(gas0), ggbs(gbs0);
  DeviceArray<T> gdproj(std::vector<float>(proj.size(), 0.0f));
  ASSERT_TRUE(ops::HcCoefForward(ex.gpu, gcoef.f32(), gt.f32(), ld, gt.f32() + n + 1, ld,
                                 gsa_p.f32(), gsb_p.f32(), gas_p.f32(), gbs_p.f32(), rows, n)
                  .ok());
  ASSERT_TRUE(ops::HcCoefBackward(ex.gpu, gdproj.get(), gdproj.get() + n + 1, ggsa.f32(),
                                  ggsb.f32(), ggas.f32(), ggbs.f32(), gdcoef.f32(), gt.f32(), ld,
                                  gt.f32() + n + 1, ld, gas_p.f32(), gbs_p.f32(), rows, n)
                  .ok());
  ExpectClose(gt.Download(), t, 1e-5, "hc tanh");
  ExpectClose(gcoef.Download(), coef, 1e-5, "hc coef");
  ExpectClose(gdproj.Download(), dproj, stored, "hc dproj");  // padding untouched (0)
  ExpectClose(ggsa.Download(), gsa, sums, "hc grad static_alpha");
  ExpectClose(ggsb.Download(), gsb, sums, "hc grad static_beta");
  ExpectClose(ggas.Download(), gas, sums, "hc grad alpha_scale");
  ExpectClose(ggbs.Download(), gbs, sums, "hc grad beta_scale");
  // lda narrower than the n+1 alpha columns: refused before launching.
  EXPECT_TRUE(absl::IsInvalidArgument(
      ops::HcCoefForward(ex.gpu, gcoef.f32(), gt.f32(), n, gt.f32() + n + 1, ld, gsa_p.f32(),
                         gsb_p.f32(), gas_p.f32(), gbs_p.f32(), rows, n)));
  // One buffer with ld = n+1: tb's row r would be ta's row r+1; refused by both.
  EXPECT_TRUE(absl::IsInvalidArgument(
      ops::HcCoefForward(ex.gpu, gcoef.f32(), gt.f32(), n + 1, gt.f32() + n + 1, n + 1, gsa_p.f32(),
                         gsb_p.f32(), gas_p.f32(), gbs_p.f32(), rows, n)));
  EXPECT_TRUE(absl::IsInvalidArgument(ops::HcCoefBackward(
      ex.gpu, gdproj.get(), gdproj.get() + n + 1, ggsa.f32(), ggsb.f32(), ggas.f32(), ggbs.f32(),
      gdcoef.f32(), gt.f32(), n + 1, gt.f32() + n + 1, n + 1, gas_p.f32(), gbs_p.f32(), rows, n)));
}

// A pipeline boundary's join and split: copies, so the GPU equals the CPU exactly (the parts
// in device arrays of device pointers, as a published PtrList holds them).
template <typename T>
void CheckBoundaryCudaAgainstCpu() {
  const int rows = 13, n = 3, c = 40;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  std::vector<std::vector<float>> parts;
  std::vector<const float*> in;
  std::vector<std::unique_ptr<DeviceArray<T>>> gparts, gouts;
  std::vector<const T*> gin;
  std::vector<T*> gout;
  for (int j = 0; j < n; ++j) {
    parts.push_back(Quantize<T>(RandomNormal(Sz(rows, c), 81 + j)));
    in.push_back(parts.back().data());
    gparts.push_back(std::make_unique<DeviceArray<T>>(parts.back()));
    gin.push_back(gparts.back()->get());
    gouts.push_back(std::make_unique<DeviceArray<T>>(std::vector<float>(Sz(rows, c), -1.0f)));
    gout.push_back(gouts.back()->get());
  }
  const auto h = Quantize<T>(RandomNormal(Sz(rows * n, c), 85));
  std::vector<float> joined(h.size());
  std::vector<std::vector<float>> outs(n, std::vector<float>(Sz(rows, c)));
  std::vector<float*> out;
  for (int j = 0; j < n; ++j) out.push_back(outs[j].data());
  EXPECT_TRUE(ops::JoinStreams(ex.cpu, joined.data(), in.data(), rows, n, c).ok());
  EXPECT_TRUE(ops::SplitStreams(ex.cpu, out.data(), h.data(), rows, n, c).ok());
  DeviceVector<const T*> gin_list(gin);
  DeviceVector<T*> gout_list(gout);
  DeviceArray<T> gh(h), gjoined(std::vector<float>(h.size(), -1.0f));
  ASSERT_TRUE(ops::JoinStreams(ex.gpu, gjoined.get(), gin_list.get(), rows, n, c).ok());
  ASSERT_TRUE(ops::SplitStreams(ex.gpu, gout_list.get(), gh.get(), rows, n, c).ok());
  EXPECT_EQ(gjoined.Download(), joined);
  for (int j = 0; j < n; ++j) EXPECT_EQ(gouts[j]->Download(), outs[j]) << j;
  // More streams than the kernels hold: refused before launching.
  EXPECT_TRUE(absl::IsInvalidArgument(ops::JoinStreams(
      ex.gpu, gjoined.get(), gin_list.get(), 1, cuda::kMaxHyperStreams + 1, c)));
  EXPECT_TRUE(absl::IsInvalidArgument(ops::SplitStreams(
      ex.gpu, gout_list.get(), gh.get(), 1, cuda::kMaxHyperStreams + 1, c)));
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(HyperOps, CheckCudaAgainstCpu)
SATDAR_CUDA_MATCHES_CPU_TESTS(HyperBoundaryOps, CheckBoundaryCudaAgainstCpu)
SATDAR_CUDA_MATCHES_CPU_TESTS(HyperMixingOps, CheckMixingCudaAgainstCpu)
SATDAR_CUDA_MATCHES_CPU_TESTS(HcCoefOps, CheckHcCoefCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
