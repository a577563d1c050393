// DenseFormer's depth-weighted average ops (denseformer_ops.h): the CPU side by f64 central
// differences (every source and weight), and the CUDA side against the CPU side, f32 and bf16
// (tag gpu: skipped without a GPU). Tolerances as dar_ops_test: f32 1e-5; bf16 1e-2 for bf16
// outputs, 1e-4 for the fp32 weight gradients.
#include "model/variants/denseformer_ops.h"

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

TEST(DenseFormerOps, GradientsMatchFiniteDifferences) {
  const int64_t n = 23;
  const int count = 3;
  std::vector<Vec> xs = {RandomVector(n, 1), RandomVector(n, 2), RandomVector(n, 3)};
  Vec a = RandomVector(count, 4);
  const Vec w = RandomVector(n, 5);  // loss = <w, out>
  Vec out(n);
  auto loss = [&] {
    const double* p[count] = {xs[0].data(), xs[1].data(), xs[2].data()};
    cpu::DwaForward(out.data(), p, count, a.data(), n);
    return Dot(w, out);
  };
  std::vector<Vec> dxs(count, Vec(n, 0.0));
  Vec da(count, 0.0);
  const double* p[count] = {xs[0].data(), xs[1].data(), xs[2].data()};
  double* dp[count] = {dxs[0].data(), dxs[1].data(), dxs[2].data()};
  cpu::DwaBackward(dp, da.data(), w.data(), p, count, a.data(), n);
  for (int j = 0; j < count; ++j) EXPECT_LT(GradError(&xs[j], dxs[j], loss), 1e-8) << j;
  EXPECT_LT(GradError(&a, da, loss), 1e-8);
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceBuffer;
using core::gpu_test::DeviceVector;
using core::gpu_test::ExpectClose;
using core::gpu_test::kDTypeOf;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

template <typename T>
void CheckCudaAgainstCpu() {
  const core::DType dt = kDTypeOf<T>;
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, scalar = kIsBf16<T> ? 1e-4 : 1e-5;
  OpsTestExec ex(nullptr);  // the CPU side runs on this thread
  const int64_t n = 3001;
  const int count = 4;
  std::vector<std::vector<float>> xs, dxs;
  for (int j = 0; j < count; ++j) {
    xs.push_back(Quantize<T>(RandomNormal(n, 10 + j)));
    dxs.push_back(Quantize<T>(RandomNormal(n, 20 + j)));  // accumulated into
  }
  const std::vector<float> a = {0.5f, -0.25f, 1.0f, 0.125f};
  const std::vector<float> dy = Quantize<T>(RandomNormal(n, 30));
  std::vector<float> out(n), da(count, 0.0f);
  std::vector<const float*> hp;
  std::vector<float*> hdp;
  for (int j = 0; j < count; ++j) {
    hp.push_back(xs[j].data());
    hdp.push_back(dxs[j].data());
  }
  std::vector<std::unique_ptr<DeviceBuffer>> d_xs, d_dxs;
  std::vector<const T*> pointers;
  std::vector<T*> dpointers;
  for (int j = 0; j < count; ++j) {
    d_xs.push_back(std::make_unique<DeviceBuffer>(xs[j], dt));
    d_dxs.push_back(std::make_unique<DeviceBuffer>(dxs[j], dt));
    pointers.push_back(static_cast<const T*>(d_xs.back()->get()));
    dpointers.push_back(static_cast<T*>(d_dxs.back()->get()));
  }
  EXPECT_TRUE(ops::DwaForward(ex.cpu, out.data(), hp.data(), count, a.data(), n).ok());
  EXPECT_TRUE(
      ops::DwaBackward(ex.cpu, hdp.data(), da.data(), dy.data(), hp.data(), count, a.data(), n)
          .ok());
  DeviceVector<const T*> d_ptrs(pointers);
  DeviceVector<T*> d_dptrs(dpointers);
  DeviceBuffer d_a(a, core::DType::kF32), d_da(std::vector<float>(count, 0.0f), core::DType::kF32),
      d_dy(dy, dt), d_out(n, dt);
  ASSERT_TRUE(
      ops::DwaForward(ex.gpu, static_cast<T*>(d_out.get()), d_ptrs.get(), count, d_a.f32(), n)
          .ok());
  ExpectClose(d_out.Download(), out, stored, "dwa out");
  ASSERT_TRUE(ops::DwaBackward(ex.gpu, d_dptrs.get(), d_da.f32(), static_cast<const T*>(d_dy.get()),
                               d_ptrs.get(), count, d_a.f32(), n)
                  .ok());
  for (int j = 0; j < count; ++j) ExpectClose(d_dxs[j]->Download(), dxs[j], stored, "dwa dx");
  ExpectClose(d_da.Download(), da, scalar, "dwa da");
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(DenseFormerOps, CheckCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
