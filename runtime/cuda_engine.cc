#include "runtime/cuda_engine.h"

#include "absl/strings/str_cat.h"
#include "model/device_model.h"
#include "settings/train_settings.h"
#include "runtime/mfu.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

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
#include "parallel/pipeline.h"
#include "runtime/gradient_sync.h"
#include "runtime/mesh_groups.h"
#include "runtime/stats_merge.h"
#include "runtime/train_state.h"
#include "runtime/zero_partition.h"
#endif

namespace satdar::runtime {

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
using TrainStateCuda = TrainStateT<model::Cuda<float>>;

// One model instance of a pipeline chunk (parallel/pipeline.h): its parameters and gradients
// are the chunk's slice of the rank's flat device buffers; its losses go to the engine's device
// accumulators, so the schedule's sums are 0 here.
class CudaStage : public parallel::PipelineStage {
 public:
  CudaStage(model::DeviceModel* m, TrainStateCuda* state, int64_t offset, double* loss,
            double* eval, cudaStream_t stream)
      : m_(m), state_(state), offset_(offset), loss_(loss), eval_(eval), stream_(stream) {}
  absl::StatusOr<model::StageViews> Prepare(int b, int t) override {
    return m_->PrepareStage(b, t);
  }
  absl::StatusOr<double> Forward(const int32_t* tokens, int b, int t,
                                 double loss_scale) override {
    SATDAR_RETURN_IF_ERROR(m_->Forward(tokens, b, t, loss_scale, loss_));
    return 0.0;
  }
  absl::StatusOr<double> Evaluate(const int32_t* tokens, int b, int t) override {
    SATDAR_RETURN_IF_ERROR(m_->Evaluate(tokens, b, t, eval_));
    return 0.0;
  }
  absl::Status Backward(double loss_scale) override {
    (void)loss_scale;  // the device model took it at Forward
    return m_->Backward(state_->grads() + offset_);
  }
  absl::Status Synchronize() override {
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  model::DeviceModel* const m_;
  TrainStateCuda* const state_;
  const int64_t offset_;
  double* const loss_;  // device fp64: the step's loss
  double* const eval_;  // device fp64: validation's cross-entropy
  const cudaStream_t stream_;
};

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

  // The rank's parameters: its model's, or with virtual stages its chunks' back to back.
  const model::ParamTable& params() const override {
    return chunks_.size() > 1 ? combined_ : model_->params();
  }
  std::string Describe() const override;
  std::string Where() const override { return absl::StrCat("cuda:", device_); }

