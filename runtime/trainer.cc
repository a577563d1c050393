#include "runtime/trainer.h"

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
#include "core/timestamp.h"
#include "core/ops/adamw.h"
#include "data/batches.h"
#include "data/dataset.h"
#include "data/mqar.h"
#include "data/stream.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint.h"
#include "runtime/jsonl_writer.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/mesh_groups.h"
#include "runtime/cpu_engine.h"
#include "runtime/cuda_engine.h"
#include "runtime/rank_agreement.h"
#include "runtime/step_engine.h"
#include "runtime/train_observer.h"
#include "model/memory_estimate.h"
#include "model/model.h"
#include "settings/train_settings.h"

namespace satdar::runtime {

namespace {

using Json = nlohmann::json;

int64_t PeakRssBytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// An output file of the run, named by its option ("" when not asked for): writable.
absl::Status CheckOutputOption(const std::string& option, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  absl::Status s = core::CheckOutputFile(path);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(option, ": ", s.message()));
  return absl::OkStatus();
}


// One rank's run of `satdar train`: setup, resume, the steps, checkpoints, the summary, on
// whichever device its engine runs (step_engine.h).
class TrainRun {
 public:
  explicit TrainRun(const TrainOptions& options)
      : o_(options), observer_(options, options.world != nullptr ? options.world->rank() : 0) {
    copts_.timeout = absl::Seconds(o_.comm_timeout_seconds);
  }

  absl::StatusOr<TrainSummary> Run() {
    SATDAR_RETURN_IF_ERROR(Setup());
    for (int64_t step = start_step_ + 1; step <= o_.steps; ++step) {
      absl::Status s = Step(step);
      if (!s.ok()) return Fail(s, step);
    }
    observer_.Finish();
    if (o_.world != nullptr) {
      absl::Status s = o_.world->Barrier(copts_)->Wait();
      if (!s.ok()) return Fail(s, o_.steps);
    }
    return Finish();
  }

 private:
  absl::Status Fail(const absl::Status& s, int64_t step) {
    observer_.Finish();
    engine_->Abandon();
    return absl::Status(s.code(), absl::StrCat("rank ", g_.rank, " (", engine_->Where(),
                                               "), step ", step, ": ", s.message()));
  }

  absl::Status Setup();
  absl::Status HoldOutputs();
  absl::Status Resume();
  absl::Status InitFrom();
  absl::Status DropLoggedStepsAfterResume();
  absl::Status Step(int64_t step);
  absl::Status Log(int64_t step, double loss, const core::AdamWParams& hp, double grad_norm,
                   double seconds, const StepTimes& times);
  absl::Status Checkpoint(int64_t step, double loss);
  std::string Sample(int64_t step, Json* line);
  absl::StatusOr<TrainSummary> Finish();

