#include "worker/cuda_engine.h"

#include "absl/strings/str_cat.h"
#include "model/device_model.h"
#include "settings/train_settings.h"
#include "worker/mfu.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/device_vec.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/cuda/workspace.h"
#include "core/exec.h"
#include "core/ops/adamw.h"
#include "core/ops/elementwise.h"
#include "worker/gradient_sync.h"
#include "worker/mesh_groups.h"
#include "worker/stats_merge.h"
#include "worker/train_state.h"
#include "worker/zero_partition.h"
#endif

namespace satdar::worker {

#ifndef SATDAR_WITH_CUDA

absl::Status CheckCudaEngine(const TrainOptions& options) {
  (void)options;
  return absl::FailedPreconditionError(
      "device cuda: this satdar was built without CUDA (no nvcc at build time)");
}

absl::StatusOr<std::unique_ptr<StepEngine>> CreateCudaEngine(const TrainOptions& options,
                                                             MeshGroups* groups) {
  (void)groups;
  SATDAR_RETURN_IF_ERROR(CheckCudaEngine(options));
  return absl::InternalError("unreachable");
}

#else  // SATDAR_WITH_CUDA

namespace {

using Json = nlohmann::json;
namespace kc = ::satdar::core::cuda;

class CudaEngine : public StepEngine {
 public:
  CudaEngine(const TrainOptions& o, MeshGroups* g)
      : o_(o), rank_(g->rank), world_size_(g->shape.size()), shape_(g->shape), host_(g),
        world_(o.gpu.world),
        zero_(o.zero_stage == 1 && g->data_size() > 1) {
    copts_.timeout = absl::Seconds(o_.comm_timeout_seconds);
  }
  ~CudaEngine() override { Abandon(); }

  absl::Status Init();

  const model::ParamTable& params() const override { return model_->params(); }
  std::string Describe() const override;
  std::string Where() const override { return absl::StrCat("cuda:", device_); }

