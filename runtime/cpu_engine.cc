#include "runtime/cpu_engine.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/ops/gemm.h"
#include "core/thread_pool.h"
#include "model/memory_estimate.h"
#include "model/model.h"
#include "parallel/pipeline.h"
#include "runtime/gradient_sync.h"
#include "runtime/stats_merge.h"
#include "runtime/train_state.h"

namespace satdar::runtime {

namespace {

using Json = nlohmann::json;

// One model instance of a pipeline chunk (parallel/pipeline.h): its parameters and
// gradients are the chunk's slice of the rank's flat buffers, read from the train state at
// each pass.
template <typename T>
class CpuStage : public parallel::PipelineStage {
 public:
  CpuStage(model::Model<T>* m, TrainState<T>* state, int64_t offset)
      : m_(m), state_(state), offset_(offset) {}
  absl::StatusOr<model::StageViews> Prepare(int b, int t) override {
    return model::ViewsOf(m_->PrepareStage(b, t), core::DTypeOf<T>::value);
  }
  absl::StatusOr<double> Forward(const int32_t* tokens, int b, int t,
                                 double loss_scale) override {
    (void)loss_scale;  // the CPU's models take it at Backward
    return m_->Forward(state_->params() + offset_, tokens, b, t);
  }
  absl::StatusOr<double> Evaluate(const int32_t* tokens, int b, int t) override {
    SATDAR_RETURN_IF_ERROR(m_->Forward(state_->params() + offset_, tokens, b, t).status());
    return m_->last_cross_entropy();  // 0 on a stage without the head
  }
  absl::Status Backward(double loss_scale) override {
    return m_->Backward(state_->params() + offset_, state_->grads() + offset_, loss_scale);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  model::Model<T>* const m_;
  TrainState<T>* const state_;
  const int64_t offset_;
};

template <typename T>
class CpuEngine : public StepEngine {
 public:
  CpuEngine(const TrainOptions& o, MeshGroups* g) : o_(o), g_(*g) {
    copts_.timeout = absl::Seconds(o_.comm_timeout_seconds);
  }

  absl::Status Init() {
    core::cpu::InitBlas();
    pool_ = std::make_unique<core::ThreadPool>(o_.threads);
    SATDAR_RETURN_IF_ERROR(BuildModels());
    // The activations of the largest stage's rank, estimated once (model/memory_estimate.h).
    if (auto e = model::EstimateMemory(o_.config, TrainMemoryShape(o_)); e.ok()) {
      activation_estimate_ = e->activation_bytes;
    }
    const model::ParamTable& table = params();
    // ZeRO-1: the moments sharded over the replicas of each weight (zero_partition.h).
    std::vector<ZeroPartition> parts;
    if (o_.zero_stage == 1 && g_.data_size() > 1) {
      const ParamRoles roles = RolesOf(table, g_, o_.config.tie_word_embeddings);
      parts = ZeroPartitions(roles.dense, roles.experts, g_);
    }
    state_ = std::make_unique<TrainState<T>>(table, parts, o_.seed);
    if (g_.shape.pp > 1) {  // the schedule over every model instance
      std::vector<std::vector<parallel::PipelineStage*>> chunks(chunks_.size());
      for (size_t c = 0; c < chunks_.size(); ++c) {
        for (auto& m : chunks_[c]) {
          stages_.push_back(std::make_unique<CpuStage<T>>(m.get(), state_.get(), offsets_[c]));
          chunks[c].push_back(stages_.back().get());
        }
      }
      pipeline_ =
          std::make_unique<parallel::PipelineSchedule>(g_.pp.get(), std::move(chunks), copts_);
    }
    sync_ = std::make_unique<GradientSync<T>>(table, &g_, o_.config, parts, copts_);
    return absl::OkStatus();
  }

  // The rank's parameters: its model's, or with virtual stages its chunks' back to back.
  const model::ParamTable& params() const override {
    return chunks_.size() > 1 ? combined_ : model_->params();
  }