  TrainOptions o_;
  TrainObserver observer_;
  comm::CollectiveOptions copts_;
  MeshGroups g_;
  std::unique_ptr<StepEngine> engine_;
  std::unique_ptr<data::BatchSource> source_, eval_source_;
  std::unique_ptr<data::BatchStream> stream_;
  std::vector<std::vector<int32_t>> micro_;
  std::unique_ptr<CheckpointDirLock> hold_;
  JsonlWriter log_;
  std::string config_json_, trainer_json_;
  int64_t start_step_ = 0;
  double resumed_loss_ = 0;
  int64_t first_sample_ = 0;  // samples consumed by all replicas before this run's first step
  int64_t tokens_per_step_ = 0;
  double timed_seconds_ = 0;
  int64_t timed_tokens_ = 0;
  // Samples (rank 0, when the command gave o_.sample): the layout the sampler's weights take.
  bool sampling_ = false;
  model::ParamTable sample_table_;
  TrainSummary summary_;
};

absl::Status TrainRun::Setup() {
  // What the device cannot run is refused before any rank talks.
  if (o_.gpu.enabled) SATDAR_RETURN_IF_ERROR(CheckCudaEngine(o_));
  const bool samples = o_.sample_every > 0 && o_.sample != nullptr;
  if (samples) {
    SATDAR_RETURN_IF_ERROR(
        settings::ValidateSampleLayout(o_.config, o_, settings::Spelling::kFields));
  }
  // Metrics are served from the start, so a scrape during the rendezvous gets a valid page.
  SATDAR_RETURN_IF_ERROR(observer_.Start());
  // Before anything else talks: every rank must have been started with the same run.
  SATDAR_RETURN_IF_ERROR(CheckSameOnEveryRank(o_.world, RunFingerprint(o_), copts_));
  SATDAR_ASSIGN_OR_RETURN(g_, BuildMeshGroups(o_.world, o_.mesh, copts_));
  // Only rank 0 prints, logs and writes the summary.
  if (g_.rank != 0) {
    o_.quiet = true;
    o_.log_jsonl.clear();
    o_.summary_json.clear();
  }
  if (o_.gpu.enabled) {
    SATDAR_ASSIGN_OR_RETURN(engine_, CreateCudaEngine(o_, &g_));
  } else {
    SATDAR_ASSIGN_OR_RETURN(engine_, CreateCpuEngine(o_, &g_));
  }
  if (samples && g_.rank == 0) {
    SATDAR_ASSIGN_OR_RETURN(sample_table_, model::BuildParamTable(o_.config, model::Sharding{}));
    sampling_ = true;
  }
  std::string data_description;
  SATDAR_ASSIGN_OR_RETURN(source_, OpenTrainingData(o_, &data_description));
  if (!o_.quiet) std::printf("data: %s\n", data_description.c_str());
  if (o_.eval_every > 0) {
    SATDAR_ASSIGN_OR_RETURN(eval_source_, OpenEvalData(o_));
  }
  config_json_ = model::ModelConfigToJson(o_.config);
  trainer_json_ = TrainerJson(o_);
  SATDAR_RETURN_IF_ERROR(HoldOutputs());
  SATDAR_RETURN_IF_ERROR(Resume());
  if (!o_.log_jsonl.empty()) {
    if (o_.resume) SATDAR_RETURN_IF_ERROR(DropLoggedStepsAfterResume());
    SATDAR_RETURN_IF_ERROR(log_.Open(o_.log_jsonl));
  }
  if (!o_.quiet) {
    std::printf("%s\n", engine_->Describe().c_str());
    std::fflush(stdout);
  }
  micro_.resize(o_.microbatches);
  const int replicas = g_.data_size();
  stream_ = std::make_unique<data::BatchStream>(
      source_.get(), data::StreamLayout{o_.seq_len, o_.batch_size, o_.microbatches,
                                         g_.data_rank(), replicas, start_step_ + 1, first_sample_});
  tokens_per_step_ = static_cast<int64_t>(o_.batch_size) * replicas * o_.seq_len;
  SATDAR_ASSIGN_OR_RETURN(const model::MemoryEstimate whole,
                          model::EstimateMemory(o_.config, model::MemoryShape{}));
  observer_.SetModel(whole.parameters, g_.shape.size(), model::DesignName(o_.config),
                     absl::StrCat("dp=", g_.shape.dp, " tp=", g_.shape.tp, " pp=", g_.shape.pp,
                                  " ep=", g_.shape.ep),
                     engine_->PeakFlops());
  observer_.SetStartStep(start_step_);
  return absl::OkStatus();
}

// What only rank 0 can check, shared so that every rank ends with its error: the outputs it
// writes, and the checkpoint folder, which is this run's for its lifetime (rank 0 holds the
// lock).
absl::Status TrainRun::HoldOutputs() {
  absl::Status ready;
  if (g_.rank == 0) {
    ready = CheckOutputOption("log_jsonl", o_.log_jsonl);
    if (ready.ok()) ready = CheckOutputOption("summary_json", o_.summary_json);
    if (ready.ok() && !o_.checkpoint_dir.empty()) {
      std::string note;
      auto acquired = CheckpointDirLock::Acquire(o_.checkpoint_dir, o_.resume, &note,
                                                 absl::Seconds(o_.lock_wait_seconds));
      ready = acquired.status();
      if (acquired.ok()) hold_ = std::move(*acquired);
      if (!note.empty() && !o_.quiet) std::printf("checkpoints: %s\n", note.c_str());
    }
  }
  return ShareStatus(o_.world, 0, ready, copts_);
}

absl::Status TrainRun::Resume() {
  std::string latest;
  if (o_.resume) {
    SATDAR_ASSIGN_OR_RETURN(latest, FindLatestCheckpoint(o_.checkpoint_dir));
    if (latest.empty() && !o_.quiet && o_.init_from.empty()) {
      std::printf("resume: no checkpoint in %s, starting at step 0\n", o_.checkpoint_dir.c_str());
    }
  }
  if (latest.empty()) return InitFrom();
  SATDAR_ASSIGN_OR_RETURN(CheckpointInfo info,
                          engine_->Load(latest, config_json_, LoadWhat::kFullState));
  SATDAR_ASSIGN_OR_RETURN(const ResumePlan plan, CheckResume(info, latest, trainer_json_, o_.seed,
                                                             o_.warmup_given));
  o_.warmup_steps = plan.warmup_steps;
  trainer_json_ = TrainerJson(o_);  // what this run's checkpoints record
  start_step_ = info.step;
  resumed_loss_ = info.loss;
  first_sample_ = info.data_position;
  if (!o_.quiet) {
    std::printf("resume: %s (step %lld, %lld samples consumed)\n", latest.c_str(),
                static_cast<long long>(start_step_), static_cast<long long>(first_sample_));
    if (!plan.note.empty()) std::printf("resume: %s\n", plan.note.c_str());
    if (!o_.init_from.empty()) {
      std::printf("resume: init_from %s is not used: the run continues its own checkpoint\n",
                  o_.init_from.c_str());
    }
  }
  return absl::OkStatus();
}

// --init-from: another run's weights (any layout), fresh moments, step 0, the data from the
// start.
absl::Status TrainRun::InitFrom() {
  if (o_.init_from.empty()) return absl::OkStatus();
  std::string path = o_.init_from;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const std::string base = path.substr(path.rfind('/') + 1);  // npos + 1 = 0
  if (core::PathKind(path) == "a folder" && base.rfind("ckpt_", 0) != 0) {
    SATDAR_ASSIGN_OR_RETURN(path, FindLatestCheckpoint(o_.init_from));
    if (path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_from: ", o_.init_from, " holds no checkpoint (ckpt_<step>.safetensors or "
          "ckpt_<step>/)"));
    }
  }
  auto info = engine_->Load(path, config_json_, LoadWhat::kWeightsOnly);
  if (!info.ok()) {
    const std::string message(info.status().message());
    return absl::Status(info.status().code(),
                        message.rfind("init_from", 0) == 0 ? message
                                                           : absl::StrCat("init_from: ", message));
  }
  if (!o_.quiet) {
    std::printf("init: weights from %s (step %lld of its run); optimizer moments fresh, starting "
                "at step 0\n",
                path.c_str(), static_cast<long long>(info->step));
  }
  return absl::OkStatus();
}

