#include "worker/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/ops/adamw.h"
#include "core/ops/gemm.h"
#include "core/thread_pool.h"
#include "data/batches.h"
#include "data/dataset.h"
#include "data/mqar.h"
#include "data/stream.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "parallel/pipeline.h"
#include "worker/checkpoint.h"
#include "worker/jsonl_writer.h"
#include "worker/checkpoint_dir.h"
#include "worker/cli_util.h"
#include "worker/mesh_groups.h"
#include "worker/rank_agreement.h"

namespace satdar::worker {

namespace {

using Json = nlohmann::json;

int64_t PeakRssBytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}


// Mean cross-entropy on the first eval_batches batches of the validation split.
template <typename T>
class Validator {
 public:
  static absl::StatusOr<std::unique_ptr<Validator>> Create(const TrainOptions& o,
                                                           model::Model<T>* model) {
    if (o.eval_every <= 0) return std::unique_ptr<Validator>();
    auto v = std::unique_ptr<Validator>(new Validator(o, model));
    SATDAR_ASSIGN_OR_RETURN(v->source_, OpenEvalData(o));
    return v;
  }
  // Every rank of a replica takes part; with pipeline stages the batches flow through the
  // pipeline and the last stage's mean reaches every stage.
  absl::StatusOr<double> Loss(const T* params, parallel::PipelineSchedule<T>* pipeline,
                              parallel::Communicator* pp) {
    double sum = 0;
    if (pipeline == nullptr) {
      for (int i = 0; i < batches_; ++i) {
        source_->Batch(0, 0, static_cast<int64_t>(i) * batch_, batch_, seq_len_, tokens_.data());
        model_->Forward(params, tokens_.data(), batch_, seq_len_);
        SATDAR_RETURN_IF_ERROR(model_->comm_status());
        sum += model_->last_cross_entropy();
      }
      return sum / batches_;
    }
    std::vector<std::vector<int32_t>> all(batches_, tokens_);
    for (int i = 0; i < batches_; ++i) {
      source_->Batch(0, 0, static_cast<int64_t>(i) * batch_, batch_, seq_len_, all[i].data());
    }
    SATDAR_ASSIGN_OR_RETURN(
        sum, pipeline->ForwardOnly(params, [&](int mb) { return all[mb].data(); }, batches_,
                                   batch_, seq_len_));
    SATDAR_RETURN_IF_ERROR(
        pp->AllReduce(&sum, 1, core::DType::kF64, parallel::ReduceOp::kSum, copts_)->Wait());
    return sum / batches_;
  }