  absl::StatusOr<CheckpointInfo> Load(const std::string& path, const std::string& config_json,
                                      LoadWhat what) override {
    SATDAR_ASSIGN_OR_RETURN(
        CheckpointInfo info,
        state_->Load(path, config_json, what == LoadWhat::kWeightsOnly, params()));
    SATDAR_RETURN_IF_ERROR(model_->SetWeights(state_->params()));  // the compute copy
    return info;
  }
  absl::StatusOr<double> ForwardBackward(std::vector<std::vector<int32_t>>* micro) override;
  absl::StatusOr<double> GradNorm() override { return grad_norm_; }
  absl::Status Update(const core::AdamWParams& hp) override {
    SATDAR_RETURN_IF_ERROR(state_->Update(hp, shard_, nullptr, copts_));
    SATDAR_RETURN_IF_ERROR(model_->SetWeights(state_->params()));  // the bf16 compute copy
    // Step time includes the update (the next step's first kernels queue behind it).
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  absl::StatusOr<double> ValidationLoss(data::BatchSource* source, int batches) override;
  absl::Status AddToLog(Json* line) override {
    (*line)["mfu"] = Mfu((*line)["tokens_per_second"].get<double>());
    const core::cuda::AllocatorStats mem = alloc_.Stats();
    (*line)["peak_device_bytes"] = mem.peak_bytes;
    (*line)["device_bytes"] = {{"allocated", mem.current_bytes},
                               {"reserved", mem.reserved_bytes},
                               {"peak", mem.peak_bytes}};
    return absl::OkStatus();
  }
  // The model's statistics since the last call: each replica its own, its model-parallel
  // pieces (TP, EP) merged over the host's groups, as on the CPU.
  absl::Status AddStats(Json* line) override {
    Json s = Json::object();
    model_->AppendStats(&s);
    model_->ResetStats();
    if (host_->mp != nullptr) {
      SATDAR_ASSIGN_OR_RETURN(s, GatherStats(*host_, {s}, o_.sequence_parallel, copts_));
    }
    (*line)["stats"] = s;
    return absl::OkStatus();
  }
  absl::Status Save(const CheckpointInfo& info) override {
    // Replicas hold identical weights: replica 0's pieces are the whole state (as on the
    // CPU). Under ZeRO-1 every replica first hands its slice of the moments to the gather.
    const bool writer = host_->coord.dp == 0 && (host_->mp != nullptr || host_->coord.ep == 0);
    if (!zero_ && !writer) return absl::OkStatus();
    SATDAR_RETURN_IF_ERROR(state_->GatherMoments(copts_));  // the state read back
    absl::Status s;
    if (writer && host_->mp == nullptr) {
      s = SaveCheckpoint<float>(o_.checkpoint_dir, info, params(), state_->buffers());
    } else if (writer) {
      // Each model-parallel piece (TP slice, EP experts) writes its shard; the folder loads
      // into any layout.
      const std::string name =
          absl::StrCat("tp", host_->coord.tp, "-pp", host_->coord.pp, "-ep", host_->coord.ep);
      s = SaveShardedCheckpoint<float>(o_.checkpoint_dir, info, params(), state_->buffers(),
                                       name, host_->mp.get(), copts_);
    }
    state_->ReleaseMoments();  // the host copies were only needed for the file
    return s;
  }
  void AddToSummary(double tokens_per_second, Json* j, TrainSummary* out) override {
    out->peak_device_bytes = alloc_.Stats().peak_bytes;
    out->mfu = Mfu(tokens_per_second);
    (*j)["mfu"] = out->mfu;
    (*j)["peak_device_bytes"] = out->peak_device_bytes;
    (*j)["peak_memory_gib"] = out->peak_device_bytes / 1073741824.0;
    (*j)["activation_bytes"] = model_->activation_bytes();
    (*j)["device"] = kc::DeviceName(device_);
    (*j)["compute"] = o_.gpu.compute == core::DType::kBF16 ? "bf16" : "f32";
    (*j)["recompute"] = o_.gpu.recompute;
    (*j)["batch"] = {o_.batch_size, o_.seq_len};
  }
  void Abandon() override {
    if (sync_ != nullptr) sync_->Abandon();
  }

 private:
  // The execution context of the kernels this engine and its GradientSync launch (AdamW, the
  // reductions' packing and sums of squares; their scratch buffers from alloc_).
  core::CudaExec Exec() { return {stream_, nullptr, workspace_.get(), &alloc_}; }
  double PeakFlops() const override { return peak_flops_; }
  double Mfu(double tokens_per_second) const {
    return worker::Mfu(tokens_per_second, world_size_, flops_per_token_, peak_flops_);
  }
  const TrainOptions o_;
  const int rank_, world_size_;
  const comm::MeshShape shape_;  // the run's layout (dp x tp x ep on the GPU so far)
  const MeshGroups* const host_;  // the host's groups (checkpoints' coordination)
  comm::Communicator* const world_;  // device buffers; null alone
  const bool zero_;  // ZeRO-1: the moments sharded over the data-parallel replicas
  comm::CollectiveOptions copts_;
  int device_ = 0;
  kc::CachingAllocator alloc_;
  kc::Stream compute_;
  cudaStream_t stream_ = nullptr;
  // The compute stream's scratch (SumSquares); made with the stream, gone before it.
  std::unique_ptr<kc::Workspace> workspace_;
  std::unique_ptr<model::DeviceModel> model_;
  kc::DeviceVec<double> scalars_, eval_sum_;  // the step's loss; validation's (one each)
  // The device's mesh (split from world_; every group null alone) and the reductions between
  // the backward passes and AdamW over it (worker/gradient_sync.h, the CPU engine's class).
  MeshGroups groups_;
  std::unique_ptr<GradientSyncT<model::Cuda<float>>> sync_;
  // The fp32 master weights, gradients and AdamW moments (worker/train_state.h, the CPU
  // engine's class), laid out by params() (aligned tensors).
  std::unique_ptr<TrainStateT<model::Cuda<float>>> state_;
  kc::DeviceVec<float> shard_;  // ZeRO-1: this replica's slice of the averaged gradients
  double flops_per_token_ = 0, peak_flops_ = 0, grad_norm_ = 0;  // set by Init
  int64_t full_parameters_ = 0;  // the whole model's (every rank's piece together)
};

absl::Status CudaEngine::Init() {
  SATDAR_RETURN_IF_ERROR(CheckCudaEngine(o_));
  const int devices = kc::DeviceCount();
  if (devices == 0) return absl::FailedPreconditionError("device cuda: no CUDA GPU on this machine");
  device_ = o_.gpu.device >= 0 ? o_.gpu.device : rank_ % devices;
  if (device_ >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("device cuda:", device_, ": this machine has ",
                                                   devices, " GPU(s)"));
  }
  if (world_size_ > 1 && world_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, ": data parallelism on the GPU needs a device communicator (NCCL or "
        "host staging) for its ", world_size_, " ranks"));
  }
  SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  kc::SetErrorRank(world_size_ > 1 ? rank_ : -1);
  SATDAR_ASSIGN_OR_RETURN(compute_, kc::Stream::Create());
  stream_ = compute_.get();
  workspace_ = std::make_unique<kc::Workspace>(&alloc_, stream_);
  // The device's communicators, split from the device world as the host's are from theirs.
  SATDAR_ASSIGN_OR_RETURN(groups_, BuildMeshGroups(world_, shape_, copts_));
  model::DeviceModelOptions mo;
  mo.compute = o_.gpu.compute;
  mo.shard.tp = groups_.tp.get();
  mo.shard.tp_rank = groups_.coord.tp;
  mo.shard.tp_size = shape_.tp;
  mo.shard.sequence_parallel = o_.sequence_parallel;
  mo.shard.ep = groups_.ep.get();
  mo.shard.ep_rank = groups_.coord.ep;
  mo.shard.ep_size = shape_.ep;
  mo.shard.vocab_multiple = o_.vocab_multiple;
  mo.shard.recompute = o_.gpu.recompute ? model::Recompute::kFull : model::Recompute::kNone;
  mo.shard.collective = copts_;
  SATDAR_ASSIGN_OR_RETURN(model_, model::DeviceModel::Create(o_.config, mo, stream_, &alloc_));
  model_->SetStatsEnabled(o_.stats_every > 0);
  const model::ParamTable& table = model_->params();  // aligned: model::kDeviceParamAlign
  // ZeRO-1: the CPU engine's partitions (without expert parallelism one, the whole padded
  // buffer over the data-parallel replicas; with it the dense weights over dp x ep and the
  // experts over dp).
  std::vector<ZeroPartition> parts;
  if (zero_) {
    const model::ParamRoles roles = RolesOf(table, groups_, o_.config.tie_word_embeddings);
    parts = ZeroPartitions(roles.dense, roles.experts, groups_);
  }
  sync_ = std::make_unique<GradientSyncT<model::Cuda<float>>>(table, &groups_, o_.config, parts,
                                                               copts_, Exec());
  state_ = std::make_unique<TrainStateT<model::Cuda<float>>>(table, parts, o_.seed, Exec());
  SATDAR_RETURN_IF_ERROR(state_->status());
  SATDAR_RETURN_IF_ERROR(model::Allocate<model::Cuda<float>>(Exec(), [&] {
    scalars_.assign(1, 0.0);
    eval_sum_.assign(1, 0.0);
  }));
  SATDAR_RETURN_IF_ERROR(model_->SetWeights(state_->params()));
  // MFU and the description count the whole model (a rank's table is a shard under tp or ep).
  SATDAR_ASSIGN_OR_RETURN(const model::ParamTable whole,
                          model::BuildParamTable(o_.config, model::Sharding{}));
  full_parameters_ = whole.packed_size();
  flops_per_token_ = model::FlopsPerToken(full_parameters_, o_.config, o_.seq_len);
  // --peak-tflops 0: the GPU's own peak from the table, H100/H200's when it is not listed.
  const double listed = GpuPeakFlops(kc::DeviceName(device_));
  peak_flops_ = o_.peak_tflops > 0 ? o_.peak_tflops * 1e12 : listed > 0 ? listed : 989e12;
  return absl::OkStatus();
}