// A resumed run logs each step once: entries past the resumed step (logged by the attempt
// that died after its last checkpoint) are dropped, the file replaced atomically.
absl::Status TrainRun::DropLoggedStepsAfterResume() {
  SATDAR_ASSIGN_OR_RETURN(const int64_t dropped, DropJsonlStepsAfter(o_.log_jsonl, start_step_));
  if (dropped > 0 && !o_.quiet) {
    std::printf("resume: dropped %lld entries past step %lld from %s\n",
                static_cast<long long>(dropped), static_cast<long long>(start_step_),
                o_.log_jsonl.c_str());
  }
  return absl::OkStatus();
}

absl::Status TrainRun::Step(int64_t step) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  StepTimes times;
  double ignored_collective, ignored_pipeline;  // waits outside the step (evaluation, saving)
  engine_->TakeCommWait(&ignored_collective, &ignored_pipeline);
  const auto t0 = Clock::now();
  for (int mb = 0; mb < o_.microbatches; ++mb) stream_->Next(&micro_[mb]);
  times.data = since(t0);
  const auto t1 = Clock::now();
  SATDAR_ASSIGN_OR_RETURN(const double loss, engine_->ForwardBackward(&micro_));
  times.forward_backward = since(t1);
  engine_->TakeCommWait(&times.fb_comm_wait, &times.fb_pipeline_wait);
  if (!std::isfinite(loss)) {
    return absl::InternalError(
        absl::StrCat("loss is ", loss, "; lower lr (the learning rate) or check the data"));
  }
  const auto t2 = Clock::now();
  SATDAR_ASSIGN_OR_RETURN(const double grad_norm, engine_->GradNorm());
  const core::AdamWParams hp = AdamWStep(o_, step, grad_norm);
  SATDAR_RETURN_IF_ERROR(engine_->Update(hp));
  times.optimizer = since(t2);
  engine_->TakeCommWait(&times.opt_comm_wait, &times.opt_pipeline_wait);
  const double seconds = since(t0);
  // The first step of a process pays for allocation; it is left out of the average.
  if (step > start_step_ + 1 || o_.steps == start_step_ + 1) {
    timed_seconds_ += seconds;
    timed_tokens_ += tokens_per_step_;
  }
  summary_.final_loss = loss;
  SATDAR_RETURN_IF_ERROR(Log(step, loss, hp, grad_norm, seconds, times));
  const auto t3 = Clock::now();
  SATDAR_RETURN_IF_ERROR(Checkpoint(step, loss));
  observer_.OnCheckpoint(since(t3));
  return absl::OkStatus();
}

