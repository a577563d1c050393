#include "worker/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
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
#include "worker/checkpoint.h"

namespace satdar::worker {

namespace {

using Json = nlohmann::json;

int64_t PeakRssBytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// Hyperparameters that must be the same for a resumed run to continue the same trajectory.
std::string TrainerJson(const TrainOptions& o) {
  Json j = {{"steps", o.steps},           {"batch_size", o.batch_size},
            {"seq_len", o.seq_len},       {"microbatches", o.microbatches},
            {"lr", o.lr},                 {"min_lr_ratio", o.min_lr_ratio},
            {"warmup_steps", o.warmup_steps}, {"weight_decay", o.weight_decay},
            {"beta1", o.beta1},           {"beta2", o.beta2},
            {"eps", o.eps},               {"grad_clip", o.grad_clip},
            {"synthetic_data", o.synthetic_data}, {"data_dir", o.data_dir},
            {"task", o.mqar.has_value() ? "mqar" : "lm"}};
  return j.dump();
}

// Appends lines to a file, creating it.
class JsonlWriter {
 public:
  absl::Status Open(const std::string& path) {
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--log-jsonl: cannot open ", path));
    }
    return absl::OkStatus();
  }
  void Write(const Json& j) {
    if (file_ == nullptr) return;
    std::fprintf(file_, "%s\n", j.dump().c_str());
    std::fflush(file_);
  }
  ~JsonlWriter() {
    if (file_ != nullptr) std::fclose(file_);
  }

 private:
  FILE* file_ = nullptr;
};

// Mean cross-entropy on the first eval_batches batches of the validation split.
template <typename T>
class Validator {
 public:
  static absl::StatusOr<std::unique_ptr<Validator>> Create(const TrainOptions& o,
                                                           model::Model<T>* model) {
    if (o.eval_every <= 0) return std::unique_ptr<Validator>();
    if (o.synthetic_data || o.mqar.has_value() || !data::Dataset::IsDataset(o.data_dir)) {
      return absl::InvalidArgumentError(
          "--eval-every: validation needs a prepared dataset (--data DIR written by satdar "
          "prep), whose held-out split it reads");
    }
    SATDAR_ASSIGN_OR_RETURN(auto dataset, data::Dataset::Open(o.data_dir, o.config.vocab_size));
    auto v = std::unique_ptr<Validator>(new Validator(o, model));
    SATDAR_ASSIGN_OR_RETURN(v->source_,
                            data::OpenValidation(dataset, o.seq_len, o.seed, "--eval-every"));
    return v;
  }
  double Loss(const T* params) {
    double sum = 0;
    for (int i = 0; i < batches_; ++i) {
      source_->Batch(0, 0, static_cast<int64_t>(i) * batch_, batch_, seq_len_, tokens_.data());
      model_->Forward(params, tokens_.data(), batch_, seq_len_);
      sum += model_->last_cross_entropy();
    }
    return sum / batches_;
  }

 private:
  Validator(const TrainOptions& o, model::Model<T>* model)
      : model_(model), batches_(o.eval_batches), batch_(o.batch_size / o.microbatches),
        seq_len_(o.seq_len), tokens_(static_cast<size_t>(batch_) * (o.seq_len + 1)) {}
  model::Model<T>* model_;
  const int batches_, batch_, seq_len_;
  std::vector<int32_t> tokens_;
  std::unique_ptr<data::DatasetBatches> source_;
};

template <typename T>
absl::StatusOr<TrainSummary> TrainTyped(const TrainOptions& options) {
  // Only rank 0 of a data-parallel run prints, logs and writes checkpoints.
  const int rank = options.dp_comm ? options.dp_comm->rank() : 0;
  const int world = options.dp_comm ? options.dp_comm->size() : 1;
  TrainOptions o = options;
  if (rank != 0) {
    o.quiet = true;
    o.log_jsonl.clear();
    o.summary_json.clear();
  }
  core::cpu::InitBlas();
  core::ThreadPool pool(o.threads);
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<model::Model<T>> model,
                          model::CreateModel<T>(o.config, &pool));
  const model::ParamTable& table = model->params();
  const int64_t n = table.size();