std::string CudaEngine::Describe() const {
  return absl::StrFormat(
      "model: %s residual, %s gate, %lld parameters on %s (cuda:%d), %s compute, fp32 master "
      "weights%s; batch %d x %d tokens x %d replica(s)%s%s, %d micro-batch(es)",
      model::Name(o_.config.residual), model::Name(o_.config.value_residual),
      static_cast<long long>(full_parameters_), kc::DeviceName(device_), device_,
      o_.gpu.compute == core::DType::kBF16 ? "bf16" : "f32",
      o_.gpu.recompute ? ", activation recomputation" : "", o_.batch_size, o_.seq_len,
      world_size_, world_size_ > 1 ? absl::StrCat(" over ", o_.gpu.world_kind) : "",
      zero_ ? ", ZeRO-1 (moments sharded over the replicas)" : "",
      o_.microbatches);
}

absl::StatusOr<double> CudaEngine::ForwardBackward(std::vector<std::vector<int32_t>>* micro) {
  SATDAR_RETURN_IF_ERROR(state_->ZeroGrads());
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scalars_.data(), 0, sizeof(double), stream_));
  float* grads = state_->grads();
  const int mb_size = o_.batch_size / o_.microbatches;
  for (int mb = 0; mb < o_.microbatches; ++mb) {
    SATDAR_RETURN_IF_ERROR(model_->Forward((*micro)[mb].data(), mb_size, o_.seq_len,
                                           1.0 / o_.microbatches, scalars_.data()));
    // The last backward pass all-reduces each layer's gradients as it finishes them (not
    // under ZeRO-1, which reduce-scatters afterwards).
    const bool last = mb + 1 == o_.microbatches;
    if (last) sync_->BeginLastBackward(model_.get(), grads);
    SATDAR_RETURN_IF_ERROR(model_->Backward(grads));
    if (last) sync_->EndLastBackward(model_.get(), grads);
  }
  // The loss (read back: the step's one wait for the compute stream besides the norm's),
  // averaged over the replicas; then the gradients (under ZeRO-1 this replica's slice of the
  // averages in shard_) and their global norm, as on the CPU.
  double loss = 0;
  SATDAR_RETURN_IF_ERROR(core::ops::Download(Exec(), &loss, scalars_.data(), 1));
  SATDAR_ASSIGN_OR_RETURN(loss, sync_->ReduceLoss(loss));
  SATDAR_RETURN_IF_ERROR(sync_->Reduce(grads, &shard_));
  SATDAR_ASSIGN_OR_RETURN(grad_norm_, sync_->GlobalNorm(zero_ ? shard_.data() : grads));
  return loss;
}

