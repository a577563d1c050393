// DeviceModel (device_model.h), what the GPU trainer drives, against the device classes it
// wraps (DecoderModelT<Cuda<E>>, whose every design design_device_test checks against the
// CPU): the loss it leaves on the device, the gradients of its fused cross-entropy, the
// evaluation pass without auxiliary losses, and its errors. Tag gpu: skips without a CUDA build
// or a GPU.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "model/decoder.h"
#include "model/device_model.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/allocator.h"
#include "model/variants/ops_test_exec.h"
#endif

namespace satdar::model {
namespace {

namespace gt = core::gpu_test;

constexpr int kB = 2, kT = 16;

ModelConfig Tiny(bool moe) {
  ModelConfig c;
  c.vocab_size = 80;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.residual = Residual::kDar;
  c.value_residual = ValueResidualKind::kSatFormer;
  if (moe) {
    MoeConfig m;
    m.num_experts = 4;
    m.top_k = 2;
    m.expert_intermediate_size = 32;
    c.moe = m;
  }
  return c;
}

#ifdef SATDAR_WITH_CUDA

// The whole model in `compute`.
DeviceModelOptions Options(core::DType compute) {
  DeviceModelOptions o;
  o.compute = compute;
  return o;
}

std::vector<float> Params(const ParamTable& table) {
  std::vector<float> p(table.size(), 0.0f);
  table.Initialize(p.data(), 5);
  return p;
}

// One fp64 device value, read back.
double Read(const double* device) {
  double v = 0;
  EXPECT_EQ(cudaMemcpy(&v, device, sizeof(v), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

double Relative(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    n += double{b[i]} * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

// Forward + Backward with loss_scale 0.5 through the facade, and through the classes with the
// loss read back; then an evaluation pass.
template <typename E>
void CheckAgainstClasses(bool moe) {
  if (core::cuda::DeviceCount() == 0) GTEST_SKIP() << "no GPU";
  const ModelConfig c = Tiny(moe);
  const std::vector<int32_t> tokens = gt::RandomTokens(kB * (kT + 1), c.vocab_size, 9);
  constexpr core::DType kDt = gt::kIsBf16<E> ? core::DType::kBF16 : core::DType::kF32;

  core::cuda::CachingAllocator alloc;
  auto facade = DeviceModel::Create(c, Options(kDt), nullptr, &alloc);
  ASSERT_TRUE(facade.ok()) << facade.status();
  DeviceModel& m = **facade;
  EXPECT_EQ(m.params().align(), kDeviceParamAlign);
  const std::vector<float> p = Params(m.params());
  gt::DeviceArray<float> master(p), grads(std::vector<float>(p.size(), 0.0f));
  gt::DeviceVector<double> acc(std::vector<double>{0.0});

  // Before SetWeights: FailedPrecondition.
  EXPECT_EQ(m.Forward(tokens.data(), kB, kT, 0.5, acc.get()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m.SetWeights(master.get()).ok());
  ASSERT_TRUE(m.Forward(tokens.data(), kB, kT, 0.5, acc.get()).ok());
  EXPECT_GT(m.activation_bytes(), 0);
  ASSERT_TRUE(m.Backward(grads.get()).ok());
  const double facade_loss = Read(acc.get());
  const std::vector<float> facade_grads = grads.Download();

  // The classes: the loss read back, the cross-entropy's gradient computed in Backward.
  DeviceTestExec gpu;
  auto model = CreateDeviceModel<Cuda<E>>(c, Sharding{}, gpu.x);
  ASSERT_TRUE(model.ok()) << model.status();
  gt::DeviceArray<E> compute(gt::Quantize<E>(p));
  gt::DeviceArray<float> want_grads(std::vector<float>(p.size(), 0.0f));
  const Weights<Cuda<E>> w{compute.get(), master.get()};
  auto loss = (*model)->Forward(w, tokens.data(), kB, kT);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const double ce = (*model)->last_cross_entropy();
  ASSERT_TRUE((*model)->Backward(w, want_grads.get(), 0.5).ok());
  EXPECT_NEAR(facade_loss, 0.5 * *loss, 1e-6 * *loss);
  if (moe) {
    EXPECT_GT(*loss, ce);  // the auxiliary losses are in the facade's loss too
  }
  EXPECT_LE(Relative(facade_grads, want_grads.Download()), gt::kIsBf16<E> ? 1e-3 : 1e-6);

  // Evaluation: the cross-entropy alone, and no Backward after it.
  gt::DeviceVector<double> ce_acc(std::vector<double>{0.0});
  ASSERT_TRUE(m.Evaluate(tokens.data(), kB, kT, ce_acc.get()).ok());
  EXPECT_NEAR(Read(ce_acc.get()), ce, 1e-6 * ce);
  EXPECT_EQ(m.Backward(grads.get()).code(), absl::StatusCode::kFailedPrecondition);

  // A token outside the vocabulary: InvalidArgument, and the model still runs.
  std::vector<int32_t> bad = tokens;
  bad[3] = c.vocab_size;
  EXPECT_EQ(m.Forward(bad.data(), kB, kT, 1.0, acc.get()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(m.Forward(tokens.data(), kB, kT, 1.0, acc.get()).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

template <typename E>
void CheckDense() {
  CheckAgainstClasses<E>(false);
}
template <typename E>
void CheckMoe() {
  CheckAgainstClasses<E>(true);
}

// A config the device kernels cannot take: InvalidArgument naming the field, before any
// device work.
template <typename E>
void CheckRefusal() {
  if (core::cuda::DeviceCount() == 0) GTEST_SKIP() << "no GPU";
  ModelConfig c = Tiny(false);
  c.hidden_size = 72;
  c.intermediate_size = 95;  // 95 x 72 % 32 != 0: gate_proj and up_proj could not be one GEMM
  core::cuda::CachingAllocator alloc;
  auto m = DeviceModel::Create(c, Options(core::DType::kF32), nullptr, &alloc);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(m.status().message()).find("intermediate_size"), std::string::npos)
      << m.status();
  auto f64 = DeviceModel::Create(Tiny(false), Options(core::DType::kF64), nullptr,
                                 &alloc);
  ASSERT_FALSE(f64.ok());
  EXPECT_EQ(f64.status().code(), absl::StatusCode::kInvalidArgument);
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(DeviceModelDense, CheckDense)
SATDAR_CUDA_MATCHES_CPU_TESTS(DeviceModelMoe, CheckMoe)
SATDAR_CUDA_MATCHES_CPU_TESTS(DeviceModelRefusal, CheckRefusal)

}  // namespace
}  // namespace satdar::model