 private:
  Validator(const TrainOptions& o, model::Model<T>* model)
      : copts_{absl::Seconds(o.comm_timeout_seconds), nullptr},
        model_(model), batches_(o.eval_batches), batch_(o.batch_size / o.microbatches),
        seq_len_(o.seq_len), tokens_(static_cast<size_t>(batch_) * (o.seq_len + 1)) {}
  const parallel::CollectiveOptions copts_;
  model::Model<T>* model_;
  const int batches_, batch_, seq_len_;
  std::vector<int32_t> tokens_;
  std::unique_ptr<data::BatchSource> source_;
};

// What one rank's parameters mean for reductions and the gradient norm.
struct ParamRoles {
  std::vector<std::pair<int64_t, int64_t>> tp_partial;  // (offset, numel): summed over TP
  // The flat buffer as maximal runs of replicated weights (averaged over the data group) and
  // of routed experts' (averaged over dp only).
  std::vector<std::pair<int64_t, int64_t>> dense, experts;
  std::pair<int64_t, int64_t> tied_embedding{-1, 0};    // on both end stages of a pipeline
  std::vector<uint8_t> in_norm;  // per element: counted once in the global gradient norm
};

ParamRoles RolesOf(const model::ParamTable& table, const MeshGroups& g, bool tied) {
  ParamRoles r;
  r.in_norm.assign(table.size(), 0);
  const bool pipeline = g.shape.pp > 1;
  for (const model::ParamSpec& spec : table.specs()) {
    if (spec.tp_partial_grad) r.tp_partial.emplace_back(spec.offset, spec.numel);
    auto& runs = spec.expert ? r.experts : r.dense;
    if (!runs.empty() && runs.back().first + runs.back().second == spec.offset) {
      runs.back().second += spec.numel;
    } else {
      runs.emplace_back(spec.offset, spec.numel);
    }
    const bool embedding = spec.name == "model.embed_tokens.weight";
    if (embedding && tied && pipeline) r.tied_embedding = {spec.offset, spec.numel};
    // Replicated copies count once: on TP rank 0 (unless sharded), EP rank 0 (unless an
    // expert), and the first pipeline stage for a tied embedding.
    bool counted = (spec.sharded() || g.coord.tp == 0) && (spec.expert || g.coord.ep == 0);
    if (embedding && tied && pipeline && g.coord.pp != 0) counted = false;
    if (counted) std::fill(r.in_norm.begin() + spec.offset,
                           r.in_norm.begin() + spec.offset + spec.numel, 1);
  }
  return r;
}

template <typename T>
absl::StatusOr<TrainSummary> TrainTyped(const TrainOptions& options) {
  TrainOptions o = options;
  parallel::CollectiveOptions copts;
  copts.timeout = absl::Seconds(o.comm_timeout_seconds);
  // Before anything else talks: every rank must have been started with the same run.
  SATDAR_RETURN_IF_ERROR(CheckSameOnEveryRank(o.world, RunFingerprint(o), copts));
  SATDAR_ASSIGN_OR_RETURN(MeshGroups g, BuildMeshGroups(o.world, o.mesh, copts));
  const parallel::MeshShape& mesh = g.shape;
  const int rank = g.rank;
  const int replicas = g.data_size(), replica = g.data_rank();
  // Only rank 0 prints, logs and writes the summary.
  if (rank != 0) {
    o.quiet = true;
    o.log_jsonl.clear();
    o.summary_json.clear();
  }
  if (o.zero_stage == 1 && mesh.ep > 1) {
    return absl::InvalidArgumentError(
        "--zero 1 with --ep > 1 is not supported (expert weights are reduced over a different "
        "group); use --zero 0");
  }
  core::cpu::InitBlas();
  core::ThreadPool pool(o.threads);
  model::CommErrors comm_errors;
  model::Sharding shard;
  shard.tp = g.tp.get();
  shard.tp_rank = g.coord.tp;
  shard.tp_size = mesh.tp;
  shard.ep = g.ep.get();
  shard.ep_rank = g.coord.ep;
  shard.ep_size = mesh.ep;
  shard.pp_rank = g.coord.pp;
  shard.pp_size = mesh.pp;
  shard.errors = &comm_errors;
  shard.collective = copts;
  // One model instance per micro-batch a pipeline stage keeps in flight (1F1B).
  const int slots = mesh.pp > 1 ? std::min(mesh.pp - g.coord.pp, o.microbatches) : 1;
  std::vector<std::unique_ptr<model::Model<T>>> models;
  for (int i = 0; i < slots; ++i) {
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<model::Model<T>> m,
                            model::CreateModel<T>(o.config, shard, &pool));
    models.push_back(std::move(m));
  }
  model::Model<T>* model = models[0].get();
  std::unique_ptr<parallel::PipelineSchedule<T>> pipeline;
  if (mesh.pp > 1) {
    std::vector<model::Model<T>*> raw;
    for (auto& m : models) raw.push_back(m.get());
    pipeline = std::make_unique<parallel::PipelineSchedule<T>>(g.pp.get(), raw, copts);
  }
  const model::ParamTable& table = model->params();
  const int64_t n = table.size();
  const ParamRoles roles = RolesOf(table, g, o.config.tie_word_embeddings);

