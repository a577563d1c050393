#include "model/device_model.h"

#include <utility>

#include "absl/strings/str_cat.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "core/cuda/allocator.h"
#include "core/cuda/device_vec.h"
#include "core/cuda/runtime.h"
#include "core/cuda/workspace.h"
#include "core/exec.h"
#include "core/ops/elementwise.h"
#include "core/ops/gemm_cuda.h"
#include "model/decoder.h"
#include "model/ops.h"
#endif

namespace satdar::model {

#ifndef SATDAR_WITH_CUDA

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Create(
    const ModelConfig& config, const DeviceModelOptions& options, CUstream_st* stream,
    core::cuda::CachingAllocator* alloc) {
  (void)config, (void)options, (void)stream, (void)alloc;
  return absl::FailedPreconditionError("this satdar was built without CUDA");
}

#else  // SATDAR_WITH_CUDA

namespace {

namespace kc = ::satdar::core::cuda;

// DecoderModelT<Cuda<E>> behind DeviceModel. Owns the execution context's GEMM handle and
// workspace (declared before the model, so they outlive it) and the bf16 compute copy.
template <typename E>
class DecoderDeviceModel : public DeviceModel {
 public:
  using B = Cuda<E>;

  DecoderDeviceModel(CUstream_st* stream, kc::CachingAllocator* alloc,
                     std::unique_ptr<kc::GemmHandle> gemm)
      : alloc_(alloc), workspace_(alloc, stream), gemm_(std::move(gemm)),
        x_{stream, gemm_.get(), &workspace_, alloc} {}
  // Work still enqueued uses the GEMM handle and the buffers about to go.
  ~DecoderDeviceModel() override { (void)cudaStreamSynchronize(x_.stream); }

  absl::Status Init(const ModelConfig& config, const DeviceModelOptions& options) {
    Sharding shard = options.shard;
    shard.on_device = true;  // TP collectives wait for this stream's work
    shard.stream = x_.stream;
    shard.errors = &errors_;
    SATDAR_ASSIGN_OR_RETURN(model_, CreateDeviceModel<B>(config, shard, x_));
    // Off until asked for: gathering them waits for the stream at every layer.
    model_->SetStatsEnabled(false);
    return absl::OkStatus();
  }

  const ParamTable& params() const override { return model_->params(); }
  const ModelConfig& config() const override { return model_->config(); }

  absl::Status SetWeights(const float* master) override {
    if (master == nullptr) return absl::InvalidArgumentError("SetWeights: no master weights");
    const int64_t n = model_->params().size();
    if constexpr (std::is_same_v<E, float>) {
      w_ = Weights<B>{master, master};
    } else {
      kc::AllocScope scope(x_);
      compute_.resize(static_cast<size_t>(n));
      SATDAR_RETURN_IF_ERROR(scope.status());
      SATDAR_RETURN_IF_ERROR(ops::CastFromF32(x_, compute_.data(), master, n));
      w_ = Weights<B>{compute_.data(), master};
    }
    return absl::OkStatus();
  }

  absl::Status Forward(const int32_t* tokens, int b, int t, double loss_scale,
                       double* loss_acc) override {
    return Pass(tokens, b, t, {loss_acc, loss_scale, /*train=*/true});
  }

  absl::Status Evaluate(const int32_t* tokens, int b, int t, double* ce_acc) override {
    return Pass(tokens, b, t, {ce_acc, 1.0, /*train=*/false});
  }

  absl::Status Backward(float* grads) override {
    if (grads == nullptr) return absl::InvalidArgumentError("Backward: no gradient buffer");
    const int64_t before = alloc_->Stats().current_bytes;
    // The cross-entropy's gradient (loss_scale included) came with the forward; loss_scale
    // here scales the auxiliary losses' gradients.
    const absl::Status status = model_->Backward(w_, grads, loss_scale_);
    held_ += alloc_->Stats().current_bytes - before;
    return status;
  }

  void SetLayerGradientsReadyHook(std::function<void(int)> hook) override {
    model_->SetLayerGradientsReadyHook(std::move(hook));
  }

  int64_t activation_bytes() const override { return held_; }
  void SetStatsEnabled(bool on) override { model_->SetStatsEnabled(on); }
  void AppendStats(nlohmann::json* stats) const override { model_->AppendStats(stats); }
  void ResetStats() override { model_->ResetStats(); }

 private:
  absl::Status Pass(const int32_t* tokens, int b, int t,
                    const typename DecoderModelT<B>::LossSink& sink) {
    if (w_.master == nullptr) {
      return absl::FailedPreconditionError("the device model's forward pass before SetWeights");
    }
    if (sink.acc == nullptr) return absl::InvalidArgumentError("forward pass: no loss buffer");
    loss_scale_ = sink.scale;
    const int64_t before = alloc_->Stats().current_bytes;
    const absl::Status status = model_->ForwardAccumulate(w_, tokens, b, t, sink);
    held_ += alloc_->Stats().current_bytes - before;
    return status;
  }

  kc::CachingAllocator* const alloc_;
  kc::Workspace workspace_;
  std::unique_ptr<kc::GemmHandle> gemm_;
  const core::CudaExec x_;
  CommErrors errors_;  // the first failed collective of a pass (returned by it)
  kc::DeviceVec<E> compute_;  // bf16: the compute copy of the master weights
  std::unique_ptr<DecoderModelT<B>> model_;
  Weights<B> w_{nullptr, nullptr};
  double loss_scale_ = 1.0;
  // The allocator's bytes the model's passes took and kept (its activations, pointer lists and
  // the ops' scratch): every (B, T) buffer is allocated inside Forward and Backward.
  int64_t held_ = 0;
};

template <typename E>
absl::StatusOr<std::unique_ptr<DeviceModel>> Make(const ModelConfig& config,
                                                  const DeviceModelOptions& options,
                                                  CUstream_st* stream,
                                                  kc::CachingAllocator* alloc) {
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<kc::GemmHandle> gemm, kc::GemmHandle::Create(stream));
  auto m = std::make_unique<DecoderDeviceModel<E>>(stream, alloc, std::move(gemm));
  SATDAR_RETURN_IF_ERROR(m->Init(config, options));
  return std::unique_ptr<DeviceModel>(std::move(m));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Create(
    const ModelConfig& config, const DeviceModelOptions& options, CUstream_st* stream,
    core::cuda::CachingAllocator* alloc) {
  SATDAR_RETURN_IF_ERROR(CheckDeviceSupport(config, options.shard.tp_size));
  if (core::cuda::DeviceCount() == 0) {
    return absl::FailedPreconditionError("device cuda: no CUDA GPU on this machine");
  }
  if (alloc == nullptr) return absl::InvalidArgumentError("device model: no allocator");
  switch (options.compute) {
    case core::DType::kF32:
      return Make<float>(config, options, stream, alloc);
    case core::DType::kBF16:
      return Make<__nv_bfloat16>(config, options, stream, alloc);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "device model: compute dtype ", core::DTypeName(options.compute),
          " is not bf16 or f32"));
  }
}

#endif  // SATDAR_WITH_CUDA

}  // namespace satdar::model
