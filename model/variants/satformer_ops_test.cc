// SATFormer's value gate ops (satformer_ops.h): the CPU side by f64 central differences (x,
// W_alpha, V, V1; about half the gates closed), and the CUDA side against the CPU side, f32
// and bf16 (tag gpu: skipped without a GPU).
//
// Tolerances (gpu_test_util's ExpectClose: |gpu - cpu| <= rtol * max(|cpu|, rms(cpu))):
//   f32: 1e-5 everywhere (fp32 on both sides; only the order of additions differs).
//   bf16: the CPU runs in f32 on the same bf16-rounded inputs. Outputs stored in bf16 (vmix,
//   dv1, dx) get 1e-2 (one bf16 rounding is <= 2^-9 relative); fp32 outputs (alpha, dalpha,
//   dW_alpha) 1e-4. dv is a copy of dvmix and is checked exactly.
#include "model/variants/satformer_ops.h"

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

constexpr int kN = 7, kNkv = 3, kHs = 5, kC = 11;

TEST(SatformerOps, GradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int64_t nv = static_cast<int64_t>(kN) * kNkv * kHs;
  Vec x = RandomVector(kN * kC, 1), w = RandomVector(kNkv * kC, 2), v = RandomVector(nv, 3),
      v1 = RandomVector(nv, 4);
  const Vec g = RandomVector(nv, 5);  // loss = <g, vmix>
  Vec alpha(kN * kNkv), vmix(nv);
  auto loss = [&] {
    cpu::ValueGateForward(alpha.data(), x.data(), w.data(), kN, kNkv, kC, &pool);
    cpu::ValueMixForward(vmix.data(), alpha.data(), v.data(), v1.data(), kN, kNkv, kHs, &pool);
    return Dot(g, vmix);
  };
  loss();
  int closed = 0;
  for (double a : alpha) closed += a == 0.0;
  EXPECT_GT(closed, 0);                  // the ReLU's zero side is exercised
  EXPECT_LT(closed, kN * kNkv);          // and its open side
  Vec dv(nv), dv1(nv, 0.0), dalpha(kN * kNkv), dx(kN * kC, 0.0), dw(kNkv * kC, 0.0);
  cpu::ValueMixBackward(dv.data(), dv1.data(), dalpha.data(), g.data(), v1.data(), alpha.data(),
                        kN, kNkv, kHs, &pool);
  cpu::ValueGateBackward(dx.data(), dw.data(), dalpha.data(), x.data(), w.data(), kN, kNkv, kC,
                         &pool);
  EXPECT_LT(GradError(&v, dv, loss), 1e-8);
  EXPECT_LT(GradError(&v1, dv1, loss), 1e-8);
  EXPECT_LT(GradError(&x, dx, loss), 1e-8);
  EXPECT_LT(GradError(&w, dw, loss), 1e-8);
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceArray;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

template <typename T>
void CheckCudaAgainstCpu() {
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, fp32 = kIsBf16<T> ? 1e-4 : 1e-5;
  const int n = 23, nkv = 3, hs = 16, c = 40;
  const size_t nv = static_cast<size_t>(n) * nkv * hs;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  const auto x = Quantize<T>(RandomNormal(static_cast<size_t>(n) * c, 51));
  const auto w = Quantize<T>(RandomNormal(static_cast<size_t>(nkv) * c, 52, 0.3f));
  const auto v = Quantize<T>(RandomNormal(nv, 53));
  const auto v1 = Quantize<T>(RandomNormal(nv, 54));
  const auto dvmix = Quantize<T>(RandomNormal(nv, 55));
  const auto dx0 = Quantize<T>(RandomNormal(static_cast<size_t>(n) * c, 56, 0.1f));
  const auto dv10 = Quantize<T>(RandomNormal(nv, 57, 0.1f));
  const auto dw0 = RandomNormal(w.size(), 58, 0.1f);
  std::vector<float> alpha(static_cast<size_t>(n) * nkv), vmix(nv), dalpha(alpha.size());
  std::vector<float> dv(nv), dv1 = dv10, dx = dx0, dw = dw0;
  EXPECT_TRUE(ops::ValueGateForward(ex.cpu, alpha.data(), x.data(), w.data(), n, nkv, c).ok());
  EXPECT_TRUE(
      ops::ValueMixForward(ex.cpu, vmix.data(), alpha.data(), v.data(), v1.data(), n, nkv, hs)
          .ok());
  EXPECT_TRUE(ops::ValueMixBackward(ex.cpu, dv.data(), dv1.data(), dalpha.data(), dvmix.data(),
                                    v1.data(), alpha.data(), n, nkv, hs)
                  .ok());
  EXPECT_TRUE(ops::ValueGateBackward(ex.cpu, dx.data(), dw.data(), dalpha.data(), x.data(),
                                     w.data(), n, nkv, c)
                  .ok());
  DeviceArray<T> gx(x), gw(w), gv(v), gv1(v1), gdvmix(dvmix), gdx(dx0), gdv1(dv10), gvmix(nv),
      gdv(nv);
  DeviceArray<float> galpha(alpha.size()), gdalpha(alpha.size()), gdw(dw0);
  ASSERT_TRUE(ops::ValueGateForward(ex.gpu, galpha.get(), gx.get(), gw.get(), n, nkv, c).ok());
  ASSERT_TRUE(
      ops::ValueMixForward(ex.gpu, gvmix.get(), galpha.get(), gv.get(), gv1.get(), n, nkv, hs)
          .ok());
  ASSERT_TRUE(ops::ValueMixBackward(ex.gpu, gdv.get(), gdv1.get(), gdalpha.get(), gdvmix.get(),
                                    gv1.get(), galpha.get(), n, nkv, hs)
                  .ok());
  ASSERT_TRUE(ops::ValueGateBackward(ex.gpu, gdx.get(), gdw.get(), gdalpha.get(), gx.get(),
                                     gw.get(), n, nkv, c)
                  .ok());
  ExpectClose(galpha.Download(), alpha, fp32, "alpha");
  ExpectClose(gvmix.Download(), vmix, stored, "vmix");
  ExpectClose(gdalpha.Download(), dalpha, fp32, "dalpha");
  ExpectClose(gdv.Download(), dv, 0.0, "dv");
  ExpectClose(gdv1.Download(), dv1, stored, "dv1");
  ExpectClose(gdx.Download(), dx, stored, "dx");
  ExpectClose(gdw.Download(), dw, fp32, "dW_alpha");
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(SatformerOps, CheckCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