  std::string Describe() const override {
    std::string s = absl::StrFormat(
        "model: %s residual, %lld parameters on rank 0 (%s); batch %d x %d tokens per replica, "
        "%d micro-batch(es), %d thread(s), %s",
        model::Name(o_.config.residual), static_cast<long long>(params().packed_size()),
        g_.shape.ToString(), o_.batch_size, o_.seq_len, o_.microbatches, o_.threads,
        o_.f64 ? "f64" : "f32");
    s += DescribePipeline(o_);
    if (activation_estimate_ >= 0) {
      absl::StrAppend(&s, "\nactivations: about ", model::FormatBytes(activation_estimate_),
                      " per rank (recompute ", model::Name(o_.recompute), ")");
    }
    return s;
  }
  std::string Where() const override { return g_.shape.ToString(); }

  absl::StatusOr<CheckpointInfo> Load(const std::string& path, const std::string& config_json,
                                      LoadWhat what) override {
    return state_->Load(path, config_json, what == LoadWhat::kWeightsOnly, params());
  }

  absl::StatusOr<double> ForwardBackward(std::vector<std::vector<int32_t>>* micro) override {
    SATDAR_RETURN_IF_ERROR(state_->ZeroGrads());
    SATDAR_ASSIGN_OR_RETURN(double loss, LocalForwardBackward(*micro));
    SATDAR_ASSIGN_OR_RETURN(loss, sync_->ReduceLoss(loss / o_.microbatches));
    SATDAR_RETURN_IF_ERROR(sync_->Reduce(state_->grads(), &shard_));
    return loss;
  }

  absl::StatusOr<double> GradNorm() override {
    return sync_->GlobalNorm(state_->zero() ? shard_.data() : state_->grads());
  }

  absl::Status Update(const core::AdamWParams& hp) override {
    return state_->Update(hp, shard_, pool_.get(), copts_);
  }

  // Every rank of a replica takes part; with pipeline stages the batches flow through the
  // pipeline and the last stage's mean reaches every stage.
  absl::StatusOr<double> ValidationLoss(data::BatchSource* source, int batches) override {
    const int b = o_.batch_size / o_.microbatches;
    std::vector<std::vector<int32_t>> all(batches,
                                          std::vector<int32_t>(static_cast<size_t>(b) * (o_.seq_len + 1)));
    for (int i = 0; i < batches; ++i) {
      source->Batch(0, 0, static_cast<int64_t>(i) * b, b, o_.seq_len, all[i].data());
    }
    double sum = 0;
    if (pipeline_ == nullptr) {
      for (int i = 0; i < batches; ++i) {
        SATDAR_RETURN_IF_ERROR(model_->Forward(state_->params(), all[i].data(), b, o_.seq_len).status());
        sum += model_->last_cross_entropy();
      }
      return sum / batches;
    }
    SATDAR_ASSIGN_OR_RETURN(
        sum, pipeline_->ForwardOnly([&](int mb) { return all[mb].data(); }, batches, b,
                                    o_.seq_len));
    SATDAR_RETURN_IF_ERROR(
        g_.pp->AllReduce(&sum, 1, core::DType::kF64, comm::ReduceOp::kSum, copts_)->Wait());
    return sum / batches;
  }

  absl::Status AddToLog(Json* line) override {
    if (pipeline_ != nullptr) {
      // Bytes each (virtual) stage boundary carried this step, in stage order: [activations
      // forward, gradients back].
      SATDAR_ASSIGN_OR_RETURN(const auto carried,
                              parallel::BoundaryBytes(*pipeline_, g_.pp.get(), copts_));
      Json boundaries = Json::array();
      for (const auto& [fwd, bwd] : carried) boundaries.push_back({fwd, bwd});
      (*line)["pp_boundary_bytes"] = boundaries;
    }
    if (o_.world != nullptr) {
      // Payload bytes this rank handed to each of its groups this step (rank 0's view).
      Json bytes = Json::object();
      for (const auto& [name, comm] :
           {std::pair<const char*, comm::CountingCommunicator*>{"tp", g_.tp.get()},
            {"pp", g_.pp.get()}, {"ep", g_.ep.get()}, {"data", g_.data.get()}, {"mp", g_.mp.get()}}) {
        if (comm != nullptr) bytes[name] = comm->TakeBytes();
      }
      (*line)["comm_bytes"] = bytes;
    }
    return absl::OkStatus();
  }