  // Data: the training source, and the validation split for --eval-every.
  std::string data_description;
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<data::BatchSource> source,
                          OpenTrainingData(o, &data_description));
  if (!o.quiet) std::printf("data: %s\n", data_description.c_str());
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<Validator<T>> validator,
                          Validator<T>::Create(o, model));

  // State: flat parameter, gradient and moment buffers carved by this rank's param table.
  // With ZeRO-1 the flat buffers are padded to a multiple of the replicas and this replica
  // owns [lo, hi); its moments cover only that slice.
  const bool zero = o.zero_stage == 1 && replicas > 1;
  const int64_t shard_len = zero ? (n + replicas - 1) / replicas : n;
  const int64_t padded = zero ? shard_len * replicas : n;
  const int64_t lo = zero ? replica * shard_len : 0;
  std::vector<T> params(padded, T(0)), grads(padded, T(0));
  std::vector<T> exp_avg(zero ? 0 : n, T(0)), exp_avg_sq(zero ? 0 : n, T(0));
  std::vector<T> m_shard(zero ? shard_len : 0, T(0)), v_shard(zero ? shard_len : 0, T(0)), g_shard;
  table.Initialize(params.data(), o.seed);
  OptimizerBuffers<T> buffers{&params, &exp_avg, &exp_avg_sq};
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  // Full moments for a checkpoint under ZeRO-1 (every replica takes part in the gather).
  auto gather_moments = [&]() -> absl::Status {
    if (!zero) return absl::OkStatus();
    exp_avg.assign(padded, T(0));
    exp_avg_sq.assign(padded, T(0));
    SATDAR_RETURN_IF_ERROR(
        g.data->AllGather(m_shard.data(), exp_avg.data(), shard_len, kDType, copts)->Wait());
    return g.data->AllGather(v_shard.data(), exp_avg_sq.data(), shard_len, kDType, copts)->Wait();
  };
  // What only rank 0 can check, shared so that every rank ends with its error: the outputs it
  // writes, and the checkpoint folder, which is this run's for its lifetime (rank 0 holds the
  // lock).
  std::unique_ptr<CheckpointDirLock> hold;
  absl::Status ready;
  if (rank == 0) {
    ready = CheckOutput("--log-jsonl", o.log_jsonl, false, {});
    if (ready.ok()) ready = CheckOutput("--summary-json", o.summary_json, false, {});
    if (ready.ok() && !o.checkpoint_dir.empty()) {
      std::string note;
      auto acquired = CheckpointDirLock::Acquire(o.checkpoint_dir, o.resume, &note,
                                                 absl::Seconds(o.lock_wait_seconds));
      ready = acquired.status();
      if (acquired.ok()) hold = std::move(*acquired);
      if (!note.empty() && !o.quiet) std::printf("checkpoints: %s\n", note.c_str());
    }
  }
  SATDAR_RETURN_IF_ERROR(ShareStatus(o.world, 0, ready, copts));
  int64_t start_step = 0;
  double resumed_loss = 0;
  int64_t first_sample = 0;  // samples consumed by all replicas before the first step of this run
  const std::string config_json = model::ModelConfigToJson(o.config);
  const std::string trainer_json = TrainerJson(o);
  if (o.resume) {
    SATDAR_ASSIGN_OR_RETURN(std::string latest, FindLatestCheckpoint(o.checkpoint_dir));
    if (latest.empty()) {
      if (!o.quiet) std::printf("resume: no checkpoint in %s, starting at step 0\n",
                                o.checkpoint_dir.c_str());
    } else {
      if (zero) {
        exp_avg.assign(padded, T(0));
        exp_avg_sq.assign(padded, T(0));
      }
      SATDAR_ASSIGN_OR_RETURN(CheckpointInfo info,
                              LoadCheckpoint<T>(latest, config_json, table, buffers));
      if (zero) {  // keep this replica's slice of the moments
        std::copy(exp_avg.begin() + lo, exp_avg.begin() + lo + shard_len, m_shard.begin());
        std::copy(exp_avg_sq.begin() + lo, exp_avg_sq.begin() + lo + shard_len, v_shard.begin());
        exp_avg.clear();
        exp_avg_sq.clear();
      }
      SATDAR_RETURN_IF_ERROR(CheckSameRun(info, latest, trainer_json, o.seed));
      start_step = info.step;
      resumed_loss = info.loss;
      first_sample = info.data_position;
      if (!o.quiet) std::printf("resume: %s (step %lld, %lld samples consumed)\n", latest.c_str(),
                                static_cast<long long>(start_step),
                                static_cast<long long>(first_sample));
    }
  }

  JsonlWriter log;
  if (!o.log_jsonl.empty()) SATDAR_RETURN_IF_ERROR(log.Open(o.log_jsonl));
  if (!o.quiet) {
    std::printf("model: %s residual, %lld parameters on rank 0 (%s); batch %d x %d tokens per "
                "replica, %d micro-batch(es), %d thread(s), %s\n",
                o.config.residual.c_str(), static_cast<long long>(n), mesh.ToString().c_str(),
                o.batch_size, o.seq_len, o.microbatches, o.threads, o.f64 ? "f64" : "f32");
    std::fflush(stdout);
  }

  // Gradient reduction over the replicas. Without pipeline or expert parallelism it overlaps
  // the backward pass: layer i's slice of the flat buffer is all-reduced as soon as the
  // backward pass is done with it.
  std::vector<int64_t> layer_start;
  for (int i = 0; i < o.config.num_hidden_layers; ++i) {
    const model::ParamSpec* first =
        table.Find(absl::StrCat("model.layers.", i, ".input_layernorm.weight"));
    if (first != nullptr) layer_start.push_back(first->offset);
  }
  const model::ParamSpec* final_norm = table.Find("model.norm.weight");
  layer_start.push_back(final_norm != nullptr ? final_norm->offset : n);
  std::vector<std::unique_ptr<parallel::Work>> pending;
  auto reduce_range = [&](int64_t begin, int64_t end) {
    pending.push_back(g.data->AllReduce(grads.data() + begin, end - begin, kDType,
                                        parallel::ReduceOp::kAvg, copts));
  };
  const bool overlap = replicas > 1 && !zero && mesh.pp == 1 && mesh.ep == 1;

  // Pipeline boundaries: what each one carries, once.
  if (!o.quiet && mesh.pp > 1) {
    const int per_stage = o.config.num_hidden_layers / mesh.pp;
    std::printf("pipeline: %d stages of %d layers, 1F1B over %d micro-batches\n", mesh.pp,
                per_stage, o.microbatches);
  }

  std::vector<std::vector<int32_t>> micro(o.microbatches);
  data::BatchStream stream(source.get(), {o.seq_len, o.batch_size, o.microbatches, replica,
                                          replicas, start_step + 1, first_sample});
  TrainSummary summary;
  double timed_seconds = 0;
  int64_t timed_tokens = 0;
  const int64_t tokens_per_step = static_cast<int64_t>(o.batch_size) * replicas * o.seq_len;
  const int mb_size = o.batch_size / o.microbatches;
  auto fail = [&](const absl::Status& s, int64_t step) {
    return absl::Status(s.code(), absl::StrCat("rank ", rank, " (", mesh.ToString(), "), step ",
                                               step, ": ", s.message()));
  };
  for (int64_t step = start_step + 1; step <= o.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    std::fill(grads.begin(), grads.end(), T(0));
    double loss = 0;
    for (int mb = 0; mb < o.microbatches; ++mb) stream.Next(&micro[mb]);
    if (pipeline != nullptr) {
      absl::StatusOr<double> sum = pipeline->Step(
          params.data(), grads.data(), [&](int mb) { return micro[mb].data(); }, o.microbatches,
          mb_size, o.seq_len);
      if (!sum.ok()) return fail(sum.status(), step);
      loss = *sum;
    } else {
      for (int mb = 0; mb < o.microbatches; ++mb) {
        loss += model->Forward(params.data(), micro[mb].data(), mb_size, o.seq_len);
        const bool last_micro = mb + 1 == o.microbatches;
        if (overlap && last_micro) {
          model->SetLayerGradientsReadyHook(
              [&](int layer) { reduce_range(layer_start[layer], layer_start[layer + 1]); });
        }
        model->Backward(params.data(), grads.data(), 1.0 / o.microbatches);
        if (overlap && last_micro) {
          model->SetLayerGradientsReadyHook(nullptr);
          // What the hook did not cover: embedding, globals and layer 0; final norm and head.
          reduce_range(0, layer_start.size() > 2 ? layer_start[1] : layer_start.back());
          reduce_range(layer_start.back(), n);
        }
        if (!model->comm_status().ok()) return fail(model->comm_status(), step);
      }
    }
    loss /= o.microbatches;
    auto wait = [&](std::unique_ptr<parallel::Work> w) -> absl::Status {
      absl::Status s = w->Wait();
      return s.ok() ? s : fail(s, step);
    };
    // The loss: each pipeline stage holds its share, each replica its own.
    if (g.pp) {
      SATDAR_RETURN_IF_ERROR(wait(
          g.pp->AllReduce(&loss, 1, core::DType::kF64, parallel::ReduceOp::kSum, copts)));
    }
    if (g.data) {
      SATDAR_RETURN_IF_ERROR(wait(
          g.data->AllReduce(&loss, 1, core::DType::kF64, parallel::ReduceOp::kAvg, copts)));
    }
    for (auto& w : pending) SATDAR_RETURN_IF_ERROR(wait(std::move(w)));
    pending.clear();
    // Gradients: TP partial sums, the tied embedding's two pipeline copies, then the replicas.
    if (g.tp && !roles.tp_partial.empty()) {
      // One all-reduce for all of them (q/k norms, ResFormer lambdas: a few numbers a layer).
      std::vector<T> packed;
      for (const auto& [off, len] : roles.tp_partial) {
        packed.insert(packed.end(), grads.begin() + off, grads.begin() + off + len);
      }
      SATDAR_RETURN_IF_ERROR(wait(g.tp->AllReduce(packed.data(), packed.size(), kDType,
                                                  parallel::ReduceOp::kSum, copts)));
      size_t k = 0;
      for (const auto& [off, len] : roles.tp_partial) {
        std::copy(packed.begin() + k, packed.begin() + k + len, grads.begin() + off);
        k += len;
      }
    }
    if (roles.tied_embedding.first >= 0 && (g.coord.pp == 0 || g.coord.pp == mesh.pp - 1)) {
      const auto [off, len] = roles.tied_embedding;
      const int peer = g.coord.pp == 0 ? mesh.pp - 1 : 0;
      std::vector<T> other(len);
      auto sent = g.pp->Send(grads.data() + off, len, kDType, peer, 7, copts);
      SATDAR_RETURN_IF_ERROR(wait(g.pp->Recv(other.data(), len, kDType, peer, 7, copts)));
      SATDAR_RETURN_IF_ERROR(wait(std::move(sent)));
      // Both stages add in the same order (first stage's part + last stage's part).
      T* mine = grads.data() + off;
      for (int64_t i = 0; i < len; ++i) {
        mine[i] = g.coord.pp == 0 ? mine[i] + other[i] : other[i] + mine[i];
      }
    }
    if (g.data && !overlap && !zero) {
      // Expert weights already hold every EP rank's tokens: average over dp only, and divide
      // by ep, as the loss is the mean over all dp x ep replicas.
      std::vector<std::unique_ptr<parallel::Work>> works;
      for (const auto& [off, len] : roles.dense) {
        works.push_back(g.data->AllReduce(grads.data() + off, len, kDType,
                                          parallel::ReduceOp::kAvg, copts));
      }
      for (const auto& [off, len] : roles.experts) {
        if (g.dp) {
          works.push_back(g.dp->AllReduce(grads.data() + off, len, kDType,
                                          parallel::ReduceOp::kAvg, copts));
        }
      }
      for (auto& w : works) SATDAR_RETURN_IF_ERROR(wait(std::move(w)));
      for (const auto& [off, len] : roles.experts) {
        for (int64_t i = 0; i < len; ++i) grads[off + i] /= static_cast<T>(mesh.ep);
      }
    } else if (zero) {
      g_shard.resize(shard_len);
      SATDAR_RETURN_IF_ERROR(wait(g.data->ReduceScatter(grads.data(), g_shard.data(), shard_len,
                                                        kDType, parallel::ReduceOp::kAvg, copts)));
    }
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("step ", step, ": loss is ", loss,
                                              "; lower --lr or check the data"));
    }
    // The global gradient norm: every element once (replicated copies counted on one rank),
    // summed over the model pieces (and under ZeRO-1 over the replicas' slices).
    const T* gv = zero ? g_shard.data() : grads.data();
    const int64_t owned = zero ? shard_len : n;
    double sq = 0;
    for (int64_t i = 0; i < owned; ++i) {
      if (lo + i < n && roles.in_norm[lo + i]) sq += static_cast<double>(gv[i]) * gv[i];
    }
    if (zero) {
      SATDAR_RETURN_IF_ERROR(
          wait(g.data->AllReduce(&sq, 1, core::DType::kF64, parallel::ReduceOp::kSum, copts)));
    }
    if (g.mp) {
      SATDAR_RETURN_IF_ERROR(
          wait(g.mp->AllReduce(&sq, 1, core::DType::kF64, parallel::ReduceOp::kSum, copts)));
    }
    double grad_norm = std::sqrt(sq);
    const core::AdamWParams hp = AdamWStep(o, step, grad_norm);
    if (zero) {
      // Update this replica's slice, then every replica gathers the whole parameter buffer.
      core::cpu::AdamWUpdate(params.data() + lo, g_shard.data(), m_shard.data(), v_shard.data(),
                             shard_len, hp, &pool);
      std::vector<T> mine(params.begin() + lo, params.begin() + lo + shard_len);
      SATDAR_RETURN_IF_ERROR(
          wait(g.data->AllGather(mine.data(), params.data(), shard_len, kDType, copts)));
    } else {
      core::cpu::AdamWUpdate(params.data(), grads.data(), exp_avg.data(), exp_avg_sq.data(), n,
                             hp, &pool);
    }
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double tps = tokens_per_step / seconds;
    // The first step of a process pays for allocation; it is left out of the average.
    if (step > start_step + 1 || o.steps == start_step + 1) {
      timed_seconds += seconds;
      timed_tokens += tokens_per_step;
    }
    summary.final_loss = loss;
    Json line = {{"step", step},
                 {"loss", loss},
                 {"lr", hp.lr},
                 {"grad_norm", grad_norm},
                 {"tokens", step * tokens_per_step},
                 {"tokens_per_second", tps},
                 {"step_seconds", seconds}};
    if (pipeline != nullptr) {
      // Bytes each stage boundary carried this step: [activations forward, gradients back].
      std::vector<int64_t> mine = {pipeline->forward_bytes(), pipeline->backward_bytes()};
      std::vector<int64_t> all(2 * mesh.pp);
      SATDAR_RETURN_IF_ERROR(
          wait(g.pp->AllGather(mine.data(), all.data(), 2, core::DType::kI64, copts)));
      Json boundaries = Json::array();
      for (int s = 0; s + 1 < mesh.pp; ++s) boundaries.push_back({all[2 * s], all[2 * s + 3]});
      line["pp_boundary_bytes"] = boundaries;
    }
    if (o.world != nullptr) {
      // Payload bytes this rank handed to each of its groups this step (rank 0's view).
      Json bytes = Json::object();
      for (const auto& [name, comm] :
           {std::pair<const char*, parallel::CountingCommunicator*>{"tp", g.tp.get()},
            {"pp", g.pp.get()}, {"ep", g.ep.get()}, {"data", g.data.get()}, {"mp", g.mp.get()}}) {
        if (comm != nullptr) bytes[name] = comm->TakeBytes();
      }
      line["comm_bytes"] = bytes;
    }
    if (validator && step % o.eval_every == 0) {
      absl::StatusOr<double> val = validator->Loss(params.data(), pipeline.get(), g.pp.get());
      if (!val.ok()) return fail(val.status(), step);
      line["val_loss"] = *val;
      if (!o.quiet) {
        std::printf("step %5lld/%lld | validation loss %.4f\n", static_cast<long long>(step),
                    static_cast<long long>(o.steps), *val);
      }
    }
    if (o.stats_every > 0 && step % o.stats_every == 0) {
      Json stats = Json::object();
      model->AppendStats(&stats);
      for (auto& m : models) m->ResetStats();
      line["stats"] = stats;
    }
    if (absl::Status s = log.Write(line); !s.ok()) return fail(s, step);
    if (!o.quiet && (step % o.log_every == 0 || step == o.steps || step == start_step + 1)) {
      std::printf("step %5lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s\n",
                  static_cast<long long>(step), static_cast<long long>(o.steps), loss, hp.lr,
                  grad_norm, tps);
      std::fflush(stdout);
    }
    bool last = step == o.steps;
    const bool checkpoint = !o.checkpoint_dir.empty() &&
                            ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || last);
    if (checkpoint) SATDAR_RETURN_IF_ERROR(gather_moments());
    if (checkpoint && g.coord.dp == 0) {
      // Replicas hold identical weights and moments: replica 0's pieces are the whole state.
      const int64_t consumed = first_sample + (step - start_step) * o.batch_size * replicas;
      CheckpointInfo info{step, o.seed, consumed, config_json, trainer_json, loss};
      if (g.mp == nullptr && g.coord.ep == 0) {
        SATDAR_RETURN_IF_ERROR(SaveCheckpoint<T>(o.checkpoint_dir, info, table, buffers));
      } else if (g.mp != nullptr) {
        const std::string name = absl::StrCat("tp", g.coord.tp, "-pp", g.coord.pp, "-ep",
                                              g.coord.ep);
        absl::Status s =
            SaveShardedCheckpoint<T>(o.checkpoint_dir, info, table, buffers, name, g.mp.get(), copts);
        if (!s.ok()) return fail(s, step);
      }
      if (rank == 0) SATDAR_RETURN_IF_ERROR(PruneCheckpoints(o.checkpoint_dir, o.keep_checkpoints));
    }
    if (zero && checkpoint) {  // the gathered moments were only needed for the file
      exp_avg.clear();
      exp_avg.shrink_to_fit();
      exp_avg_sq.clear();
      exp_avg_sq.shrink_to_fit();
    }
  }
  if (o.world != nullptr) {
    absl::Status s = o.world->Barrier(copts)->Wait();
    if (!s.ok()) return fail(s, o.steps);
  }
  summary.steps = o.steps;
  if (start_step >= o.steps) {
    // --resume of a run that already finished: nothing to train; the summary says so and
    // carries the final loss stored in the last checkpoint.
    summary.final_loss = resumed_loss;
    summary.already_complete = true;
    if (!o.quiet) {
      std::printf("resume: the run already finished all %lld steps; nothing to train\n",
                  static_cast<long long>(o.steps));
    }
  }
  summary.tokens_per_second = timed_seconds > 0 ? timed_tokens / timed_seconds : 0;
  summary.peak_rss_bytes = PeakRssBytes();
  if (!o.summary_json.empty()) {
    Json j = {{"steps", summary.steps},
              {"final_loss", summary.final_loss},
              {"tokens_per_second", summary.tokens_per_second},
              {"peak_rss_bytes", summary.peak_rss_bytes},
              {"parameters", n},
              {"threads", o.threads},
              {"data_parallel", replicas},
              {"mesh", {{"dp", mesh.dp}, {"tp", mesh.tp}, {"pp", mesh.pp}, {"ep", mesh.ep}}},
              {"already_complete", summary.already_complete}};
    absl::Status s = core::WriteFileAtomically(o.summary_json, j.dump(2) + "\n");
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--summary-json: ", s.message()));
  }
  return summary;
}

}  // namespace

