// runtime/engine.h: the step engine both devices share. Engine<B, M> is one rank's
// optimizer step over models M whose fp32 (or f64) master weights, gradients and moments are
// backend B's (model/backend.h): the chunks and their model instances, the pipeline schedule
// over them, the train state (train_state.h), the reductions (gradient_sync.h), the loss and
// validation loops, statistics and checkpoints are written here once.
//
//   CpuEngine<T>  (cpu_engine.cc):  Engine<model::Cpu<T>, model::Model<T>>
//   CudaEngine    (cuda_engine.cc): Engine<model::Cuda<float>, model::DeviceModel>
//
// What differs per device is a handful of hooks: how a model instance is made (and how its
// sharding is completed), how it is seen by the schedule (a parallel::PipelineStage over the
// state's buffers), how the schedule's messages travel (one host communicator, or NCCL's
// directed links), and where the losses are summed (on the host, or in device accumulators
// read back once per step). The device's own resources (thread pool, stream, allocator, device
// communicators) live in a base class of the derived engine declared before Engine, so they
// outlive every model and buffer made from them.
#ifndef SATDAR_RUNTIME_ENGINE_H_
#define SATDAR_RUNTIME_ENGINE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/model.h"
#include "parallel/pipeline.h"
#include "runtime/checkpoint.h"
#include "runtime/gradient_sync.h"
#include "runtime/mesh_groups.h"
#include "runtime/stats_merge.h"
#include "runtime/step_engine.h"
#include "runtime/train_state.h"
#include "runtime/zero_partition.h"

namespace satdar::runtime {

template <class B, class M>
class Engine : public StepEngine {
 public:
  using G = typename B::Acc;  // master weights, gradients and moments
  template <typename U>
  using Vec = typename B::template Vec<U>;

  ~Engine() override { Abandon(); }

  // The rank's parameters: its model's, or with virtual stages its chunks' back to back.
  const model::ParamTable& params() const override {
    return chunks_.size() > 1 ? combined_ : model_->params();
  }

  absl::StatusOr<CheckpointInfo> Load(const std::string& path, const std::string& config_json,
                                      LoadWhat what) override {
    SATDAR_ASSIGN_OR_RETURN(
        CheckpointInfo info,
        state_->Load(path, config_json, what == LoadWhat::kWeightsOnly, params()));
    SATDAR_RETURN_IF_ERROR(WeightsChanged());
    return info;
  }

  // The micro-batches one after the other through the first instance (or the pipeline's 1F1B
  // schedule over every instance), each counting 1 / microbatches; then the loss averaged over
  // the replicas and every reduction of the gradients (under ZeRO-1 into shard_).
  absl::StatusOr<double> ForwardBackward(std::vector<std::vector<int32_t>>* micro) override {
    SATDAR_RETURN_IF_ERROR(state_->ZeroGrads());
    SATDAR_RETURN_IF_ERROR(ResetLosses());
    const int mbs = o_.microbatches, b = o_.batch_size / mbs;
    const auto tokens = [&](int mb) { return (*micro)[mb].data(); };
    double sum = 0;  // what the stages return (a device's 0: its losses stay there)
    if (pipeline_ != nullptr) {
      SATDAR_ASSIGN_OR_RETURN(sum, pipeline_->Step(tokens, mbs, b, o_.seq_len));
    } else {
      G* grads = state_->grads();
      parallel::PipelineStage* stage = stages_[0].get();
      for (int mb = 0; mb < mbs; ++mb) {
        SATDAR_ASSIGN_OR_RETURN(const double l, stage->Forward(tokens(mb), b, o_.seq_len,
                                                               1.0 / mbs));
        sum += l;
        // The last backward pass all-reduces each layer's gradients as it finishes them (not
        // under ZeRO-1, which reduce-scatters afterwards).
        const bool last = mb + 1 == mbs;
        if (last) sync_->BeginLastBackward(model_, grads);
        const absl::Status s = stage->Backward(1.0 / mbs);
        if (last) sync_->EndLastBackward(model_, grads);
        SATDAR_RETURN_IF_ERROR(s);
      }
    }
    SATDAR_ASSIGN_OR_RETURN(double loss, StepLoss(sum));
    SATDAR_ASSIGN_OR_RETURN(loss, sync_->ReduceLoss(loss));
    SATDAR_RETURN_IF_ERROR(sync_->Reduce(state_->grads(), &shard_));
    return loss;
  }