// As the CPU engine's: micro-batch sized, the same on every replica.
absl::StatusOr<double> CudaEngine::ValidationLoss(data::BatchSource* source, int batches) {
  const int b = o_.batch_size / o_.microbatches;
  std::vector<int32_t> tokens(static_cast<size_t>(b) * (o_.seq_len + 1));
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(eval_sum_.data(), 0, sizeof(double), stream_));
  for (int i = 0; i < batches; ++i) {
    source->Batch(0, 0, static_cast<int64_t>(i) * b, b, o_.seq_len, tokens.data());
    SATDAR_RETURN_IF_ERROR(model_->Evaluate(tokens.data(), b, o_.seq_len, eval_sum_.data()));
  }
  double sum = 0;
  SATDAR_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&sum, eval_sum_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return sum / batches;
}

}  // namespace

absl::Status CheckCudaEngine(const TrainOptions& o) {
  // The options (`satdar train` and the coordinator check them first, in their words), then
  // the design.
  SATDAR_RETURN_IF_ERROR(settings::CheckGpuPathOptions(o, settings::Spelling::kFields));
  return model::CheckDeviceSupport(o.config, o.mesh.tp);
}

absl::StatusOr<std::unique_ptr<StepEngine>> CreateCudaEngine(const TrainOptions& options,
                                                             MeshGroups* groups) {
  auto engine = std::make_unique<CudaEngine>(options, groups);
  SATDAR_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<StepEngine>(std::move(engine));
}

#endif  // SATDAR_WITH_CUDA

}  // namespace satdar::worker
