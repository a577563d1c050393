#include "runtime/decode_session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/device.h"
#include "core/ops/gemm.h"
#include "core/thread_pool.h"
#include "model/device_model.h"
#include "model/model.h"
#include "runtime/weights.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/device_vec.h"
#include "core/cuda/stream.h"
#include "core/exec.h"
#include "core/ops/elementwise.h"
#include "model/backend.h"
#endif

namespace satdar::runtime {

namespace {

absl::Status NoGates(const model::ModelConfig& config) {
  return absl::InvalidArgumentError(absl::StrCat(
      "gate_ablation: the config has value_residual \"", model::Name(config.value_residual),
      "\"; gates exist only with \"satformer\""));
}

// The CPU model in T (float or double) over its own copy of the weights.
template <typename T>
class CpuSession : public DecodeSession {
 public:
  explicit CpuSession(int threads) : pool_(threads) {}

  absl::Status Init(const model::ModelConfig& config) {
    core::cpu::InitBlas();
    SATDAR_ASSIGN_OR_RETURN(model_, model::CreateModel<T>(config, &pool_));
    model_->SetStatsEnabled(false);
    return absl::OkStatus();
  }
  const model::ParamTable& table() const { return model_->params(); }
  std::vector<T>* params() { return &params_; }

  const model::ModelConfig& config() const override { return model_->config(); }
  absl::Status Begin(int b, int capacity) override { return model_->BeginDecode(b, capacity); }
  absl::Status Step(const int32_t* tokens, int b, int tn, bool all_rows,
                    std::vector<double>* logits) override {
    return model_->DecodeStep(params_.data(), tokens, b, tn, all_rows, logits);
  }
  bool SetGateAblation(model::GateAblation mode) override {
    return model_->SetGateAblation(mode);
  }
  void SetStatsEnabled(bool on) override { model_->SetStatsEnabled(on); }
  void ResetStats() override { model_->ResetStats(); }

 private:
  core::ThreadPool pool_;
  std::unique_ptr<model::Model<T>> model_;
  std::vector<T> params_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<DecodeSession>> CreateCpu(const DecodeOptions& o) {
  auto s = std::make_unique<CpuSession<T>>(o.threads);
  SATDAR_RETURN_IF_ERROR(s->Init(o.config));
  SATDAR_RETURN_IF_ERROR(LoadModelWeights<T>(o.weights, o.checkpoint, s->table(),
                                             model::ModelConfigToJson(o.config), s->params()));
  if (o.gate_ablation != model::GateAblation::kNone && !s->SetGateAblation(o.gate_ablation)) {
    return NoGates(o.config);
  }
  return std::unique_ptr<DecodeSession>(std::move(s));
}

template <typename T>
absl::StatusOr<std::unique_ptr<DecodeSession>> FromParamsTyped(const model::ModelConfig& config,
                                                               std::vector<T> params,
                                                               int threads) {
  auto s = std::make_unique<CpuSession<T>>(threads);
  SATDAR_RETURN_IF_ERROR(s->Init(config));
  if (static_cast<int64_t>(params.size()) != s->table().size()) {
    return absl::InvalidArgumentError(absl::StrCat("params: ", params.size(),
                                                   " values; the config's parameter table has ",
                                                   s->table().size()));
  }
  *s->params() = std::move(params);
  return std::unique_ptr<DecodeSession>(std::move(s));
}

#ifdef SATDAR_WITH_CUDA

namespace kc = ::satdar::core::cuda;

// The device model (bf16 or f32 compute) over fp32 master weights on its own stream. Members
// go in reverse order: the model and its weights before the stream and the allocator.
class CudaSession : public DecodeSession {
 public:
  absl::Status Init(const DecodeOptions& o, int device) {
    SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    SATDAR_ASSIGN_OR_RETURN(stream_, kc::Stream::Create());
    model::DeviceModelOptions mo;
    mo.compute = o.dtype;
    SATDAR_ASSIGN_OR_RETURN(model_,
                            model::DeviceModel::Create(o.config, mo, stream_.get(), &alloc_));
    model_->SetStatsEnabled(false);
    // The host copy laid out by the device's table (every tensor at kDeviceParamAlign).
    std::vector<float> host;
    SATDAR_RETURN_IF_ERROR(LoadModelWeights<float>(o.weights, o.checkpoint, model_->params(),
                                                   model::ModelConfigToJson(o.config), &host));
    const core::CudaExec x{stream_.get(), nullptr, nullptr, &alloc_};
    SATDAR_RETURN_IF_ERROR(
        model::Allocate<model::Cuda<float>>(x, [&] { master_.resize(host.size()); }));
    SATDAR_RETURN_IF_ERROR(core::ops::Upload(x, master_.data(), host.data(),
                                             static_cast<int64_t>(host.size())));
    SATDAR_RETURN_IF_ERROR(model_->SetWeights(master_.data()));
    SATDAR_RETURN_IF_ERROR(core::ops::Synchronize(x));
    if (o.gate_ablation != model::GateAblation::kNone && !SetGateAblation(o.gate_ablation)) {
      return NoGates(o.config);
    }
    return absl::OkStatus();
  }