absl::Status TrainRun::Log(int64_t step, double loss, const core::AdamWParams& hp,
                           double grad_norm, double seconds, const StepTimes& times) {
  const double tps = tokens_per_step_ / seconds;
  Json line = {{"step", step},
               {"time", core::UtcTimestamp()},
               {"loss", loss},
               {"lr", hp.lr},
               {"grad_norm", grad_norm},
               {"tokens", step * tokens_per_step_},
               {"tokens_per_second", tps},
               {"step_seconds", seconds}};
  SATDAR_RETURN_IF_ERROR(engine_->AddToLog(&line));
  if (eval_source_ != nullptr && step % o_.eval_every == 0) {
    SATDAR_ASSIGN_OR_RETURN(const double val,
                            engine_->ValidationLoss(eval_source_.get(), o_.eval_batches));
    line["val_loss"] = val;
    observer_.Print(absl::StrFormat("step %5lld/%lld | validation loss %.4f",
                                    static_cast<long long>(step), static_cast<long long>(o_.steps),
                                    val));
  }
  if (o_.stats_every > 0 && step % o_.stats_every == 0) {
    SATDAR_RETURN_IF_ERROR(engine_->AddStats(&line));
  }
  // After the step's timing and validation: the sample costs the step nothing it measures.
  const bool sample_due = sampling_ && (step % o_.sample_every == 0 || step == o_.steps);
  const std::string sample = sample_due ? Sample(step, &line) : "";
  observer_.OnStep(step, &line, tokens_per_step_, times);
  if (sample_due) observer_.Print(sample);
  if (o_.may_write && !o_.log_jsonl.empty()) SATDAR_RETURN_IF_ERROR(o_.may_write());
  return log_.Write(line);
}

// Rank 0's sample of this step into the log line ("sample"), and the console's line. A
// copy of the weights goes to the sampler, so the run computes exactly what it would without;
// a failed sample (the tokenizer's process gone) is reported and the training goes on.
std::string TrainRun::Sample(int64_t step, Json* line) {
  absl::StatusOr<std::string> text = [&]() -> absl::StatusOr<std::string> {
    SATDAR_ASSIGN_OR_RETURN(std::vector<float> weights, engine_->WholeWeights(sample_table_));
    return o_.sample(step, std::move(weights));
  }();
  if (text.ok()) {
    (*line)["sample"] = *text;
    return absl::StrCat("step ", step, " sample: ", *text);
  }
  (*line)["sample_error"] = std::string(text.status().message());
  return absl::StrCat("step ", step, " sample failed (training goes on): ",
                      text.status().message());
}

absl::Status TrainRun::Checkpoint(int64_t step, double loss) {
  const bool due = !o_.checkpoint_dir.empty() &&
                   ((o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0) || step == o_.steps);
  if (!due) return absl::OkStatus();
  if (o_.may_write) SATDAR_RETURN_IF_ERROR(o_.may_write());
  const int64_t consumed = first_sample_ + (step - start_step_) * o_.batch_size * g_.data_size();
  SATDAR_RETURN_IF_ERROR(
      engine_->Save({step, o_.seed, consumed, config_json_, trainer_json_, loss}));
  if (g_.rank == 0) SATDAR_RETURN_IF_ERROR(PruneCheckpoints(o_.checkpoint_dir, o_.keep_checkpoints));
  return absl::OkStatus();
}

