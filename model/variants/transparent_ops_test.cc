// Transparent Attention's depth softmax ops (transparent_ops.h): the CPU side by f64 central
// differences (every logit, through a weighted sum as the topology uses it), and the CUDA side
// against the CPU side in fp32 (tag gpu: skipped without a GPU).
#include "model/variants/transparent_ops.h"

#include <cmath>
#include <vector>

#include "core/cuda/testing/gpu_test_util.h"
#include "core/ops/gradcheck_testutil.h"
#include "gtest/gtest.h"
#include "model/variants/ops_test_exec.h"

namespace satdar::model {
namespace {

using core::testing::Dot;
using core::testing::GradError;
using core::testing::RandomVector;
using Vec = std::vector<double>;

TEST(TransparentOps, ZeroLogitsAreUniform) {
  const Vec z(5, 0.0);
  Vec a(5);
  cpu::DepthSoftmaxForward(a.data(), z.data(), 5);
  for (double v : a) EXPECT_DOUBLE_EQ(v, 0.2);
}

TEST(TransparentOps, LargeLogitsDoNotOverflow) {
  const Vec z = {1000.0, 999.0, -1000.0};
  Vec a(3);
  cpu::DepthSoftmaxForward(a.data(), z.data(), 3);
  EXPECT_NEAR(a[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-12);
  EXPECT_NEAR(a[1], std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-12);
  EXPECT_EQ(a[2], 0.0);
}

TEST(TransparentOps, GradientsMatchFiniteDifferences) {
  const int count = 4;
  Vec z = RandomVector(count, 1);
  const Vec g = RandomVector(count, 2);  // loss = <g, softmax(z)>
  Vec a(count);
  auto loss = [&] {
    cpu::DepthSoftmaxForward(a.data(), z.data(), count);
    return Dot(g, a);
  };
  loss();
  Vec dz(count, 0.5);  // accumulated into
  cpu::DepthSoftmaxBackward(dz.data(), a.data(), g.data(), count);
  for (double& v : dz) v -= 0.5;
  EXPECT_LT(GradError(&z, dz, loss), 1e-8);
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceBuffer;
using core::gpu_test::ExpectClose;
using core::gpu_test::RandomNormal;

TEST(TransparentOps, CudaMatchesCpu) {
  SATDAR_SKIP_WITHOUT_GPU();
  OpsTestExec ex(nullptr);
  const int count = 37;
  const std::vector<float> z = RandomNormal(count, 3, 2.0f), ga = RandomNormal(count, 4);
  const std::vector<float> gz0 = RandomNormal(count, 5);
  std::vector<float> a(count), gz = gz0;
  ASSERT_TRUE(ops::DepthSoftmaxForward(ex.cpu, a.data(), z.data(), count).ok());
  ASSERT_TRUE(ops::DepthSoftmaxBackward(ex.cpu, gz.data(), a.data(), ga.data(), count).ok());
  DeviceBuffer d_z(z, core::DType::kF32), d_a(count, core::DType::kF32),
      d_ga(ga, core::DType::kF32), d_gz(gz0, core::DType::kF32);
  ASSERT_TRUE(ops::DepthSoftmaxForward(ex.gpu, d_a.f32(), d_z.f32(), count).ok());
  ExpectClose(d_a.Download(), a, 1e-6, "softmax");
  ASSERT_TRUE(ops::DepthSoftmaxBackward(ex.gpu, d_gz.f32(), d_a.f32(), d_ga.f32(), count).ok());
  ExpectClose(d_gz.Download(), gz, 1e-6, "softmax grad");
}

#endif  // SATDAR_WITH_CUDA

}  // namespace
}  // namespace satdar::model