  // Data: the training source, and the validation split for --eval-every.
  std::string data_description;
  std::unique_ptr<data::BatchSource> source;
  if (o.mqar.has_value()) {
    SATDAR_RETURN_IF_ERROR(o.mqar->Validate(o.config.vocab_size, o.seq_len));
    source = std::make_unique<data::MqarBatches>(o.seed, *o.mqar);
    data_description = absl::StrCat("MQAR, ", o.mqar->pairs, " pairs of ", o.mqar->keys,
                                    " keys and ", o.mqar->values, " values, ", o.mqar->queries,
                                    " queries per sequence");
  } else {
    SATDAR_ASSIGN_OR_RETURN(source, data::OpenBatchSource({o.synthetic_data, o.data_dir,
                                                           o.data_format, o.seed,
                                                           o.config.vocab_size, o.seq_len},
                                                          &data_description));
  }
  if (!o.quiet) std::printf("data: %s\n", data_description.c_str());
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<Validator<T>> validator,
                          Validator<T>::Create(o, model.get()));

  // State: flat parameter, gradient and moment buffers carved by the param table.
  // With ZeRO-1 the flat buffers are padded to a multiple of the replicas and this replica
  // owns [lo, hi); its moments cover only that slice.
  const bool zero = o.zero_stage == 1 && world > 1;
  const int64_t shard = zero ? (n + world - 1) / world : n;
  const int64_t padded = zero ? shard * world : n;
  const int64_t lo = zero ? rank * shard : 0;
  std::vector<T> params(padded, T(0)), grads(padded, T(0));
  std::vector<T> exp_avg(zero ? 0 : n, T(0)), exp_avg_sq(zero ? 0 : n, T(0));
  std::vector<T> m_shard(zero ? shard : 0, T(0)), v_shard(zero ? shard : 0, T(0)), g_shard;
  table.Initialize(params.data(), o.seed);
  OptimizerBuffers<T> buffers{&params, &exp_avg, &exp_avg_sq};
  // Full moments for a checkpoint under ZeRO-1 (every replica takes part in the gather).
  auto gather_moments = [&]() -> absl::Status {
    if (!zero) return absl::OkStatus();
    constexpr core::DType kDType = core::DTypeOf<T>::value;
    exp_avg.assign(padded, T(0));
    exp_avg_sq.assign(padded, T(0));
    SATDAR_RETURN_IF_ERROR(
        o.dp_comm->AllGather(m_shard.data(), exp_avg.data(), shard, kDType, {})->Wait());
    return o.dp_comm->AllGather(v_shard.data(), exp_avg_sq.data(), shard, kDType, {})->Wait();
  };
  int64_t start_step = 0;
  int64_t first_sample = 0;  // samples consumed by all ranks before the first step of this run
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
        std::copy(exp_avg.begin() + lo, exp_avg.begin() + lo + shard, m_shard.begin());
        std::copy(exp_avg_sq.begin() + lo, exp_avg_sq.begin() + lo + shard, v_shard.begin());
        exp_avg.clear();
        exp_avg_sq.clear();
      }
      if (info.trainer_json != trainer_json || info.seed != o.seed) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--resume: checkpoint ", latest,
            " was written with different training flags or --seed (", info.trainer_json,
            ", seed ", info.seed, "); resume with the same flags"));
      }
      start_step = info.step;
      first_sample = info.data_position;
      if (!o.quiet) std::printf("resume: %s (step %lld, %lld samples consumed)\n", latest.c_str(),
                                static_cast<long long>(start_step),
                                static_cast<long long>(first_sample));
    }
  }

  JsonlWriter log;
  if (!o.log_jsonl.empty()) SATDAR_RETURN_IF_ERROR(log.Open(o.log_jsonl));
  if (!o.quiet) {
    std::printf("model: %s residual, %lld parameters; batch %d x %d tokens, %d micro-batch(es), "
                "%d thread(s), %s\n",
                o.config.residual.c_str(), static_cast<long long>(n), o.batch_size, o.seq_len,
                o.microbatches, o.threads, o.f64 ? "f64" : "f32");
    std::fflush(stdout);
  }

  // Gradient reduction overlapped with backward (data parallel, without ZeRO): layer i's slice
  // of the flat buffer is all-reduced as soon as the backward pass is done with it.
  std::vector<int64_t> layer_start(o.config.num_hidden_layers + 1);
  for (int i = 0; i < o.config.num_hidden_layers; ++i) {
    layer_start[i] = table.Find(absl::StrCat("model.layers.", i, ".input_layernorm.weight"))->offset;
  }
  layer_start.back() = table.Offset("model.norm.weight");
  std::vector<std::unique_ptr<parallel::Work>> pending;
  auto reduce_range = [&](int64_t begin, int64_t end) {
    pending.push_back(o.dp_comm->AllReduce(grads.data() + begin, end - begin,
                                           core::DTypeOf<T>::value, parallel::ReduceOp::kAvg, {}));
  };
  const bool overlap = world > 1 && !zero;

  std::vector<int32_t> tokens;
  data::BatchStream stream(source.get(), {o.seq_len, o.batch_size, o.microbatches, rank, world,
                                          start_step + 1, first_sample});
  TrainSummary summary;
  double timed_seconds = 0;
  int64_t timed_tokens = 0;
  const int64_t tokens_per_step = static_cast<int64_t>(o.batch_size) * world * o.seq_len;
  for (int64_t step = start_step + 1; step <= o.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    std::fill(grads.begin(), grads.end(), T(0));
    double loss = 0;
    for (int mb = 0; mb < o.microbatches; ++mb) {
      stream.Next(&tokens);
      loss += model->Forward(params.data(), tokens.data(), o.batch_size / o.microbatches,
                             o.seq_len);
      const bool last_micro = mb + 1 == o.microbatches;
      if (overlap && last_micro) {
        model->SetLayerGradientsReadyHook(
            [&](int layer) { reduce_range(layer_start[layer], layer_start[layer + 1]); });
      }
      model->Backward(params.data(), grads.data(), 1.0 / o.microbatches);
      if (overlap && last_micro) {
        model->SetLayerGradientsReadyHook(nullptr);
        // What the hook did not cover: embedding, globals and layer 0; final norm and head.
        reduce_range(0, o.config.num_hidden_layers > 1 ? layer_start[1] : layer_start.back());
        reduce_range(layer_start.back(), n);
      }
    }
    loss /= o.microbatches;
    constexpr core::DType kDType = core::DTypeOf<T>::value;
    if (world > 1) {
      // The global batch's loss; every replica steps with the average gradient.
      SATDAR_RETURN_IF_ERROR(o.dp_comm->AllReduce(&loss, 1, core::DType::kF64,
                                                  parallel::ReduceOp::kAvg, {})->Wait());
      if (overlap) {
        for (auto& w : pending) SATDAR_RETURN_IF_ERROR(w->Wait());
        pending.clear();
      } else if (zero) {
        g_shard.resize(shard);
        SATDAR_RETURN_IF_ERROR(o.dp_comm->ReduceScatter(grads.data(), g_shard.data(), shard,
                                                        kDType, parallel::ReduceOp::kAvg, {})
                                   ->Wait());
      }
    }
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrCat("step ", step, ": loss is ", loss,
                                              "; lower --lr or check the data"));
    }
    // The global gradient norm (under ZeRO-1: the slices' squares, summed over replicas).
    const T* g = zero ? g_shard.data() : grads.data();
    const int64_t owned = zero ? shard : n;
    double sq = 0;
    for (int64_t i = 0; i < owned; ++i) sq += static_cast<double>(g[i]) * g[i];
    if (zero) {
      SATDAR_RETURN_IF_ERROR(
          o.dp_comm->AllReduce(&sq, 1, core::DType::kF64, parallel::ReduceOp::kSum, {})->Wait());
    }
    double grad_norm = std::sqrt(sq);
    core::AdamWParams hp;
    hp.lr = LearningRate(o, step);
    hp.beta1 = o.beta1;
    hp.beta2 = o.beta2;
    hp.eps = o.eps;
    hp.weight_decay = o.weight_decay;
    hp.step = step;
    hp.grad_scale = (o.grad_clip > 0 && grad_norm > o.grad_clip) ? o.grad_clip / grad_norm : 1.0;
    if (zero) {
      // Update this replica's slice, then every replica gathers the whole parameter buffer.
      core::cpu::AdamWUpdate(params.data() + lo, g_shard.data(), m_shard.data(), v_shard.data(),
                             shard, hp, &pool);
      std::vector<T> mine(params.begin() + lo, params.begin() + lo + shard);
      SATDAR_RETURN_IF_ERROR(
          o.dp_comm->AllGather(mine.data(), params.data(), shard, kDType, {})->Wait());
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
    if (validator && step % o.eval_every == 0) {
      line["val_loss"] = validator->Loss(params.data());
      if (!o.quiet) {
        std::printf("step %5lld/%lld | validation loss %.4f\n", static_cast<long long>(step),
                    static_cast<long long>(o.steps), line["val_loss"].get<double>());
      }
    }
    if (o.stats_every > 0 && step % o.stats_every == 0) {
      Json stats = Json::object();
      model->AppendStats(&stats);
      model->ResetStats();
      line["stats"] = stats;
    }
    log.Write(line);
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
    if (rank == 0 && checkpoint) {
      // Replicas hold identical weights and moments: rank 0's checkpoint is the whole state.
      const int64_t consumed = first_sample + (step - start_step) * o.batch_size * world;
      CheckpointInfo info{step, o.seed, consumed, config_json, trainer_json};
      SATDAR_RETURN_IF_ERROR(SaveCheckpoint<T>(o.checkpoint_dir, info, table, buffers));
      SATDAR_RETURN_IF_ERROR(PruneCheckpoints(o.checkpoint_dir, o.keep_checkpoints));
    }
    if (zero && checkpoint) {  // the gathered moments were only needed for the file
      exp_avg.clear();
      exp_avg.shrink_to_fit();
      exp_avg_sq.clear();
      exp_avg_sq.shrink_to_fit();
    }
  }
  if (world > 1) SATDAR_RETURN_IF_ERROR(o.dp_comm->Barrier({})->Wait());
  summary.steps = o.steps;
  summary.tokens_per_second = timed_seconds > 0 ? timed_tokens / timed_seconds : 0;
  summary.peak_rss_bytes = PeakRssBytes();
  if (!o.summary_json.empty()) {
    Json j = {{"steps", summary.steps},
              {"final_loss", summary.final_loss},
              {"tokens_per_second", summary.tokens_per_second},
              {"peak_rss_bytes", summary.peak_rss_bytes},
              {"parameters", n},
              {"threads", o.threads},
              {"data_parallel", world}};
    absl::Status s = core::WriteFileAtomically(o.summary_json, j.dump(2) + "\n");
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--summary-json: ", s.message()));
  }
  return summary;
}

}  // namespace

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