Fingerprint RunFingerprint(const TrainOptions& o) {
  auto num = [](double v) { return absl::StrFormat("%.17g", v); };
  return {{"--config (model config)", model::ModelConfigToJson(o.config)},
          {"--seed", std::to_string(o.seed)},
          {"--steps", std::to_string(o.steps)},
          {"--batch-size", std::to_string(o.batch_size)},
          {"--seq-len", std::to_string(o.seq_len)},
          {"--microbatches", std::to_string(o.microbatches)},
          {"--dtype", o.f64 ? "f64" : "f32"},
          {"--dp/--tp/--pp/--ep", o.mesh.ToString()},
          {"--zero", std::to_string(o.zero_stage)},
          {"--lr", num(o.lr)},
          {"--min-lr-ratio", num(o.min_lr_ratio)},
          {"--warmup-steps", std::to_string(o.warmup_steps)},
          {"--weight-decay", num(o.weight_decay)},
          {"--beta1", num(o.beta1)},
          {"--beta2", num(o.beta2)},
          {"--eps", num(o.eps)},
          {"--grad-clip", num(o.grad_clip)},
          // What the data is, not where: nodes may mount it at different paths.
          {"--data", o.synthetic_data ? "synthetic" : o.data_dir.empty() ? "none" : "a folder"},
          {"--data-format", o.data_format},
          {"--task", o.mqar.has_value() ? absl::StrCat("mqar ", o.mqar->keys, "/", o.mqar->values, "/", o.mqar->pairs, "/", o.mqar->queries) : "lm"},
          {"--eval-every", absl::StrCat(o.eval_every, "/", o.eval_batches)},
          {"--stats-every", std::to_string(o.stats_every)},
          {"--checkpoint-dir", o.checkpoint_dir.empty() ? "none" : "a folder"},
          {"--checkpoint-every", absl::StrCat(o.checkpoint_every, "/", o.keep_checkpoints)},
          {"--resume", o.resume ? "true" : "false"},
          {"--comm-timeout", std::to_string(o.comm_timeout_seconds)}};
}