  absl::StatusOr<double> GradNorm() override {
    return sync_->GlobalNorm(state_->zero() ? shard_.data() : state_->grads());
  }

  absl::Status Update(const core::AdamWParams& hp) override {
    SATDAR_RETURN_IF_ERROR(state_->Update(hp, shard_, update_pool_, copts_));
    return WeightsChanged();
  }

  // Micro-batch sized, the same on every replica (every rank of a replica takes part); with
  // pipeline stages the batches flow through the pipeline and the last stage's sum reaches
  // every stage.
  absl::StatusOr<double> ValidationLoss(data::BatchSource* source, int batches) override {
    const int b = o_.batch_size / o_.microbatches;
    const size_t tokens = static_cast<size_t>(b) * (o_.seq_len + 1);
    SATDAR_RETURN_IF_ERROR(ResetLosses());
    double sum = 0;  // what the stages return (0 on a stage without the head, or a device)
    if (pipeline_ != nullptr) {  // the schedule holds every batch in flight
      std::vector<std::vector<int32_t>> all(batches, std::vector<int32_t>(tokens));
      for (int i = 0; i < batches; ++i) {
        source->Batch(0, 0, static_cast<int64_t>(i) * b, b, o_.seq_len, all[i].data());
      }
      SATDAR_ASSIGN_OR_RETURN(
          sum, pipeline_->ForwardOnly([&](int mb) { return all[mb].data(); }, batches, b,
                                      o_.seq_len));
    } else {
      std::vector<int32_t> batch(tokens);
      for (int i = 0; i < batches; ++i) {
        source->Batch(0, 0, static_cast<int64_t>(i) * b, b, o_.seq_len, batch.data());
        SATDAR_ASSIGN_OR_RETURN(const double l, stages_[0]->Evaluate(batch.data(), b, o_.seq_len));
        sum += l;
      }
    }
    SATDAR_ASSIGN_OR_RETURN(sum, EvalSum(sum));
    if (pipeline_ != nullptr) {
      SATDAR_RETURN_IF_ERROR(
          host_->pp->AllReduce(&sum, 1, core::DType::kF64, comm::ReduceOp::kSum, copts_)->Wait());
    }
    return sum / batches;
  }

  // The model's statistics since the last call: each replica its own, its chunks' instances
  // merged, its model-parallel pieces (TP, PP, EP) over the host's groups.
  absl::Status AddStats(nlohmann::json* line) override {
    std::vector<nlohmann::json> per_chunk;
    for (auto& models : chunks_) {
      std::vector<M*> instances;
      for (auto& m : models) instances.push_back(m.get());
      per_chunk.push_back(TakeChunkStats(instances, o_.microbatches));
    }
    nlohmann::json s = per_chunk[0];
    if (host_->mp != nullptr) {  // the whole model's, from the pieces of this replica
      SATDAR_ASSIGN_OR_RETURN(s, GatherStats(*host_, per_chunk, o_.sequence_parallel, copts_));
    }
    (*line)["stats"] = s;
    return absl::OkStatus();
  }

  // Replicas hold identical weights and moments: replica 0's pieces are the whole state, one
  // file alone or one shard per model-parallel piece (TP slice, PP stage, EP experts; the
  // folder loads into any layout). Under ZeRO-1 every replica first hands its slice of the
  // moments to the gather.
  absl::Status Save(const CheckpointInfo& info) override {
    const bool writer = host_->coord.dp == 0 && (host_->mp != nullptr || host_->coord.ep == 0);
    if (!state_->zero() && !writer) return absl::OkStatus();
    SATDAR_RETURN_IF_ERROR(state_->GatherMoments(copts_));
    absl::Status s;
    if (writer && host_->mp == nullptr) {
      s = SaveCheckpoint<G>(o_.checkpoint_dir, info, params(), state_->buffers());
    } else if (writer) {
      const std::string name =
          absl::StrCat("tp", host_->coord.tp, "-pp", host_->coord.pp, "-ep", host_->coord.ep);
      s = SaveShardedCheckpoint<G>(o_.checkpoint_dir, info, params(), state_->buffers(), name,
                                   host_->mp.get(), copts_);
    }
    state_->ReleaseMoments();  // the gathered moments were only needed for the file
    return s;
  }

