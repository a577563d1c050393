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
#include "runtime/engine.h"
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

// What the CPU engine's models use, made before and gone after them (engine.h).
struct CpuResources {
  std::unique_ptr<core::ThreadPool> pool;
  model::CommErrors comm_errors;  // the first failure of an in-pass collective
};

template <typename T>
class CpuEngine : private CpuResources, public Engine<model::Cpu<T>, model::Model<T>> {
  using Base = Engine<model::Cpu<T>, model::Model<T>>;

 public:
  CpuEngine(const TrainOptions& o, MeshGroups* g)
      : Base(o, g, /*param_align=*/1), g_(*g) {}

  absl::Status Init() {
    core::cpu::InitBlas();
    pool = std::make_unique<core::ThreadPool>(o_.threads);
    this->update_pool_ = pool.get();
    SATDAR_RETURN_IF_ERROR(this->Build(&g_));
    // The activations of the largest stage's rank, estimated once (model/memory_estimate.h).
    if (auto e = model::EstimateMemory(o_.config, TrainMemoryShape(o_)); e.ok()) {
      activation_estimate_ = e->activation_bytes;
    }
    return absl::OkStatus();
  }

  std::string Describe() const override {
    std::string s = absl::StrFormat(
        "model: %s residual, %lld parameters on rank 0 (%s); batch %d x %d tokens per replica, "
        "%d micro-batch(es), %d thread(s), %s",
        model::Name(o_.config.residual), static_cast<long long>(this->params().packed_size()),
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

  absl::Status AddToLog(Json* line) override {
    SATDAR_RETURN_IF_ERROR(this->AddBoundaryBytes(line));
    if (o_.world != nullptr) {
      // Payload bytes this rank handed to each of its groups this step (rank 0's view).
      Json bytes = Json::object();
      for (const auto& [name, comm] :
           {std::pair<const char*, comm::CountingCommunicator*>{"tp", g_.tp.get()},
            {"pp", g_.pp.get()}, {"ep", g_.ep.get()}, {"data", g_.data.get()},
            {"mp", g_.mp.get()}}) {
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

  void AddToSummary(double tokens_per_second, Json* j, TrainSummary* out) override {
    (void)tokens_per_second, (void)out;
    const comm::MeshShape& mesh = g_.shape;
    (*j)["threads"] = o_.threads;
    (*j)["mesh"] = {{"dp", mesh.dp}, {"tp", mesh.tp}, {"pp", mesh.pp}, {"ep", mesh.ep}};
    // peak_rss_bytes beside it is measured.
    if (activation_estimate_ >= 0) (*j)["activation_bytes_estimate"] = activation_estimate_;
  }

 private:
  using Base::o_;

  core::CpuExec Exec() override { return {}; }  // the reductions and state as before: no pool
  absl::StatusOr<std::unique_ptr<model::Model<T>>> NewModel(model::Sharding shard,
                                                            model::Model<T>* first) override {
    (void)first;  // each instance its own model; the weights come from the state at each pass
    shard.recompute = o_.recompute;
    shard.errors = &comm_errors;
    return model::CreateModel<T>(o_.config, shard, pool.get());
  }
  std::unique_ptr<parallel::PipelineStage> NewStage(model::Model<T>* m,
                                                    int64_t offset) override {
    return std::make_unique<CpuStage<T>>(m, this->state_.get(), offset);
  }
  // One communicator carries every message (the CPU's sends return before they are received).
  absl::StatusOr<std::unique_ptr<parallel::PipelineSchedule>> NewSchedule(
      std::vector<std::vector<parallel::PipelineStage*>> chunks) override {
    return std::make_unique<parallel::PipelineSchedule>(g_.pp.get(), std::move(chunks),
                                                        this->copts_);
  }
  absl::StatusOr<double> StepLoss(double returned) override {
    return returned / o_.microbatches;
  }
  absl::StatusOr<double> EvalSum(double returned) override { return returned; }

  MeshGroups& g_;
  int64_t activation_estimate_ = -1;  // bytes; -1 when it could not be estimated
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