// Hyperparameters that must be the same for a resumed run to continue the same trajectory.
std::string TrainerJson(const TrainOptions& o) {
  using Json = nlohmann::json;
  // The global batch (not the per-replica one, nor micro-batches, which only change rounding):
  // a checkpoint resumes under another parallel layout.
  Json j = {{"steps", o.steps},
            {"global_batch_size", o.batch_size * o.mesh.dp * o.mesh.ep},
            {"seq_len", o.seq_len},
            {"lr", o.lr},                 {"min_lr_ratio", o.min_lr_ratio},
            {"warmup_steps", o.warmup_steps}, {"weight_decay", o.weight_decay},
            {"beta1", o.beta1},           {"beta2", o.beta2},
            {"eps", o.eps},               {"grad_clip", o.grad_clip},
            {"synthetic_data", o.synthetic_data}, {"data_dir", o.data_dir},
            {"task", o.mqar.has_value() ? "mqar" : "lm"}};
  return j.dump();
}

core::AdamWParams AdamWStep(const TrainOptions& o, int64_t step, double grad_norm) {
  core::AdamWParams hp;
  hp.lr = LearningRate(o, step);
  hp.beta1 = o.beta1;
  hp.beta2 = o.beta2;
  hp.eps = o.eps;
  hp.weight_decay = o.weight_decay;
  hp.step = step;
  hp.grad_scale = (o.grad_clip > 0 && grad_norm > o.grad_clip) ? o.grad_clip / grad_norm : 1.0;
  return hp;
}