  const model::ModelConfig& config() const override { return model_->config(); }
  absl::Status Begin(int b, int capacity) override { return model_->BeginDecode(b, capacity); }
  absl::Status Step(const int32_t* tokens, int b, int tn, bool all_rows,
                    std::vector<double>* logits) override {
    return model_->DecodeStep(tokens, b, tn, all_rows, logits);
  }
  bool SetGateAblation(model::GateAblation mode) override {
    return model_->SetGateAblation(mode);
  }
  void SetStatsEnabled(bool on) override { model_->SetStatsEnabled(on); }
  void ResetStats() override { model_->ResetStats(); }

 private:
  kc::CachingAllocator alloc_;
  kc::Stream stream_;
  kc::DeviceVec<float> master_;
  std::unique_ptr<model::DeviceModel> model_;
};

#endif  // SATDAR_WITH_CUDA

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeSession>> DecodeSession::Create(const DecodeOptions& o) {
  if (o.weights.empty() == o.checkpoint.empty()) {
    return absl::InvalidArgumentError("weights, checkpoint: give exactly one of the two");
  }
  if (o.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads: ", o.threads, " (at least 1)"));
  }
  SATDAR_ASSIGN_OR_RETURN(const core::Device device, core::ParseDevice(o.device));
  SATDAR_RETURN_IF_ERROR(core::CheckDeviceAvailable(device));
  if (device.type == core::DeviceType::kCpu) {
    if (o.dtype == core::DType::kF32) return CreateCpu<float>(o);
    if (o.dtype == core::DType::kF64) return CreateCpu<double>(o);
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype: the CPU computes in f32 or f64, not ", core::DTypeName(o.dtype)));
  }
  if (o.dtype != core::DType::kF32 && o.dtype != core::DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype: device ", device.ToString(), " computes in bf16 or f32, not ",
        core::DTypeName(o.dtype)));
  }
#ifdef SATDAR_WITH_CUDA
  auto s = std::make_unique<CudaSession>();
  SATDAR_RETURN_IF_ERROR(s->Init(o, device.index));
  return std::unique_ptr<DecodeSession>(std::move(s));
#else
  return absl::FailedPreconditionError(
      "device cuda: this satdar was built without CUDA (no nvcc at build time)");
#endif
}

absl::StatusOr<std::unique_ptr<DecodeSession>> DecodeSession::FromParams(
    const model::ModelConfig& config, std::vector<float> params, int threads) {
  return FromParamsTyped<float>(config, std::move(params), threads);
}

absl::StatusOr<std::unique_ptr<DecodeSession>> DecodeSession::FromParams(
    const model::ModelConfig& config, std::vector<double> params, int threads) {
  return FromParamsTyped<double>(config, std::move(params), threads);
}

}  // namespace satdar::runtime