  absl::StatusOr<CheckpointInfo> Load(const std::string& path, const std::string& config_json,
                                      LoadWhat what) override {
    SATDAR_ASSIGN_OR_RETURN(
        CheckpointInfo info,
        state_->Load(path, config_json, what == LoadWhat::kWeightsOnly, params()));
    SATDAR_RETURN_IF_ERROR(SetWeights());  // the compute copies
    return info;
  }
  absl::StatusOr<double> ForwardBackward(std::vector<std::vector<int32_t>>* micro) override;
  absl::StatusOr<double> GradNorm() override { return grad_norm_; }
  absl::Status Update(const core::AdamWParams& hp) override {
    SATDAR_RETURN_IF_ERROR(state_->Update(hp, shard_, nullptr, copts_));
    SATDAR_RETURN_IF_ERROR(SetWeights());  // the bf16 compute copies
    // Step time includes the update (the next step's first kernels queue behind it).
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  absl::StatusOr<double> ValidationLoss(data::BatchSource* source, int batches) override;
  absl::Status AddToLog(Json* line) override {
    if (pipeline_ != nullptr) {
      // Bytes each (virtual) stage boundary carried this step, in stage order: [activations
      // forward, gradients back] (gathered over the host's pipeline group).
      SATDAR_ASSIGN_OR_RETURN(const auto carried,
                              parallel::BoundaryBytes(*pipeline_, host_->pp.get(), copts_));
      Json boundaries = Json::array();
      for (const auto& [fwd, bwd] : carried) boundaries.push_back({fwd, bwd});
      (*line)["pp_boundary_bytes"] = boundaries;
    }
    (*line)["mfu"] = Mfu((*line)["tokens_per_second"].get<double>());
    const core::cuda::AllocatorStats mem = alloc_.Stats();
    (*line)["peak_device_bytes"] = mem.peak_bytes;
    (*line)["device_bytes"] = {{"allocated", mem.current_bytes},
                               {"reserved", mem.reserved_bytes},
                               {"peak", mem.peak_bytes}};
    return absl::OkStatus();
  }
  // The model's statistics since the last call: each replica its own, its chunks' instances
  // merged, its model-parallel pieces (TP, PP, EP) over the host's groups, as on the CPU.
  absl::Status AddStats(Json* line) override {
    std::vector<Json> per_chunk;
    for (auto& models : chunks_) {
      std::vector<model::DeviceModel*> instances;
      for (auto& m : models) instances.push_back(m.get());
      per_chunk.push_back(TakeChunkStats(instances, o_.microbatches));
    }
    Json s = per_chunk[0];
    if (host_->mp != nullptr) {
      SATDAR_ASSIGN_OR_RETURN(s, GatherStats(*host_, per_chunk, o_.sequence_parallel, copts_));
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
    int64_t activations = 0;
    for (auto& models : chunks_) {
      for (auto& m : models) activations += m->activation_bytes();
    }
    (*j)["activation_bytes"] = activations;
    (*j)["device"] = kc::DeviceName(device_);
    (*j)["compute"] = o_.gpu.compute == core::DType::kBF16 ? "bf16" : "f32";
    (*j)["recompute"] = o_.gpu.recompute;
    (*j)["batch"] = {o_.batch_size, o_.seq_len};
  }
  void Abandon() override {
    if (pipeline_ != nullptr) pipeline_->Abandon();
    if (sync_ != nullptr) sync_->Abandon();
  }

 private:
  // The execution context of the kernels this engine and its GradientSync launch (AdamW, the
  // reductions' packing and sums of squares; their scratch buffers from alloc_).
  core::CudaExec Exec() { return {stream_, nullptr, workspace_.get(), &alloc_}; }
  // The models' compute weights from the master weights (each chunk's slice); after every
  // change of the master weights.
  absl::Status SetWeights() {
    for (size_t c = 0; c < chunks_.size(); ++c) {
      SATDAR_RETURN_IF_ERROR(chunks_[c][0]->SetWeights(state_->params() + offsets_[c]));
    }
    return absl::OkStatus();
  }
  absl::Status BuildModels();
  absl::Status LocalForwardBackward(const std::vector<std::vector<int32_t>>& micro,
                                    float* grads, int mb_size);
  double PeakFlops() const override { return peak_flops_; }
  double Mfu(double tokens_per_second) const {
    return runtime::Mfu(tokens_per_second, world_size_, flops_per_token_, peak_flops_);
  }
  const TrainOptions o_;
  const int rank_, world_size_;
  const comm::MeshShape shape_;  // the run's layout
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
  // Per chunk (one, or --virtual-stages), one model instance per micro-batch in flight
  // (1F1B); model_ is the first.
  std::vector<std::vector<std::unique_ptr<model::DeviceModel>>> chunks_;
  model::DeviceModel* model_ = nullptr;
  model::ParamTable combined_{model::kDeviceParamAlign};  // virtual stages: back to back
  std::vector<int64_t> offsets_;  // where each chunk's parameters start in the flat buffers
  // Pipeline stages: the schedule over every instance, with the stream's waits.
  std::vector<std::unique_ptr<CudaStage>> stages_;
  std::unique_ptr<parallel::PipelineSchedule> pipeline_;
  kc::DeviceVec<double> scalars_, eval_sum_;  // the step's loss; validation's (one each)
  // The device's mesh (split from world_; every group null alone) and the reductions between
  // the backward passes and AdamW over it (runtime/gradient_sync.h, the CPU engine's class).
  MeshGroups groups_;
  std::unique_ptr<GradientSyncT<model::Cuda<float>>> sync_;
  // The fp32 master weights, gradients and AdamW moments (runtime/train_state.h, the CPU
  // engine's class), laid out by params() (aligned tensors).
  std::unique_ptr<TrainStateCuda> state_;
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
  SATDAR_RETURN_IF_ERROR(BuildModels());
  const model::ParamTable& table = params();  // aligned: model::kDeviceParamAlign
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
  state_ = std::make_unique<TrainStateCuda>(table, parts, o_.seed, Exec());
  SATDAR_RETURN_IF_ERROR(state_->status());
  SATDAR_RETURN_IF_ERROR(model::Allocate<model::Cuda<float>>(Exec(), [&] {
    scalars_.assign(1, 0.0);
    eval_sum_.assign(1, 0.0);
  }));
  SATDAR_RETURN_IF_ERROR(SetWeights());
  if (shape_.pp > 1) {  // the schedule over every model instance
    std::vector<std::vector<parallel::PipelineStage*>> chunks(chunks_.size());
    for (size_t c = 0; c < chunks_.size(); ++c) {
      for (auto& m : chunks_[c]) {
        stages_.push_back(std::make_unique<CudaStage>(m.get(), state_.get(), offsets_[c],
                                                      scalars_.data(), eval_sum_.data(),
                                                      stream_));
        chunks[c].push_back(stages_.back().get());
      }
    }
    // Directed links over the device's pipeline group: NCCL's sends complete only once
    // received (parallel/pipeline.h).
    SATDAR_ASSIGN_OR_RETURN(
        parallel::PipelineLinks links,
        parallel::MakePipelineLinks(groups_.pp.get(), copts_, /*probe=*/eval_sum_.data()));
    pipeline_ = std::make_unique<parallel::PipelineSchedule>(
        std::move(links), groups_.coord.pp, shape_.pp, std::move(chunks), copts_);
  }
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

// As the CPU engine's: chunk c of this rank is virtual stage c * pp + (its stage) of
// pp x virtual_stages, each with its model instances (one per micro-batch it can have in
// flight), the instances of a chunk sharing its weights.
absl::Status CudaEngine::BuildModels() {
  SATDAR_RETURN_IF_ERROR(CheckPipelineOptions(o_));
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
  const int pp = shape_.pp, v = o_.virtual_stages;
  const int slots =
      pp > 1 ? parallel::PipelineSlots(pp, groups_.coord.pp, v, o_.microbatches) : 1;
  mo.shard.pp_size = pp * v;
  for (int c = 0; c < v; ++c) {
    mo.shard.pp_rank = c * pp + groups_.coord.pp;
    chunks_.emplace_back();
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<model::DeviceModel> first,
                            model::DeviceModel::Create(o_.config, mo, stream_, &alloc_));
    first->SetStatsEnabled(o_.stats_every > 0);  // before NewInstance: the instances share it
    chunks_[c].push_back(std::move(first));
    for (int i = 1; i < slots; ++i) {
      SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<model::DeviceModel> m,
                              chunks_[c][0]->NewInstance());
      chunks_[c].push_back(std::move(m));
    }
    offsets_.push_back(v > 1 ? combined_.Append(chunks_[c][0]->params()) : 0);
  }
  model_ = chunks_[0][0].get();
  return absl::OkStatus();
}

std::string CudaEngine::Describe() const {
  return absl::StrFormat(
      "model: %s residual, %s gate, %lld parameters on %s (cuda:%d), %s compute, fp32 master "
      "weights%s; batch %d x %d tokens x %d replica(s)%s%s, %d micro-batch(es)%s",
      model::Name(o_.config.residual), model::Name(o_.config.value_residual),
      static_cast<long long>(full_parameters_), kc::DeviceName(device_), device_,
      o_.gpu.compute == core::DType::kBF16 ? "bf16" : "f32",
      o_.gpu.recompute ? ", activation recomputation" : "", o_.batch_size, o_.seq_len,
      host_->data_size(), world_size_ > 1 ? absl::StrCat(" over ", o_.gpu.world_kind) : "",
      zero_ ? ", ZeRO-1 (moments sharded over the replicas)" : "",
      o_.microbatches, DescribePipeline(o_));
}

// The micro-batches one after the other on the whole model (no pipeline stages); the losses
// into scalars_.
absl::Status CudaEngine::LocalForwardBackward(const std::vector<std::vector<int32_t>>& micro,
                                              float* grads, int mb_size) {
  for (int mb = 0; mb < o_.microbatches; ++mb) {
    SATDAR_RETURN_IF_ERROR(model_->Forward(micro[mb].data(), mb_size, o_.seq_len,
                                           1.0 / o_.microbatches, scalars_.data()));
    // The last backward pass all-reduces each layer's gradients as it finishes them (not
    // under ZeRO-1, which reduce-scatters afterwards).
    const bool last = mb + 1 == o_.microbatches;
    if (last) sync_->BeginLastBackward(model_, grads);
    const absl::Status s = model_->Backward(grads);
    if (last) sync_->EndLastBackward(model_, grads);
    SATDAR_RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CudaEngine::ForwardBackward(std::vector<std::vector<int32_t>>* micro) {
  SATDAR_RETURN_IF_ERROR(state_->ZeroGrads());
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scalars_.data(), 0, sizeof(double), stream_));
  float* grads = state_->grads();
  const int mb_size = o_.batch_size / o_.microbatches;
  if (pipeline_ != nullptr) {  // 1F1B: the stages add their losses into scalars_
    SATDAR_RETURN_IF_ERROR(pipeline_
                               ->Step([&](int mb) { return (*micro)[mb].data(); },
                                      o_.microbatches, mb_size, o_.seq_len)
                               .status());
  } else {
    SATDAR_RETURN_IF_ERROR(LocalForwardBackward(*micro, grads, mb_size));
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

// As the CPU engine's: micro-batch sized, the same on every replica; with pipeline stages the
// batches flow through the pipeline and the last stage's sum reaches every stage.
absl::StatusOr<double> CudaEngine::ValidationLoss(data::BatchSource* source, int batches) {
  const int b = o_.batch_size / o_.microbatches;
  const size_t tokens = static_cast<size_t>(b) * (o_.seq_len + 1);
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(eval_sum_.data(), 0, sizeof(double), stream_));
  if (pipeline_ != nullptr) {  // the schedule holds every batch in flight
    std::vector<std::vector<int32_t>> all(batches, std::vector<int32_t>(tokens));
    for (int i = 0; i < batches; ++i) {
      source->Batch(0, 0, static_cast<int64_t>(i) * b, b, o_.seq_len, all[i].data());
    }
    SATDAR_RETURN_IF_ERROR(
        pipeline_->ForwardOnly([&](int mb) { return all[mb].data(); }, batches, b, o_.seq_len)
            .status());
  } else {
    std::vector<int32_t> batch(tokens);
    for (int i = 0; i < batches; ++i) {
      source->Batch(0, 0, static_cast<int64_t>(i) * b, b, o_.seq_len, batch.data());
      SATDAR_RETURN_IF_ERROR(model_->Evaluate(batch.data(), b, o_.seq_len, eval_sum_.data()));
    }
  }
  double sum = 0;  // 0 on a stage without the head
  SATDAR_RETURN_IF_ERROR(core::ops::Download(Exec(), &sum, eval_sum_.data(), 1));
  if (pipeline_ != nullptr) {
    SATDAR_RETURN_IF_ERROR(
        host_->pp->AllReduce(&sum, 1, core::DType::kF64, comm::ReduceOp::kSum, copts_)->Wait());
  }
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

}  // namespace satdar::runtime
