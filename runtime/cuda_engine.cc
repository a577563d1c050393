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
#include "runtime/engine.h"
#include "runtime/mesh_groups.h"
#include "runtime/train_state.h"
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

// What the CUDA engine's models, state and reductions use, made before and gone after them
// (engine.h).
struct CudaResources {
  int device = 0;
  kc::CachingAllocator alloc;
  kc::Stream compute;
  cudaStream_t stream = nullptr;
  // The compute stream's scratch (SumSquares); made with the stream, gone before it.
  std::unique_ptr<kc::Workspace> workspace;
  // The device's mesh (split from the device world; every group null alone).
  MeshGroups groups;
  kc::DeviceVec<double> loss, eval_sum;  // the step's loss; validation's (one each)
};

class CudaEngine : private CudaResources, public Engine<model::Cuda<float>, model::DeviceModel> {
 public:
  CudaEngine(const TrainOptions& o, MeshGroups* g)
      : Engine(o, g, model::kDeviceParamAlign), rank_(g->rank), world_size_(g->shape.size()),
        world_(o.gpu.world) {}

  absl::Status Init();

  std::string Describe() const override;
  std::string Where() const override { return absl::StrCat("cuda:", device); }

  absl::Status AddToLog(Json* line) override {
    SATDAR_RETURN_IF_ERROR(AddBoundaryBytes(line));
    (*line)["mfu"] = Mfu((*line)["tokens_per_second"].get<double>());
    const core::cuda::AllocatorStats mem = alloc.Stats();
    (*line)["peak_device_bytes"] = mem.peak_bytes;
    (*line)["device_bytes"] = {{"allocated", mem.current_bytes},
                               {"reserved", mem.reserved_bytes},
                               {"peak", mem.peak_bytes}};
    return absl::OkStatus();
  }
  void AddToSummary(double tokens_per_second, Json* j, TrainSummary* out) override {
    out->peak_device_bytes = alloc.Stats().peak_bytes;
    out->mfu = Mfu(tokens_per_second);
    (*j)["mfu"] = out->mfu;
    (*j)["peak_device_bytes"] = out->peak_device_bytes;
    (*j)["peak_memory_gib"] = out->peak_device_bytes / 1073741824.0;
    int64_t activations = 0;
    for (auto& models : chunks_) {
      for (auto& m : models) activations += m->activation_bytes();
    }
    (*j)["activation_bytes"] = activations;
    (*j)["device"] = kc::DeviceName(device);
    (*j)["compute"] = o_.gpu.compute == core::DType::kBF16 ? "bf16" : "f32";
    (*j)["recompute"] = o_.gpu.recompute;
    (*j)["batch"] = {o_.batch_size, o_.seq_len};
  }

 private:
  // The execution context of the kernels the state and the reductions launch (AdamW, the
  // reductions' packing and sums of squares; their scratch buffers from alloc).
  core::CudaExec Exec() override { return {stream, nullptr, workspace.get(), &alloc}; }
  // The chunk's first instance owns the device weights; the others share them (and the
  // bf16 compute copy, stream, GEMM handle and workspace).
  absl::StatusOr<std::unique_ptr<model::DeviceModel>> NewModel(
      model::Sharding shard, model::DeviceModel* first) override {
    if (first != nullptr) return first->NewInstance();
    model::DeviceModelOptions mo;
    mo.compute = o_.gpu.compute;
    mo.shard = shard;
    mo.shard.recompute = o_.gpu.recompute ? model::Recompute::kFull : model::Recompute::kNone;
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<model::DeviceModel> m,
                            model::DeviceModel::Create(o_.config, mo, stream, &alloc));
    m->SetStatsEnabled(o_.stats_every > 0);  // before NewInstance: the instances share it
    return m;
  }
  std::unique_ptr<parallel::PipelineStage> NewStage(model::DeviceModel* m,
                                                    int64_t offset) override {
    return std::make_unique<CudaStage>(m, state_.get(), offset, loss.data(), eval_sum.data(),
                                       stream);
  }
  // Directed links over the device's pipeline group: NCCL's sends complete only once received
  // (parallel/pipeline.h).
  absl::StatusOr<std::unique_ptr<parallel::PipelineSchedule>> NewSchedule(
      std::vector<std::vector<parallel::PipelineStage*>> chunks) override {
    SATDAR_ASSIGN_OR_RETURN(
        parallel::PipelineLinks links,
        parallel::MakePipelineLinks(groups.pp.get(), copts_, /*probe=*/eval_sum.data()));
    return std::make_unique<parallel::PipelineSchedule>(
        std::move(links), groups.coord.pp, groups.shape.pp, std::move(chunks), copts_);
  }
  // The models' compute weights from the master weights (each chunk's slice), then a wait:
  // step time includes the update (the next step's first kernels queue behind it).
  absl::Status WeightsChanged() override {
    for (size_t c = 0; c < chunks_.size(); ++c) {
      SATDAR_RETURN_IF_ERROR(chunks_[c][0]->SetWeights(state_->params() + offsets_[c]));
    }
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }
  absl::Status ResetLosses() override {
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(loss.data(), 0, sizeof(double), stream));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(eval_sum.data(), 0, sizeof(double), stream));
    return absl::OkStatus();
  }
  // The stages added their scaled losses into the device accumulator: read back, the step's
  // one wait for the compute stream besides the norm's.
  absl::StatusOr<double> StepLoss(double returned) override {
    (void)returned;  // 0
    double v = 0;
    SATDAR_RETURN_IF_ERROR(core::ops::Download(Exec(), &v, loss.data(), 1));
    return v;
  }
  absl::StatusOr<double> EvalSum(double returned) override {
    (void)returned;  // 0
    double v = 0;  // 0 on a stage without the head
    SATDAR_RETURN_IF_ERROR(core::ops::Download(Exec(), &v, eval_sum.data(), 1));
    return v;
  }
  double PeakFlops() const override { return peak_flops_; }
  double Mfu(double tokens_per_second) const {
    return runtime::Mfu(tokens_per_second, world_size_, flops_per_token_, peak_flops_);
  }

  const int rank_, world_size_;
  comm::Communicator* const world_;  // device buffers; null alone
  double flops_per_token_ = 0, peak_flops_ = 0;  // set by Init
  int64_t full_parameters_ = 0;  // the whole model's (every rank's piece together)
};

