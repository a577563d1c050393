// DAR's mix and write ops (dar_ops.h): the CPU side by f64 central differences (every input
// and scalar), and the CUDA side against the CPU side on the same inputs, f32 and bf16 (tag
// gpu: skipped without a GPU). Tolerances (ExpectClose: |gpu - cpu| <= rtol * max(|cpu|,
// rms(cpu))): f32 1e-5 (only the order of additions differs); bf16 1e-2 for outputs stored in
// bf16 (one rounding, <= 2^-9 relative, on bf16-rounded inputs), 1e-4 for the fp32 scalar
// gradients (fp32 sums of products of bf16 values).
#include "model/variants/dar_ops.h"

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

constexpr int64_t kN = 37;

TEST(DarOps, MixGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  Vec r0 = RandomVector(kN, 1), r1 = RandomVector(kN, 2), mix = RandomVector(2, 3);
  const Vec w = RandomVector(kN, 4);  // loss = <w, u>
  Vec u(kN);
  auto loss = [&] {
    cpu::DarMixForward(u.data(), r0.data(), r1.data(), mix.data(), kN, &pool);
    return Dot(w, u);
  };
  Vec dr0(kN), dr1(kN), dmix = {0.25, -0.5};  // accumulated into
  const Vec before = dmix;
  cpu::DarMixBackward(dr0.data(), dr1.data(), w.data(), r0.data(), r1.data(), mix.data(),
                      dmix.data(), kN, &pool);
  EXPECT_LT(GradError(&r0, dr0, loss), 1e-8);
  EXPECT_LT(GradError(&r1, dr1, loss), 1e-8);
  const Vec added = {dmix[0] - before[0], dmix[1] - before[1]};
  EXPECT_LT(GradError(&mix, added, loss), 1e-8);
}