  // The flat buffer brought to the host (a GPU's download waits for the step's work), then
  // each tensor by name into `whole`'s layout: another alignment, and a vocabulary padded to
  // vocab_multiple rows cut back to the true ones.
  absl::StatusOr<std::vector<float>> WholeWeights(const model::ParamTable& whole) override {
    const model::ParamTable& mine = params();
    std::vector<G> host(mine.size());
    SATDAR_RETURN_IF_ERROR(core::ops::Download(Exec(), host.data(), state_->params(), mine.size()));
    std::vector<float> out(whole.size(), 0.0f);
    for (const model::ParamSpec& want : whole.specs()) {
      const model::ParamSpec* have = mine.Find(want.name);
      if (have == nullptr || have->expert || (have->sharded() && have->shard_count > 1)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the whole model's weights: this rank (", Where(), ") holds ",
            have == nullptr ? "none" : "only a piece", " of ", want.name));
      }
      if ((have->sharded() ? have->global_shape : have->shape) != want.shape) {
        return absl::InternalError(absl::StrCat("the whole model's weights: ", want.name,
                                                " has another shape in this rank's table"));
      }
      for (int64_t i = 0; i < have->numel; ++i) {
        const int64_t g = have->GlobalIndex(i);
        if (g >= 0) out[want.offset + g] = static_cast<float>(host[have->offset + i]);
      }
    }
    return out;
  }

  void Abandon() override {
    if (pipeline_ != nullptr) pipeline_->Abandon();
    if (sync_ != nullptr) sync_->Abandon();
  }

 protected:
  // groups: the communicators of B's memory (null here; set with set_groups before Build).
  // host: the host's groups (checkpoints, statistics, validation's pipeline sum).
  // param_align: the parameter tables' alignment (virtual stages' combined table).
  Engine(const TrainOptions& o, const MeshGroups* host, int64_t param_align)
      : o_(o), host_(host), combined_(param_align) {
    copts_.timeout = absl::Seconds(o_.comm_timeout_seconds);
  }

  // The hooks.
  // The execution context of the state's and the reductions' arithmetic.
  virtual typename B::Exec Exec() = 0;
  // A model instance of the chunk whose sharding is `shard` (the engine's groups, layout and
  // options; the device completes it): the chunk's first when `first` is null, else another
  // instance sharing the first's weights.
  virtual absl::StatusOr<std::unique_ptr<M>> NewModel(model::Sharding shard, M* first) = 0;
  // The schedule's view of instance m, whose parameters start at `offset` of the flat buffers.
  virtual std::unique_ptr<parallel::PipelineStage> NewStage(M* m, int64_t offset) = 0;
  // The 1F1B schedule over chunks[v][instance], on this device's communicators.
  virtual absl::StatusOr<std::unique_ptr<parallel::PipelineSchedule>> NewSchedule(
      std::vector<std::vector<parallel::PipelineStage*>> chunks) = 0;
  // After the master weights changed (made, loaded, updated): the compute copies, if any.
  virtual absl::Status WeightsChanged() { return absl::OkStatus(); }
  // Before a step's or a validation's passes: the device accumulators to zero.
  virtual absl::Status ResetLosses() { return absl::OkStatus(); }
  // This rank's share of the step's loss, from the sum of what its stages returned.
  virtual absl::StatusOr<double> StepLoss(double returned) = 0;
  // This rank's sum of validation cross-entropies, from the sum of what its stages returned.
  virtual absl::StatusOr<double> EvalSum(double returned) = 0;

  // Builds the models, the state, the reductions and the stages; the derived engine calls it
  // once its device is ready.
  absl::Status Build(MeshGroups* groups) {
    groups_ = groups;
    SATDAR_RETURN_IF_ERROR(BuildModels());
    const model::ParamTable& table = params();
    // ZeRO-1: the moments sharded over the replicas of each weight (zero_partition.h).
    std::vector<ZeroPartition> parts;
    if (o_.zero_stage == 1 && groups_->data_size() > 1) {
      const ParamRoles roles = RolesOf(table, *groups_, o_.config.tie_word_embeddings);
      parts = ZeroPartitions(roles.dense, roles.experts, *groups_);
    }
    state_ = std::make_unique<TrainStateT<B>>(table, parts, o_.seed, Exec());
    SATDAR_RETURN_IF_ERROR(state_->status());
    sync_ = std::make_unique<GradientSyncT<B>>(table, groups_, o_.config, parts, copts_, Exec());
    SATDAR_RETURN_IF_ERROR(WeightsChanged());
    std::vector<std::vector<parallel::PipelineStage*>> chunks(chunks_.size());
    for (size_t c = 0; c < chunks_.size(); ++c) {
      for (auto& m : chunks_[c]) {
        stages_.push_back(NewStage(m.get(), offsets_[c]));
        chunks[c].push_back(stages_.back().get());
      }
    }
    if (groups_->shape.pp > 1) {
      SATDAR_ASSIGN_OR_RETURN(pipeline_, NewSchedule(std::move(chunks)));
    }
    return absl::OkStatus();
  }

  // [activations forward, gradients back] bytes each (virtual) stage boundary carried this
  // step, in stage order, as the line's "pp_boundary_bytes" (nothing without stages).
  absl::Status AddBoundaryBytes(nlohmann::json* line) {
    if (pipeline_ == nullptr) return absl::OkStatus();
    SATDAR_ASSIGN_OR_RETURN(const auto carried,
                            parallel::BoundaryBytes(*pipeline_, host_->pp.get(), copts_));
    nlohmann::json boundaries = nlohmann::json::array();
    for (const auto& [fwd, bwd] : carried) boundaries.push_back({fwd, bwd});
    (*line)["pp_boundary_bytes"] = boundaries;
    return absl::OkStatus();
  }

  const TrainOptions o_;
  const MeshGroups* const host_;
  MeshGroups* groups_ = nullptr;
  comm::CollectiveOptions copts_;
  core::ThreadPool* update_pool_ = nullptr;  // AdamW's threads (the CPU's pool)
  // Per chunk (one, or virtual_stages), one model instance per micro-batch in flight (1F1B);
  // model_ is the first.
  std::vector<std::vector<std::unique_ptr<M>>> chunks_;
  M* model_ = nullptr;
  model::ParamTable combined_;    // virtual stages: the chunks' tables back to back
  std::vector<int64_t> offsets_;  // where each chunk's parameters start in the flat buffers
  std::unique_ptr<TrainStateT<B>> state_;
  std::unique_ptr<GradientSyncT<B>> sync_;
  Vec<G> shard_;  // ZeRO-1: this replica's slice of the reduced gradients
  // The schedule's view of every instance (stages_[0] is model_'s), and with pipeline stages
  // the schedule.
  std::vector<std::unique_ptr<parallel::PipelineStage>> stages_;
  std::unique_ptr<parallel::PipelineSchedule> pipeline_;

 private:
  // Chunk c of this rank is virtual stage c * pp + (its stage) of pp x virtual_stages, each
  // with its model instances (one per micro-batch it can have in flight).
  absl::Status BuildModels() {
    SATDAR_RETURN_IF_ERROR(CheckPipelineOptions(o_));
    const MeshGroups& g = *groups_;
    model::Sharding shard;
    shard.tp = g.tp.get();
    shard.tp_rank = g.coord.tp;
    shard.tp_size = g.shape.tp;
    shard.ep = g.ep.get();
    shard.ep_rank = g.coord.ep;
    shard.ep_size = g.shape.ep;
    shard.vocab_multiple = o_.vocab_multiple;
    shard.sequence_parallel = o_.sequence_parallel;
    shard.collective = copts_;
    const int pp = g.shape.pp, v = o_.virtual_stages;
    const int slots = pp > 1 ? parallel::PipelineSlots(pp, g.coord.pp, v, o_.microbatches) : 1;
    shard.pp_size = pp * v;
    for (int c = 0; c < v; ++c) {
      shard.pp_rank = c * pp + g.coord.pp;
      chunks_.emplace_back();
      for (int i = 0; i < slots; ++i) {
        SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<M> m,
                                NewModel(shard, i == 0 ? nullptr : chunks_[c][0].get()));
        chunks_[c].push_back(std::move(m));
      }
      offsets_.push_back(v > 1 ? combined_.Append(chunks_[c][0]->params()) : 0);
    }
    model_ = chunks_[0][0].get();
    return absl::OkStatus();
  }
};

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_ENGINE_H_