absl::Status CudaEngine::Init() {
  SATDAR_RETURN_IF_ERROR(CheckCudaEngine(o_));
  const int devices = kc::DeviceCount();
  if (devices == 0) {
    return absl::FailedPreconditionError("device cuda: no CUDA GPU on this machine");
  }
  device = o_.gpu.device >= 0 ? o_.gpu.device : rank_ % devices;
  if (device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("device cuda:", device, ": this machine has ",
                                                   devices, " GPU(s)"));
  }
  if (world_size_ > 1 && world_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, ": data parallelism on the GPU needs a device communicator (NCCL or "
        "host staging) for its ", world_size_, " ranks"));
  }
  SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  kc::SetErrorRank(world_size_ > 1 ? rank_ : -1);
  SATDAR_ASSIGN_OR_RETURN(compute, kc::Stream::Create());
  stream = compute.get();
  workspace = std::make_unique<kc::Workspace>(&alloc, stream);
  // The device's communicators, split from the device world as the host's are from theirs.
  SATDAR_ASSIGN_OR_RETURN(groups, BuildMeshGroups(world_, host_->shape, copts_));
  SATDAR_RETURN_IF_ERROR(model::Allocate<model::Cuda<float>>(Exec(), [&] {
    loss.assign(1, 0.0);
    eval_sum.assign(1, 0.0);
  }));
  // The models, state, reductions and stages (engine.h) over the device's groups, their
  // parameter tables aligned (model::kDeviceParamAlign).
  SATDAR_RETURN_IF_ERROR(Build(&groups));
  // MFU and the description count the whole model (a rank's table is a shard under tp or ep).
  SATDAR_ASSIGN_OR_RETURN(const model::ParamTable whole,
                          model::BuildParamTable(o_.config, model::Sharding{}));
  full_parameters_ = whole.packed_size();
  flops_per_token_ = model::FlopsPerToken(full_parameters_, o_.config, o_.seq_len);
  // --peak-tflops 0: the GPU's own peak from the table, H100/H200's when it is not listed.
  const double listed = GpuPeakFlops(kc::DeviceName(device));
  peak_flops_ = o_.peak_tflops > 0 ? o_.peak_tflops * 1e12 : listed > 0 ? listed : 989e12;
  return absl::OkStatus();
}

std::string CudaEngine::Describe() const {
  return absl::StrFormat(
      "model: %s residual, %s gate, %lld parameters on %s (cuda:%d), %s compute, fp32 master "
      "weights%s; batch %d x %d tokens x %d replica(s)%s%s, %d micro-batch(es)%s",
      model::Name(o_.config.residual), model::Name(o_.config.value_residual),
      static_cast<long long>(full_parameters_), kc::DeviceName(device), device,
      o_.gpu.compute == core::DType::kBF16 ? "bf16" : "f32",
      o_.gpu.recompute ? ", activation recomputation" : "", o_.batch_size, o_.seq_len,
      host_->data_size(), world_size_ > 1 ? absl::StrCat(" over ", o_.gpu.world_kind) : "",
      state_->zero() ? ", ZeRO-1 (moments sharded over the replicas)" : "",
      o_.microbatches, DescribePipeline(o_));
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