absl::StatusOr<TrainSummary> TrainRun::Finish() {
  summary_.steps = o_.steps;
  if (start_step_ >= o_.steps) {
    // --resume of a run that already finished: nothing to train; the summary says so and
    // carries the final loss stored in the last checkpoint.
    summary_.final_loss = resumed_loss_;
    summary_.already_complete = true;
    if (!o_.quiet) {
      std::printf("resume: the run already finished all %lld steps; nothing to train\n",
                  static_cast<long long>(o_.steps));
    }
  }
  summary_.tokens_per_second = timed_seconds_ > 0 ? timed_tokens_ / timed_seconds_ : 0;
  summary_.peak_rss_bytes = PeakRssBytes();
  Json j = {{"steps", summary_.steps},
            {"time", core::UtcTimestamp()},
            {"final_loss", summary_.final_loss},
            {"tokens_per_second", summary_.tokens_per_second},
            {"peak_rss_bytes", summary_.peak_rss_bytes},
            {"parameters", engine_->params().packed_size()},
            {"data_parallel", g_.data_size()},
            {"already_complete", summary_.already_complete}};
  engine_->AddToSummary(summary_.tokens_per_second, &j, &summary_);
  if (!o_.summary_json.empty()) {
    absl::Status s = core::WriteFileAtomically(o_.summary_json, j.dump(2) + "\n");
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("summary_json: ", s.message()));
  }
  return summary_;
}

}  // namespace

Fingerprint RunFingerprint(const TrainOptions& o) {
  auto num = [](double v) { return absl::StrFormat("%.17g", v); };
  return {{"model config", model::ModelConfigToJson(o.config)},
          {"seed", std::to_string(o.seed)},
          {"steps", std::to_string(o.steps)},
          {"batch_size", std::to_string(o.batch_size)},
          {"seq_len", std::to_string(o.seq_len)},
          {"microbatches", std::to_string(o.microbatches)},
          {"device", o.gpu.enabled ? "cuda" : "cpu"},
          {"GPU communicator", o.gpu.enabled && o.mesh.size() > 1 ? o.gpu.world_kind : "none"},
          {"recompute", model::Name(o.recompute)},
          {"dtype", o.f64 ? "f64"
                      : o.gpu.enabled && o.gpu.compute == core::DType::kBF16 ? "bf16"
                                                                            : "f32"},
          {"mesh (dp/tp/pp/ep)", o.mesh.ToString()},
          {"zero_stage", std::to_string(o.zero_stage)},
          {"vocab_multiple", std::to_string(o.vocab_multiple)},
          {"sequence_parallel", o.sequence_parallel ? "true" : "false"},
          {"virtual_stages", std::to_string(o.virtual_stages)},
          {"lr", num(o.lr)},
          {"min_lr_ratio", num(o.min_lr_ratio)},
          {"warmup_steps", std::to_string(o.warmup_steps)},
          {"weight_decay", num(o.weight_decay)},
          {"beta1", num(o.beta1)},
          {"beta2", num(o.beta2)},
          {"eps", num(o.eps)},
          {"grad_clip", num(o.grad_clip)},
          // What the data is, not where: nodes may mount it at different paths.
          {"data", o.synthetic_data ? "synthetic" : o.data_dir.empty() ? "none" : "a folder"},
          {"data_format", o.data_format},
          {"task", o.mqar.has_value() ? absl::StrCat("mqar ", o.mqar->keys, "/", o.mqar->values, "/", o.mqar->pairs, "/", o.mqar->queries) : "lm"},
          {"eval_every/eval_batches", absl::StrCat(o.eval_every, "/", o.eval_batches)},
          {"stats_every", std::to_string(o.stats_every)},
          {"checkpoint_dir", o.checkpoint_dir.empty() ? "none" : "a folder"},
          {"checkpoint_every/keep_checkpoints", absl::StrCat(o.checkpoint_every, "/", o.keep_checkpoints)},
          {"resume", o.resume ? "true" : "false"},
          {"init_from", o.init_from.empty() ? "none" : "a checkpoint"},
          {"comm_timeout_seconds", std::to_string(o.comm_timeout_seconds)}};
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
        "eval_every: validation needs a prepared dataset (data_dir written by satdar "
        "prep), whose held-out split it reads");
  }
  SATDAR_ASSIGN_OR_RETURN(auto dataset, data::Dataset::Open(o.data_dir, o.config.vocab_size));
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<data::DatasetBatches> split,
                          data::OpenValidation(dataset, o.seq_len, o.seed, "eval_every"));
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
      {o.synthetic_data, o.data_dir, o.data_format, o.seed, o.config.vocab_size, o.seq_len,
       "data_dir", "seq_len"},
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
  return TrainRun(options).Run();
}

}  // namespace satdar::runtime
