// MUDDFormer's dense connection ops (muddformer_ops.h): the CPU side by f64 central
// differences (the sources X_j, the dynamic coefficients a with padding columns, the static
// weights, four ways and one; the GELU's input), and the CUDA side against the CPU side, f32
// and bf16 (tag gpu: skipped without a GPU), on the inputs the MUDDFormer case of
// residual_mixing_cuda_test used.
//
// Tolerances (gpu_test_util's ExpectClose: |gpu - cpu| <= rtol * max(|cpu|, rms(cpu))):
//   f32: 1e-5 everywhere (fp32 on both sides; only the order of additions and the GPU's fused
//   multiply-adds differ).
//   bf16: the CPU runs in f32 on the same bf16-rounded inputs. Outputs stored in bf16 (outs,
//   dX_j, da_t, gelu, its backward) get 1e-2 (one bf16 rounding is <= 2^-9 relative, plus fp32
//   sums); fp32 outputs (da, the static weights' gradient) 1e-4.
#include "model/variants/muddformer_ops.h"

#include <memory>
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

constexpr int kRows = 5, kC = 7, kSources = 3;

// loss = sum_w <g_w, out_w>; ld has two padding columns (their a is ignored, their da 0).
TEST(MuddformerOps, DenseCombineGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int64_t nc = static_cast<int64_t>(kRows) * kC;
  for (int ways : {4, 1}) {
    const int cols = ways * kSources, ld = cols + 2;
    std::vector<Vec> xs, outs(ways, Vec(nc)), g, dxs(kSources, Vec(nc, 0.0));
    for (int j = 0; j < kSources; ++j) xs.push_back(RandomVector(nc, 1 + j));
    for (int w = 0; w < ways; ++w) g.push_back(RandomVector(nc, 10 + w));
    Vec a = RandomVector(static_cast<size_t>(kRows) * ld, 20);
    Vec stat = RandomVector(cols, 21);
    std::vector<const double*> pxs, pg;
    std::vector<double*> pouts, pdxs;
    for (int j = 0; j < kSources; ++j) {
      pxs.push_back(xs[j].data());
      pdxs.push_back(dxs[j].data());
    }
    for (int w = 0; w < ways; ++w) {
      pouts.push_back(outs[w].data());
      pg.push_back(g[w].data());
    }
    auto loss = [&] {
      cpu::DenseCombineForward(pouts.data(), ways, pxs.data(), kSources, a.data(), ld,
                               stat.data(), kRows, kC, &pool);
      double sum = 0;
      for (int w = 0; w < ways; ++w) sum += Dot(g[w], outs[w]);
      return sum;
    };
    Vec da(a.size(), 7.0), dstat(cols, 0.0);  // da is overwritten, its padding included
    cpu::DenseCombineBackward(da.data(), dstat.data(), pdxs.data(), pg.data(), ways, pxs.data(),
                              kSources, a.data(), ld, stat.data(), kRows, kC, &pool);
    for (int j = 0; j < kSources; ++j) {
      EXPECT_LT(GradError(&xs[j], dxs[j], loss), 1e-8) << "ways " << ways << " X_" << j;
    }
    EXPECT_LT(GradError(&a, da, loss), 1e-8) << "ways " << ways;
    EXPECT_LT(GradError(&stat, dstat, loss), 1e-8) << "ways " << ways;
  }
}

