#include "model/device_model.h"

#include <utility>

#include "absl/strings/str_cat.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
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

// What every instance of one model shares: the execution context (GEMM handle, workspace),
// the weights and the bf16 compute copy. Declared so that the handle and workspace outlive the
// context that points to them.
template <typename E>
struct SharedContext {
  using B = Cuda<E>;
  SharedContext(CUstream_st* stream, kc::CachingAllocator* a, std::unique_ptr<kc::GemmHandle> g,
                const ModelConfig& c, const DeviceModelOptions& o)
      : workspace(a, stream), gemm(std::move(g)), x{stream, gemm.get(), &workspace, a},
        config(c), options(o) {}
  kc::Workspace workspace;
  std::unique_ptr<kc::GemmHandle> gemm;
  const core::CudaExec x;
  const ModelConfig config;
  const DeviceModelOptions options;
  kc::DeviceVec<E> compute;  // bf16: the compute copy of the master weights
  Weights<B> w{nullptr, nullptr};
  bool stats = false;  // SetStatsEnabled's switch, for new instances
};

// DecoderModelT<Cuda<E>> behind DeviceModel: one instance (its activations, boundary buffers
// and the first failed collective of a pass) over a context shared with its siblings.
template <typename E>
class DecoderDeviceModel : public DeviceModel {
 public:
  using B = Cuda<E>;

  explicit DecoderDeviceModel(std::shared_ptr<SharedContext<E>> ctx) : ctx_(std::move(ctx)) {}
  // Work still enqueued uses the buffers about to go (and, for the last instance, the GEMM
  // handle and workspace).
  ~DecoderDeviceModel() override { (void)cudaStreamSynchronize(ctx_->x.stream); }

  absl::Status Init() {
    Sharding shard = ctx_->options.shard;
    shard.on_device = true;  // TP collectives wait for this stream's work
    shard.stream = ctx_->x.stream;
    shard.errors = &errors_;
    SATDAR_ASSIGN_OR_RETURN(model_, CreateDeviceModel<B>(ctx_->config, shard, ctx_->x));
    // Off until asked for (device accumulators, one small kernel per layer; read back by
    // AppendStats).
    model_->SetStatsEnabled(ctx_->stats);
    return absl::OkStatus();
  }

  const ParamTable& params() const override { return model_->params(); }
  const ModelConfig& config() const override { return model_->config(); }

  absl::Status SetWeights(const float* master) override {
    if (master == nullptr) return absl::InvalidArgumentError("SetWeights: no master weights");
    const int64_t n = model_->params().size();
    if constexpr (std::is_same_v<E, float>) {
      ctx_->w = Weights<B>{master, master};
    } else {
      kc::AllocScope scope(ctx_->x);
      ctx_->compute.resize(static_cast<size_t>(n));
      SATDAR_RETURN_IF_ERROR(scope.status());
      SATDAR_RETURN_IF_ERROR(ops::CastFromF32(ctx_->x, ctx_->compute.data(), master, n));
      ctx_->w = Weights<B>{ctx_->compute.data(), master};
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<DeviceModel>> NewInstance() override {
    auto m = std::make_unique<DecoderDeviceModel<E>>(ctx_);
    SATDAR_RETURN_IF_ERROR(m->Init());
    return std::unique_ptr<DeviceModel>(std::move(m));
  }

  absl::StatusOr<StageViews> PrepareStage(int b, int t) override {
    const int64_t before = ctx_->x.alloc->Stats().current_bytes;
    absl::StatusOr<StageBuffersT<B>*> stage = model_->PrepareStageOrError(b, t);
    held_ += ctx_->x.alloc->Stats().current_bytes - before;
    if (!stage.ok()) return stage.status();
    return ViewsOf(*stage, ctx_->options.compute);
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
    const int64_t before = ctx_->x.alloc->Stats().current_bytes;
    // The cross-entropy's gradient (loss_scale included) came with the forward; loss_scale
    // here scales the auxiliary losses' gradients.
    const absl::Status status = model_->Backward(ctx_->w, grads, loss_scale_);
    held_ += ctx_->x.alloc->Stats().current_bytes - before;
    return status;
  }

  void SetLayerGradientsReadyHook(std::function<void(int)> hook) override {
    model_->SetLayerGradientsReadyHook(std::move(hook));
  }

  int64_t activation_bytes() const override { return held_; }
  void SetStatsEnabled(bool on) override {
    ctx_->stats = on;
    model_->SetStatsEnabled(on);
  }
  void AppendStats(nlohmann::json* stats) const override { model_->AppendStats(stats); }
  void ResetStats() override { model_->ResetStats(); }
  // This instance's (each keeps its own value residual).
  bool SetGateAblation(GateAblation mode) override { return model_->SetGateAblation(mode); }

  absl::Status BeginDecode(int b, int capacity) override {
    const int64_t before = ctx_->x.alloc->Stats().current_bytes;
    const absl::Status status = model_->BeginDecode(b, capacity);
    held_ += ctx_->x.alloc->Stats().current_bytes - before;
    return status;
  }

  absl::Status DecodeStep(const int32_t* tokens, int b, int tn, bool all_rows,
                          std::vector<double>* logits) override {
    if (ctx_->w.master == nullptr) {
      return absl::FailedPreconditionError("the device model's decode step before SetWeights");
    }
    const int64_t before = ctx_->x.alloc->Stats().current_bytes;
    const absl::Status status = model_->DecodeStep(ctx_->w, tokens, b, tn, all_rows, logits);
    held_ += ctx_->x.alloc->Stats().current_bytes - before;
    return status;
  }

 private:
  absl::Status Pass(const int32_t* tokens, int b, int t,
                    const typename DecoderModelT<B>::LossSink& sink) {
    if (ctx_->w.master == nullptr) {
      return absl::FailedPreconditionError("the device model's forward pass before SetWeights");
    }
    if (sink.acc == nullptr) return absl::InvalidArgumentError("forward pass: no loss buffer");
    loss_scale_ = sink.scale;
    const int64_t before = ctx_->x.alloc->Stats().current_bytes;
    const absl::Status status = model_->ForwardAccumulate(ctx_->w, tokens, b, t, sink);
    held_ += ctx_->x.alloc->Stats().current_bytes - before;
    return status;
  }

  const std::shared_ptr<SharedContext<E>> ctx_;
  CommErrors errors_;  // the first failed collective of a pass (returned by it)
  std::unique_ptr<DecoderModelT<B>> model_;
  double loss_scale_ = 1.0;
  // The allocator's bytes this instance's passes took and kept (its activations, boundary
  // buffers, pointer lists and the ops' scratch): every (B, T) buffer is allocated inside
  // PrepareStage, Forward and Backward.
  int64_t held_ = 0;
};

template <typename E>
absl::StatusOr<std::unique_ptr<DeviceModel>> Make(const ModelConfig& config,
                                                  const DeviceModelOptions& options,
                                                  CUstream_st* stream,
                                                  kc::CachingAllocator* alloc) {
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<kc::GemmHandle> gemm, kc::GemmHandle::Create(stream));
  auto ctx =
      std::make_shared<SharedContext<E>>(stream, alloc, std::move(gemm), config, options);
  auto m = std::make_unique<DecoderDeviceModel<E>>(std::move(ctx));
  SATDAR_RETURN_IF_ERROR(m->Init());
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