absl::StatusOr<std::unique_ptr<data::BatchSource>> OpenEvalData(const TrainOptions& o) {
  if (o.synthetic_data || o.mqar.has_value() || !data::Dataset::IsDataset(o.data_dir)) {
    return absl::InvalidArgumentError(
        "--eval-every: validation needs a prepared dataset (--data DIR written by satdar "
        "prep), whose held-out split it reads");
  }
  SATDAR_ASSIGN_OR_RETURN(auto dataset, data::Dataset::Open(o.data_dir, o.config.vocab_size));
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<data::DatasetBatches> split,
                          data::OpenValidation(dataset, o.seq_len, o.seed, "--eval-every"));
  return std::unique_ptr<data::BatchSource>(std::move(split));
}

absl::StatusOr<std::unique_ptr<data::BatchSource>> OpenTrainingData(const TrainOptions& o,
                                                                     std::string* description) {
  if (o.mqar.has_value()) {
    SATDAR_RETURN_IF_ERROR(o.mqar->Validate(o.config.vocab_size, o.seq_len));
    *description = absl::StrCat("MQAR, ", o.mqar->pairs, " pairs of ", o.mqar->keys,
                                " keys and ", o.mqar->values, " values, ", o.mqar->queries,
                                " queries per sequence");
    return std::unique_ptr<data::BatchSource>(std::make_unique<data::MqarBatches>(o.seed, *o.mqar));
  }
  return data::OpenBatchSource(
      {o.synthetic_data, o.data_dir, o.data_format, o.seed, o.config.vocab_size, o.seq_len},
      description);
}

double LearningRate(const TrainOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) {
    return o.lr * static_cast<double>(step) / o.warmup_steps;
  }
  double min_lr = o.lr * o.min_lr_ratio;
  int64_t decay = o.steps - o.warmup_steps;
  if (decay <= 0) return o.lr;
  double progress = static_cast<double>(step - o.warmup_steps) / decay;
  progress = std::min(1.0, std::max(0.0, progress));
  return min_lr + (o.lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

absl::StatusOr<TrainSummary> Train(const TrainOptions& options) {
  return options.f64 ? TrainTyped<double>(options) : TrainTyped<float>(options);
}

}  // namespace satdar::worker
