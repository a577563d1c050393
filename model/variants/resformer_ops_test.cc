// ResFormer's value mix ops (resformer_ops.h): the CPU side by f64 central differences (V, V1
// and the learnable_plus lambdas), and the CUDA side against the CPU side, f32 and bf16 (tag
// gpu: skipped without a GPU). Tolerances as dar_ops_test: f32 1e-5; bf16 1e-2 for bf16
// outputs, 1e-4 for the fp32 lambda gradients.
#include "model/variants/resformer_ops.h"

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

constexpr int64_t kN = 29;

// Layer 2 of 4 (three logits); fixed mode has no parameters.
TEST(ResformerOps, GradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  for (bool learnable : {true, false}) {
    Vec v = RandomVector(kN, 1), v1 = RandomVector(kN, 2), scale = {1.7}, logits = RandomVector(3, 3),
        lambda2 = {0.4};
    const Vec w = RandomVector(kN, 4);  // loss = <w, vmix>
    ResformerLambdas<double> p;
    p.layer = 2;
    p.layers = 4;
    if (learnable) {
      p.scale = scale.data();
      p.logits = logits.data();
      p.lambda2 = lambda2.data();
    }
    Vec vmix(kN);
    auto loss = [&] {
      cpu::ResformerMixForward(vmix.data(), v1.data(), v.data(), p, kN, &pool);
      return Dot(w, vmix);
    };
    Vec dv(kN), dv1(kN, 0.0), dscale = {0.0}, dlogits(3, 0.0), dlambda2 = {0.0};
    cpu::ResformerMixBackward(dv.data(), dv1.data(), w.data(), v1.data(), v.data(), p,
                              dscale.data(), dlogits.data(), dlambda2.data(), kN);
    EXPECT_LT(GradError(&v, dv, loss), 1e-8) << learnable;
    EXPECT_LT(GradError(&v1, dv1, loss), 1e-8) << learnable;
    if (learnable) {
      EXPECT_LT(GradError(&scale, dscale, loss), 1e-8);
      EXPECT_LT(GradError(&logits, dlogits, loss), 1e-8);
      EXPECT_LT(GradError(&lambda2, dlambda2, loss), 1e-8);
    } else {
      double l1, l2;
      cpu::ResformerMix(p, &l1, &l2);
      EXPECT_EQ(l1, 0.5);
      EXPECT_EQ(l2, 0.5);
    }
  }
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceBuffer;
using core::gpu_test::ExpectClose;
using core::gpu_test::kDTypeOf;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

template <typename T>
void CheckCudaAgainstCpu() {
  const core::DType dt = kDTypeOf<T>;
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, scalar = kIsBf16<T> ? 1e-4 : 1e-5;
  const int64_t n = 4099;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  const std::vector<float> v = Quantize<T>(RandomNormal(n, 1)), v1 = Quantize<T>(RandomNormal(n, 2));
  const std::vector<float> g = Quantize<T>(RandomNormal(n, 3)), dv1_in = Quantize<T>(RandomNormal(n, 4));
  std::vector<float> scale = {1.7f}, logits = {0.2f, -0.4f, 0.9f}, lambda2 = {0.4f};
  ResformerLambdas<float> p;
  p.layer = 3;
  p.layers = 4;
  p.scale = scale.data();
  p.logits = logits.data();
  p.lambda2 = lambda2.data();
  std::vector<float> vmix(n), dv(n), dv1 = dv1_in, dscale = {0.0f}, dlogits(3, 0.0f), dl2 = {0.0f};
  EXPECT_TRUE(ops::ResformerMixForward(ex.cpu, vmix.data(), v1.data(), v.data(), p, n).ok());
  EXPECT_TRUE(ops::ResformerMixBackward(ex.cpu, dv.data(), dv1.data(), g.data(), v1.data(),
                                        v.data(), p, dscale.data(), dlogits.data(), dl2.data(), n)
                  .ok());
  DeviceBuffer d_v(v, dt), d_v1(v1, dt), d_g(g, dt), d_out(n, dt), d_dv1(dv1_in, dt),
      d_scale(scale, core::DType::kF32), d_logits(logits, core::DType::kF32),
      d_l2(lambda2, core::DType::kF32), d_dscale(std::vector<float>{0.0f}, core::DType::kF32),
      d_dlogits(std::vector<float>(3, 0.0f), core::DType::kF32),
      d_dl2(std::vector<float>{0.0f}, core::DType::kF32);
  auto ptr = [](const DeviceBuffer& b) { return static_cast<T*>(b.get()); };
  ResformerLambdas<float> dp = p;
  dp.scale = d_scale.f32();
  dp.logits = d_logits.f32();
  dp.lambda2 = d_l2.f32();
  ASSERT_TRUE(ops::ResformerMixForward(ex.gpu, ptr(d_out), ptr(d_v1), ptr(d_v), dp, n).ok());
  ExpectClose(d_out.Download(), vmix, stored, "vmix");
  ASSERT_TRUE(ops::ResformerMixBackward(ex.gpu, ptr(d_out), ptr(d_dv1), ptr(d_g), ptr(d_v1),
                                        ptr(d_v), dp, d_dscale.f32(), d_dlogits.f32(), d_dl2.f32(),
                                        n)
                  .ok());
  ExpectClose(d_out.Download(), dv, stored, "dv");
  ExpectClose(d_dv1.Download(), dv1, stored, "dv1");
  ExpectClose(d_dscale.Download(), dscale, scalar, "dscale");
  ExpectClose(d_dlogits.Download(), dlogits, scalar, "dlogits");
  ExpectClose(d_dl2.Download(), dl2, scalar, "dlambda2");
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(ResformerOps, CheckCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