// loss = <w, gelu(h)>; the backward in place (dh aliasing dg, as the models call it) equals the
// out-of-place one exactly.
TEST(MuddformerOps, GeluGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int64_t n = 37;
  Vec h = RandomVector(n, 30, 2.0);
  const Vec w = RandomVector(n, 31);
  Vec gelu(n);
  auto loss = [&] {
    cpu::GeluForward(gelu.data(), h.data(), n, &pool);
    return Dot(w, gelu);
  };
  Vec dh(n), in_place = w;
  cpu::GeluBackward(dh.data(), w.data(), h.data(), n, &pool);
  cpu::GeluBackward(in_place.data(), in_place.data(), h.data(), n, &pool);
  EXPECT_LT(GradError(&h, dh, loss), 1e-8);
  EXPECT_EQ(in_place, dh);
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceArray;
using core::gpu_test::DeviceVector;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

size_t Sz(int a, int b) { return static_cast<size_t>(a) * b; }

// The dense combination and its backward with `ways` ways (4: between blocks; 1: after the
// last), accumulating into nonzero dX_j and static gradients.
template <typename T>
void CheckCombine(int ways) {
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, fp32 = kIsBf16<T> ? 1e-4 : 1e-5;
  const int rows = 9, c = 40, sources = 3, ld = 16;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  std::vector<std::vector<float>> xs, douts, dxs0;
  for (int j = 0; j < sources; ++j) xs.push_back(Quantize<T>(RandomNormal(Sz(rows, c), 20 + j)));
  for (int w = 0; w < ways; ++w) douts.push_back(Quantize<T>(RandomNormal(Sz(rows, c), 30 + w)));
  for (int j = 0; j < sources; ++j) dxs0.push_back(Quantize<T>(RandomNormal(Sz(rows, c), 40 + j)));
  const auto a = RandomNormal(Sz(rows, ld), 50);
  const auto stat = RandomNormal(ways * sources, 51);
  const auto dstat0 = RandomNormal(ways * sources, 54, 0.1f);
  // CPU.
  std::vector<std::vector<float>> outs(ways, std::vector<float>(Sz(rows, c))), dxs = dxs0;
  std::vector<float> da(Sz(rows, ld)), dstat = dstat0;
  std::vector<const float*> hxs, hdouts;
  std::vector<float*> houts, hdxs;
  for (int j = 0; j < sources; ++j) {
    hxs.push_back(xs[j].data());
    hdxs.push_back(dxs[j].data());
  }
  for (int w = 0; w < ways; ++w) {
    houts.push_back(outs[w].data());
    hdouts.push_back(douts[w].data());
  }
  EXPECT_TRUE(ops::DenseCombineForward(ex.cpu, houts.data(), ways, hxs.data(), sources, a.data(),
                                       ld, stat.data(), rows, c)
                  .ok());
  EXPECT_TRUE(ops::DenseCombineBackward(ex.cpu, da.data(), dstat.data(), hdxs.data(), hdouts.data(),
                                        ways, hxs.data(), sources, a.data(), ld, stat.data(), rows,
                                        c)
                  .ok());
  // GPU.
  std::vector<std::unique_ptr<DeviceArray<T>>> gxs, gouts, gdouts, gdxs;
  std::vector<T*> pxs, pouts, pdouts, pdxs;
  for (int j = 0; j < sources; ++j) {
    gxs.push_back(std::make_unique<DeviceArray<T>>(xs[j]));
    gdxs.push_back(std::make_unique<DeviceArray<T>>(dxs0[j]));
    pxs.push_back(gxs.back()->get());
    pdxs.push_back(gdxs.back()->get());
  }
  for (int w = 0; w < ways; ++w) {
    gouts.push_back(std::make_unique<DeviceArray<T>>(Sz(rows, c)));
    gdouts.push_back(std::make_unique<DeviceArray<T>>(douts[w]));
    pouts.push_back(gouts.back()->get());
    pdouts.push_back(gdouts.back()->get());
  }
  DeviceVector<T*> lxs(pxs), louts(pouts), ldouts(pdouts), ldxs(pdxs);
  DeviceArray<float> ga(a), gstat(stat), gda(da.size()), gdstat(dstat0);
  DeviceArray<T> gda_t(da.size());
  ASSERT_TRUE(ops::DenseCombineForward(ex.gpu, louts.get(), ways, lxs.get(), sources, ga.get(), ld,
                                       gstat.get(), rows, c)
                  .ok());
  ASSERT_TRUE(ops::DenseCombineBackward(ex.gpu, gda.get(), gda_t.get(), gdstat.get(), ldxs.get(),
                                        ldouts.get(), ways, lxs.get(), sources, ga.get(), ld,
                                        gstat.get(), rows, c)
                  .ok());
  for (int w = 0; w < ways; ++w) ExpectClose(gouts[w]->Download(), outs[w], stored, "mudd out");
  for (int j = 0; j < sources; ++j) ExpectClose(gdxs[j]->Download(), dxs[j], stored, "mudd dX");
  ExpectClose(gda.Download(), da, fp32, "mudd da");
  ExpectClose(gda_t.Download(), da, stored, "mudd da (compute dtype)");
  ExpectClose(gdstat.Download(), dstat, fp32, "mudd dstatic");
}

template <typename T>
void CheckCudaAgainstCpu() {
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5;
  const int rows = 9, c = 40, sources = 3;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  CheckCombine<T>(4);
  CheckCombine<T>(1);
  // GELU (in place backward, as the GPU model calls it).
  const auto hpre = Quantize<T>(RandomNormal(Sz(rows, c), 52, 2.0f));
  const auto dg = Quantize<T>(RandomNormal(hpre.size(), 53));
  const int64_t n = static_cast<int64_t>(hpre.size());
  std::vector<float> gelu(hpre.size()), dgelu(hpre.size());
  EXPECT_TRUE(ops::GeluForward(ex.cpu, gelu.data(), hpre.data(), n).ok());
  EXPECT_TRUE(ops::GeluBackward(ex.cpu, dgelu.data(), dg.data(), hpre.data(), n).ok());
  DeviceArray<T> gh(hpre), gg(hpre.size()), gdg(dg);
  ASSERT_TRUE(ops::GeluForward(ex.gpu, gg.get(), gh.get(), n).ok());
  ASSERT_TRUE(ops::GeluBackward(ex.gpu, gdg.get(), gdg.get(), gh.get(), n).ok());
  ExpectClose(gg.Download(), gelu, stored, "gelu");
  ExpectClose(gdg.Download(), dgelu, stored, "gelu backward");
  // More ways than the kernels hold, or ld too narrow: refused before launching.
  std::vector<T*> none(5, nullptr);
  DeviceVector<T*> lnone(none);
  DeviceArray<float> ga(Sz(rows, 20)), gstat(20);
  EXPECT_TRUE(absl::IsInvalidArgument(ops::DenseCombineForward(
      ex.gpu, lnone.get(), 5, lnone.get(), 4, ga.get(), 20, gstat.get(), rows, c)));
  EXPECT_TRUE(absl::IsInvalidArgument(ops::DenseCombineForward(
      ex.gpu, lnone.get(), 4, lnone.get(), sources, ga.get(), 11, gstat.get(), rows, c)));
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(MuddformerOps, CheckCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