  void TakeCommWait(double* collective, double* pipeline) override {
    *collective = *pipeline = 0;
    // dp carries the expert gradients' all-reduce (MoE with ep > 1).
    for (comm::CountingCommunicator* c :
         {g_.tp.get(), g_.ep.get(), g_.dp.get(), g_.data.get(), g_.mp.get()}) {
      if (c != nullptr) *collective += c->TakeWaitSeconds();
    }
    if (g_.pp != nullptr) *pipeline = g_.pp->TakeWaitSeconds();
  }

  absl::Status AddStats(Json* line) override {
    std::vector<Json> per_chunk;
    for (auto& models : chunks_) {
      std::vector<model::Model<T>*> instances;
      for (auto& m : models) instances.push_back(m.get());
      per_chunk.push_back(TakeChunkStats(instances, o_.microbatches));
    }
    Json s = per_chunk[0];
    if (g_.mp != nullptr) {  // the whole model's, from the pieces of this replica
      SATDAR_ASSIGN_OR_RETURN(s, GatherStats(g_, per_chunk, o_.sequence_parallel, copts_));
    }
    (*line)["stats"] = s;
    return absl::OkStatus();
  }

  absl::Status Save(const CheckpointInfo& info) override {
    SATDAR_RETURN_IF_ERROR(state_->GatherMoments(copts_));
    if (g_.coord.dp == 0) {
      // Replicas hold identical weights and moments: replica 0's pieces are the whole state.
      const model::ParamTable& table = params();
      if (g_.mp == nullptr && g_.coord.ep == 0) {
        SATDAR_RETURN_IF_ERROR(SaveCheckpoint<T>(o_.checkpoint_dir, info, table, state_->buffers()));
      } else if (g_.mp != nullptr) {
        const std::string name =
            absl::StrCat("tp", g_.coord.tp, "-pp", g_.coord.pp, "-ep", g_.coord.ep);
        SATDAR_RETURN_IF_ERROR(SaveShardedCheckpoint<T>(o_.checkpoint_dir, info, table,
                                                        state_->buffers(), name, g_.mp.get(),
                                                        copts_));
      }
    }
    state_->ReleaseMoments();  // the gathered moments were only needed for the file
    return absl::OkStatus();
  }

  void Abandon() override {
    if (pipeline_ != nullptr) pipeline_->Abandon();
    if (sync_ != nullptr) sync_->Abandon();
  }

  void AddToSummary(double tokens_per_second, Json* j, TrainSummary* out) override {
    (void)tokens_per_second, (void)out;
    const comm::MeshShape& mesh = g_.shape;
    (*j)["threads"] = o_.threads;
    (*j)["mesh"] = {{"dp", mesh.dp}, {"tp", mesh.tp}, {"pp", mesh.pp}, {"ep", mesh.ep}};
    // peak_rss_bytes beside it is measured.
    if (activation_estimate_ >= 0) (*j)["activation_bytes_estimate"] = activation_estimate_;
  }

 private:
  absl::Status BuildModels() {
    SATDAR_RETURN_IF_ERROR(CheckPipelineOptions(o_));
    model::Sharding shard;
    shard.tp = g_.tp.get();
    shard.tp_rank = g_.coord.tp;
    shard.tp_size = g_.shape.tp;
    shard.ep = g_.ep.get();
    shard.ep_rank = g_.coord.ep;
    shard.ep_size = g_.shape.ep;
    shard.vocab_multiple = o_.vocab_multiple;
    shard.recompute = o_.recompute;
    shard.sequence_parallel = o_.sequence_parallel;
    shard.errors = &comm_errors_;
    shard.collective = copts_;
    // Chunk c of this rank is virtual stage c * pp + (its stage) of pp x virtual_stages, each
    // with its model instances (one per micro-batch it can have in flight).
    const int pp = g_.shape.pp, v = o_.virtual_stages;
    const int slots =
        pp > 1 ? parallel::PipelineSlots(pp, g_.coord.pp, v, o_.microbatches) : 1;
    shard.pp_size = pp * v;
    for (int c = 0; c < v; ++c) {
      shard.pp_rank = c * pp + g_.coord.pp;
      chunks_.emplace_back();
      for (int i = 0; i < slots; ++i) {
        SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<model::Model<T>> m,
                                model::CreateModel<T>(o_.config, shard, pool_.get()));
        chunks_[c].push_back(std::move(m));
      }
      offsets_.push_back(v > 1 ? combined_.Append(chunks_[c][0]->params()) : 0);
    }
    model_ = chunks_[0][0].get();
    return absl::OkStatus();
  }