// With partials (inside a block) and without (the block's first write: p0 = p1 = 0).
TEST(DarOps, WriteGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  for (bool partial : {true, false}) {
    Vec p0 = RandomVector(kN, 5), p1 = RandomVector(kN, 6), y = RandomVector(kN, 7);
    Vec transport = RandomVector(1, 8), write = RandomVector(2, 9);
    const Vec a = RandomVector(kN, 10), b = RandomVector(kN, 11);  // loss = <a, q0> + <b, q1>
    Vec q0(kN), q1(kN);
    auto loss = [&] {
      cpu::DarWriteForward(q0.data(), q1.data(), partial ? p0.data() : nullptr,
                           partial ? p1.data() : nullptr, y.data(), transport.data(),
                           write.data(), kN, &pool);
      return Dot(a, q0) + Dot(b, q1);
    };
    Vec dy(kN), dp0(kN), dp1(kN), dtransport = {0.0}, dwrite = {0.0, 0.0};
    cpu::DarWriteBackward(dy.data(), dp0.data(), dp1.data(), a.data(), b.data(), y.data(),
                          partial ? p0.data() : nullptr, partial ? p1.data() : nullptr,
                          transport.data(), write.data(), dtransport.data(), dwrite.data(), kN,
                          &pool);
    EXPECT_LT(GradError(&y, dy, loss), 1e-8) << partial;
    EXPECT_LT(GradError(&write, dwrite, loss), 1e-8) << partial;
    if (partial) {
      EXPECT_LT(GradError(&p0, dp0, loss), 1e-8);
      EXPECT_LT(GradError(&p1, dp1, loss), 1e-8);
      EXPECT_LT(GradError(&transport, dtransport, loss), 1e-8);
    } else {
      for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(dp0[i] + dp1[i], 0.0);
      EXPECT_EQ(dtransport[0], 0.0);  // rho only mixes partials
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
  const int64_t n = 5003;  // more than one block per thread, not a multiple of anything
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  const std::vector<float> r0 = Quantize<T>(RandomNormal(n, 1)), r1 = Quantize<T>(RandomNormal(n, 2));
  const std::vector<float> g0 = Quantize<T>(RandomNormal(n, 3)), g1 = Quantize<T>(RandomNormal(n, 4));
  const std::vector<float> mix = {0.3f, -0.7f}, transport = {0.9f}, write = {-1.5f, 2.0f};
  DeviceBuffer d_r0(r0, dt), d_r1(r1, dt), d_g0(g0, dt), d_g1(g1, dt), d_out0(n, dt), d_out1(n, dt),
      d_out2(n, dt), d_mix(mix, core::DType::kF32), d_transport(transport, core::DType::kF32),
      d_write(write, core::DType::kF32);
  auto ptr = [](const DeviceBuffer& b) { return static_cast<T*>(b.get()); };
  // Mix forward and backward.
  std::vector<float> u(n), dr0(n), dr1(n), dmix = {0.0f, 0.0f};
  EXPECT_TRUE(ops::DarMixForward(ex.cpu, u.data(), r0.data(), r1.data(), mix.data(), n).ok());
  EXPECT_TRUE(ops::DarMixBackward(ex.cpu, dr0.data(), dr1.data(), g0.data(), r0.data(), r1.data(),
                                  mix.data(), dmix.data(), n)
                  .ok());
  ASSERT_TRUE(ops::DarMixForward(ex.gpu, ptr(d_out0), ptr(d_r0), ptr(d_r1), d_mix.f32(), n).ok());
  ExpectClose(d_out0.Download(), u, stored, "mix u");
  DeviceBuffer d_dmix(std::vector<float>{0.0f, 0.0f}, core::DType::kF32);
  ASSERT_TRUE(ops::DarMixBackward(ex.gpu, ptr(d_out0), ptr(d_out1), ptr(d_g0), ptr(d_r0), ptr(d_r1),
                                  d_mix.f32(), d_dmix.f32(), n)
                  .ok());
  ExpectClose(d_out0.Download(), dr0, stored, "mix dr0");
  ExpectClose(d_out1.Download(), dr1, stored, "mix dr1");
  ExpectClose(d_dmix.Download(), dmix, scalar, "mix dmix");
  // Write forward and backward, with partials (r0, r1 as p0, p1; g0 as y).
  std::vector<float> q0(n), q1(n), dy(n), dp0(n), dp1(n), dtr = {0.0f}, dw = {0.0f, 0.0f};
  EXPECT_TRUE(ops::DarWriteForward(ex.cpu, q0.data(), q1.data(), r0.data(), r1.data(), g0.data(),
                                   transport.data(), write.data(), n)
                  .ok());
  ASSERT_TRUE(ops::DarWriteForward(ex.gpu, ptr(d_out0), ptr(d_out1), ptr(d_r0), ptr(d_r1),
                                   ptr(d_g0), d_transport.f32(), d_write.f32(), n)
                  .ok());
  ExpectClose(d_out0.Download(), q0, stored, "write q0");
  ExpectClose(d_out1.Download(), q1, stored, "write q1");
  EXPECT_TRUE(ops::DarWriteBackward(ex.cpu, dy.data(), dp0.data(), dp1.data(), g0.data(), g1.data(),
                                    r0.data(), r0.data(), r1.data(), transport.data(), write.data(),
                                    dtr.data(), dw.data(), n)
                  .ok());
  DeviceBuffer d_dtr(std::vector<float>{0.0f}, core::DType::kF32),
      d_dw(std::vector<float>{0.0f, 0.0f}, core::DType::kF32);
  ASSERT_TRUE(ops::DarWriteBackward(ex.gpu, ptr(d_out0), ptr(d_out1), ptr(d_out2), ptr(d_g0),
                                    ptr(d_g1), ptr(d_r0), ptr(d_r0), ptr(d_r1), d_transport.f32(),
                                    d_write.f32(), d_dtr.f32(), d_dw.f32(), n)
                  .ok());
  ExpectClose(d_out0.Download(), dy, stored, "write dy");
  ExpectClose(d_out1.Download(), dp0, stored, "write dp0");
  ExpectClose(d_out2.Download(), dp1, stored, "write dp1");
  ExpectClose(d_dtr.Download(), dtr, scalar, "write dtransport");
  ExpectClose(d_dw.Download(), dw, scalar, "write dwrite");
  // A backward without a workspace is refused, naming the op.
  const absl::Status bare = ops::DarMixBackward(core::CudaExec{}, ptr(d_out0), ptr(d_out1),
                                                ptr(d_g0), ptr(d_r0), ptr(d_r1), d_mix.f32(),
                                                d_dmix.f32(), n);
  EXPECT_TRUE(absl::IsFailedPrecondition(bare)) << bare;
  EXPECT_NE(bare.message().find("DarMixBackward"), std::string::npos) << bare;
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(DarOps, CheckCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
