// ParseTrainSettings (train_settings.h): the settings' bounds and the rules between them.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/address.h"
#include "core/check.h"
#include "settings/train_settings.h"

namespace satdar::settings {

namespace {

absl::Status Bad(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

// Sizes, the optimizer and its schedule, cadences.
absl::Status ParseSizes(const SettingValues& v, TrainOptions* o) {
  SATDAR_ASSIGN_OR_RETURN(o->steps, v.GetInt("steps", 1, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(int64_t batch, v.GetInt("batch_size", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t seq, v.GetInt("seq_len", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(int64_t micro, v.GetInt("microbatches", 1, batch));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, v.GetInt("threads", 1, kMaxThreads));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, v.GetInt("seed", 0, kMaxSeed));
  SATDAR_ASSIGN_OR_RETURN(o->lr, v.GetDouble("lr", 0.0, false, 1e3));
  SATDAR_ASSIGN_OR_RETURN(o->min_lr_ratio, v.GetDouble("min_lr_ratio", 0.0, true, 1.0));
  SATDAR_ASSIGN_OR_RETURN(o->weight_decay, v.GetDouble("weight_decay", 0.0, true, 1e3));
  SATDAR_ASSIGN_OR_RETURN(o->beta1, v.GetDouble("beta1", 0.0, true, 0.999999));
  SATDAR_ASSIGN_OR_RETURN(o->beta2, v.GetDouble("beta2", 0.0, true, 0.999999));
  SATDAR_ASSIGN_OR_RETURN(o->eps, v.GetDouble("eps", 0.0, false, 1.0));
  SATDAR_ASSIGN_OR_RETURN(o->grad_clip, v.GetDouble("grad_clip", 0.0, true, 1e12));
  SATDAR_ASSIGN_OR_RETURN(o->log_every, v.GetInt("log_every", 1, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(o->stats_every, v.GetInt("stats_every", 0, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(o->eval_every, v.GetInt("eval_every", 0, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(int64_t eval_batches, v.GetInt("eval_batches", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(o->mqar, TaskFromSettings(v));
  SATDAR_ASSIGN_OR_RETURN(o->checkpoint_every, v.GetInt("checkpoint_every", 0, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(int64_t keep, v.GetInt("keep_checkpoints", 1, 1 << 20));
  o->eval_batches = static_cast<int>(eval_batches);
  o->batch_size = static_cast<int>(batch);
  o->seq_len = static_cast<int>(seq);
  o->microbatches = static_cast<int>(micro);
  o->threads = static_cast<int>(threads);
  o->seed = static_cast<uint64_t>(seed);
  o->keep_checkpoints = static_cast<int>(keep);
  if (v.Has("warmup_steps")) {
    SATDAR_ASSIGN_OR_RETURN(o->warmup_steps, v.GetInt("warmup_steps", 0, kMaxSteps));
    o->warmup_given = true;
  } else {
    o->warmup_steps = o->steps / 10;
  }
  if (o->batch_size % o->microbatches != 0) {
    return Bad(absl::StrCat(v.Name("batch_size"), " ", o->batch_size, " is not divisible by ",
                            v.Name("microbatches"), " ", o->microbatches));
  }
  return absl::OkStatus();
}

// The data source and the dtypes and GPU settings of each device (the device itself is read by
// the command).
absl::Status ParseDataAndDevice(const SettingValues& v, TrainOptions* o) {
  o->synthetic_data = v.GetBool("synthetic_data");
  o->data_dir = v.Get("data");
  o->data_format = v.Get("data_format");
  if (!o->mqar.has_value() && o->synthetic_data == v.Has("data")) {
    return Bad(absl::StrCat("give exactly one of ", v.Name("data"), " DIR or ",
                            v.Name("synthetic_data"), " (or ", v.Name("task"), " mqar)"));
  }
  // Validation reads a prepared dataset's held-out split (checked again when the data opens:
  // a folder of raw text has none either).
  if (o->eval_every > 0 && (o->synthetic_data || o->mqar.has_value())) {
    return Bad(absl::StrCat(
        v.Name("eval_every"), ": validation needs a prepared dataset (", v.Name("data"),
        " DIR written by satdar prep), whose held-out split it reads; ",
        o->mqar.has_value() ? v.Name("task") + " mqar" : v.Name("synthetic_data"), " has none"));
  }
  const bool cuda = absl::StartsWith(v.Get("device"), "cuda");
  if (!cuda && v.Get("dtype") == "bf16") {
    return Bad(absl::StrCat(v.Subject("dtype"), " must be f32 or f64, got 'bf16' (bf16 is for ",
                            v.Name("device"), " cuda)"));
  }
  if (!cuda && v.Has("gpu_comm")) {
    return Bad(absl::StrCat(v.Subject("gpu_comm"), " is for ", v.Name("device"), " cuda"));
  }
  if (cuda && v.Get("dtype") == "f64") {
    return Bad(absl::StrCat(v.Subject("dtype"), " must be bf16 or f32, got 'f64' (f64 is for ",
                            v.Name("device"), " cpu)"));
  }
  return absl::OkStatus();
}

// Logs, checkpoints, metrics and the console.
absl::Status ParseOutputs(const SettingValues& v, TrainOptions* o) {
  o->log_jsonl = v.Get("log_jsonl");
  o->summary_json = v.Get("summary_json");
  o->checkpoint_dir = v.Get("checkpoint_dir");
  o->resume = v.GetBool("resume");
  o->init_from = v.Get("init_from");
  o->quiet = v.GetBool("quiet");
  o->progress = v.Get("progress");
  o->metrics_listen = v.Get("metrics_listen");
  if (!o->metrics_listen.empty()) {
    SATDAR_RETURN_IF_ERROR(
        core::SplitHostPort(o->metrics_listen, v.Name("metrics_listen"), nullptr, nullptr));
  }
  if (v.Has("job_id")) {
    o->job_id = v.Get("job_id");
    // It labels every metric: printable ASCII keeps the exposition valid for any scraper.
    const bool printable = !o->job_id.empty() &&
                           std::all_of(o->job_id.begin(), o->job_id.end(),
                                       [](char ch) { return absl::ascii_isprint(ch); });
    if (!printable || o->job_id.size() > 256) {
      return Bad(absl::StrCat(v.Name("job_id"), " must be 1 to 256 printable ASCII characters"));
    }
  }
  SATDAR_ASSIGN_OR_RETURN(o->peak_tflops, v.GetDouble("peak_tflops", 0.0, true, 1e6));
  if ((o->resume || o->checkpoint_every > 0) && o->checkpoint_dir.empty()) {
    return Bad(absl::StrCat(v.Name("resume"), " and ", v.Name("checkpoint_every"), " need ",
                            v.Name("checkpoint_dir")));
  }
  return absl::OkStatus();
}

// The mesh and what splits the model: ZeRO, recomputation, virtual stages, sequence
// parallelism, the vocabulary multiple.
absl::Status ParseLayout(const SettingValues& v, TrainOptions* o) {
  for (auto [axis, size] : {std::pair<const char*, int*>{"dp", &o->mesh.dp}, {"tp", &o->mesh.tp},
                             {"pp", &o->mesh.pp}, {"ep", &o->mesh.ep}}) {
    SATDAR_ASSIGN_OR_RETURN(int64_t n, v.GetInt(axis, 1, kMaxRanks));
    *size = static_cast<int>(n);
  }
  if (static_cast<int64_t>(o->mesh.dp) * o->mesh.tp * o->mesh.pp * o->mesh.ep > kMaxRanks) {
    return Bad(absl::StrCat(v.Name("dp"), " x ", v.Name("tp"), " x ", v.Name("pp"), " x ",
                            v.Name("ep"), " is more than ", kMaxRanks, " ranks"));
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t timeout, v.GetInt("comm_timeout", 1, 7 * 86400));
  o->comm_timeout_seconds = static_cast<int>(timeout);
  o->zero_stage = v.Get("zero") == "1" ? 1 : 0;
  o->recompute = model::RecomputeNamed(v.Get("recompute"));
  SATDAR_ASSIGN_OR_RETURN(int64_t virtual_stages, v.GetInt("virtual_stages", 1, 64));
  o->virtual_stages = static_cast<int>(virtual_stages);
  if (o->virtual_stages > 1) {
    if (o->mesh.pp < 2) {
      return Bad(absl::StrCat(v.Name("virtual_stages"), " needs ", v.Name("pp"),
                              " 2 or more (the chunks interleave over the pipeline ranks)"));
    }
    if (o->microbatches % o->mesh.pp != 0) {
      return Bad(absl::StrCat(v.Name("virtual_stages"), " ", o->virtual_stages, " needs ",
                              v.Name("microbatches"), " a multiple of ", v.Name("pp"), " ",
                              o->mesh.pp, " (the interleaved schedule moves them in groups of ",
                              v.Name("pp"), "), got ", o->microbatches));
    }
  }
  o->sequence_parallel = v.GetBool("sequence_parallel");
  if (o->sequence_parallel) {
    if (o->mesh.tp < 2) {
      return Bad(absl::StrCat(v.Name("sequence_parallel"), " needs ", v.Name("tp"),
                              " 2 or more (it splits the token rows over the tensor-parallel "
                              "ranks)"));
    }
    const int64_t rows = static_cast<int64_t>(o->batch_size / o->microbatches) * o->seq_len;
    if (rows % o->mesh.tp != 0) {
      return Bad(absl::StrCat(v.Name("sequence_parallel"), ": a micro-batch's ", rows,
                              " tokens (", v.Name("batch_size"), " / ", v.Name("microbatches"),
                              " x ", v.Name("seq_len"), ") are not divisible by ", v.Name("tp"),
                              " ", o->mesh.tp));
    }
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t multiple, v.GetInt("vocab_multiple", 1, 65536));
  o->vocab_multiple = static_cast<int>(multiple);
  return absl::OkStatus();
}

// Samples during training: the cadence, the prompt and its length. A text prompt needs a
// tokenizer, which only a folder of data has (a prepared dataset's, or bytes for raw text).
absl::Status ParseSamples(const SettingValues& v, TrainOptions* o) {
  SATDAR_ASSIGN_OR_RETURN(o->sample_every, v.GetInt("sample_every", 0, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(int64_t tokens, v.GetInt("sample_tokens", 1, kMaxSeqLen));
  o->sample_tokens = static_cast<int>(tokens);
  o->sample_prompt = v.Get("sample_prompt");
  if (o->sample_every == 0) {
    for (const char* s : {"sample_prompt", "sample_tokens"}) {
      if (v.Has(s)) return Bad(absl::StrCat(v.Subject(s), " needs ", v.Name("sample_every"), " N"));
    }
    return absl::OkStatus();
  }
  if (o->sample_prompt.empty()) {
    return Bad(absl::StrCat(v.Name("sample_every"), " needs ", v.Name("sample_prompt"),
                            " TEXT (the text the samples continue)"));
  }
  if (o->synthetic_data || o->mqar.has_value()) {
    return Bad(absl::StrCat(
        v.Name("sample_prompt"), " is text, which only the tokenizer of ", v.Name("data"),
        " DIR (a dataset from satdar prep, or a folder of text read as bytes) can encode; ",
        o->mqar.has_value() ? v.Name("task") + " mqar" : v.Name("synthetic_data"),
        " has no tokenizer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseTrainSettings(const SettingValues& values, TrainOptions* o) {
  SATDAR_RETURN_IF_ERROR(ParseSizes(values, o));
  SATDAR_RETURN_IF_ERROR(ParseDataAndDevice(values, o));
  SATDAR_RETURN_IF_ERROR(ParseOutputs(values, o));
  SATDAR_RETURN_IF_ERROR(ParseLayout(values, o));
  SATDAR_RETURN_IF_ERROR(ParseSamples(values, o));
  SATDAR_ASSIGN_OR_RETURN(o->lock_wait_seconds, values.GetInt("lock_wait", 0, 86400));
  return absl::OkStatus();
}

}  // namespace satdar::settings