  // Forward and backward over the step's micro-batches (or the pipeline's 1F1B schedule);
  // the summed loss of this rank's share.
  absl::StatusOr<double> LocalForwardBackward(const std::vector<std::vector<int32_t>>& micro) {
    const int mb_size = o_.batch_size / o_.microbatches;
    T* params = state_->params();
    T* grads = state_->grads();
    if (pipeline_ != nullptr) {
      return pipeline_->Step([&](int mb) { return micro[mb].data(); }, o_.microbatches, mb_size,
                             o_.seq_len);
    }
    double loss = 0;
    for (int mb = 0; mb < o_.microbatches; ++mb) {
      SATDAR_ASSIGN_OR_RETURN(const double l,
                              model_->Forward(params, micro[mb].data(), mb_size, o_.seq_len));
      loss += l;
      const bool last = mb + 1 == o_.microbatches;
      if (last) sync_->BeginLastBackward(model_, grads);
      const absl::Status s = model_->Backward(params, grads, 1.0 / o_.microbatches);
      if (last) sync_->EndLastBackward(model_, grads);
      SATDAR_RETURN_IF_ERROR(s);
    }
    return loss;
  }

  const TrainOptions o_;
  MeshGroups& g_;
  comm::CollectiveOptions copts_;
  std::unique_ptr<core::ThreadPool> pool_;
  model::CommErrors comm_errors_;
  // Per chunk (one, or --virtual-stages), one model per micro-batch in flight (1F1B).
  std::vector<std::vector<std::unique_ptr<model::Model<T>>>> chunks_;
  model::ParamTable combined_;  // virtual stages: the chunks' tables back to back
  std::vector<int64_t> offsets_;  // where each chunk's parameters start in the flat buffers
  int64_t activation_estimate_ = -1;  // bytes; -1 when it could not be estimated
  model::Model<T>* model_ = nullptr;
  // The pipeline's view of the models (one per instance) and its schedule.
  std::vector<std::unique_ptr<CpuStage<T>>> stages_;
  std::unique_ptr<parallel::PipelineSchedule> pipeline_;
  std::unique_ptr<TrainState<T>> state_;
  std::unique_ptr<GradientSync<T>> sync_;
  std::vector<T> shard_;  // ZeRO-1: this replica's slice of the reduced gradients
};

template <typename T>
absl::StatusOr<std::unique_ptr<StepEngine>> Create(const TrainOptions& o, MeshGroups* g) {
  auto engine = std::make_unique<CpuEngine<T>>(o, g);
  SATDAR_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<StepEngine>(std::move(engine));
}

}  // namespace

model::MemoryShape TrainMemoryShape(const TrainOptions& o) {
  model::MemoryShape shape;
  shape.batch = o.batch_size;
  shape.seq_len = o.seq_len;
  shape.microbatches = o.microbatches;
  shape.dtype_bytes = o.f64 ? 8 : 4;
  shape.tp = o.mesh.tp;
  shape.pp = o.mesh.pp;
  shape.ep = o.mesh.ep;
  shape.dp = o.mesh.dp;
  shape.zero_stage = o.zero_stage;
  shape.vocab_multiple = o.vocab_multiple;
  shape.recompute = o.recompute;
  shape.sequence_parallel = o.sequence_parallel;
  shape.virtual_stages = o.virtual_stages;
  return shape;
}

absl::StatusOr<std::unique_ptr<StepEngine>> CreateCpuEngine(const TrainOptions& options,
                                                            MeshGroups* groups) {
  return options.f64 ? Create<double>(options, groups) : Create<float>(options, groups);
}

}  // namespace satdar::runtime
