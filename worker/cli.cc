#include "worker/cli.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/device.h"
#include "core/file_util.h"
#include "core/ops/gemm.h"
#include "core/safetensors.h"
#include "model/model.h"
#include "data/prep.h"
#include "parallel/gloo_communicator.h"
#include "parallel/local_communicator.h"
#include "parallel/mesh.h"
#include "parallel/mpi_communicator.h"
#include "worker/checkpoint.h"
#include "worker/eval.h"
#include "worker/flags.h"
#include "worker/gpu_trainer.h"
#include "worker/trainer.h"
#include "worker/weights.h"

namespace satdar::worker {

namespace {

constexpr char kVersion[] = "satdar 0.1.0";

void PrintUsage() {
  std::fprintf(stderr,
               "%s: distributed training for SATFormer, DAR and their baselines\n"
               "usage: satdar <command> [flags]\n"
               "commands:\n"
               "  grad    one forward and backward pass; writes the loss and every gradient\n"
               "  prep    text -> tokenizer + token shards + validation split (a dataset)\n"
               "  train   train a model (a prepared dataset, raw text, MQAR or random tokens)\n"
               "  init    write a model's initial weights (safetensors, MODELS.md names)\n"
               "  eval    loss of given weights; SATFormer gate ablation (--gate-ablation)\n"
               "  export  a checkpoint of any parallel layout -> one weights file\n"
               "  info    parameter count (and list) of a config\n"
               "  version print the version\n"
               "run 'satdar <command> --help' for the flags of a command\n",
               kVersion);
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

// --dtype: true for f64, false for f32.
absl::StatusOr<bool> DtypeIsF64(const FlagSet& flags, const std::string& command) {
  const std::string dtype = flags.Get("--dtype");
  if (dtype != "f32" && dtype != "f64") {
    return absl::InvalidArgumentError(absl::StrCat("satdar ", command,
                                                   ": flag --dtype must be f32 or f64, got '",
                                                   dtype, "'"));
  }
  return dtype == "f64";
}

// --task and the MQAR flags, shared by train and eval.
void DefineTaskFlags(FlagSet* flags) {
  flags->Define("--task", "lm (the data) or mqar (multi-query associative recall)", false, "lm");
  flags->Define("--mqar-keys", "MQAR: distinct key ids", false, "64");
  flags->Define("--mqar-values", "MQAR: distinct value ids", false, "64");
  flags->Define("--mqar-pairs", "MQAR: key-value pairs per sequence", false, "8");
  flags->Define("--mqar-queries", "MQAR: queries per sequence", false, "8");
}

absl::StatusOr<std::optional<data::MqarOptions>> TaskFromFlags(const FlagSet& flags,
                                                               const std::string& command) {
  const std::string task = flags.Get("--task");
  if (task != "lm" && task != "mqar") {
    return absl::InvalidArgumentError(absl::StrCat("satdar ", command,
                                                   ": flag --task must be lm or mqar, got '",
                                                   task, "'"));
  }
  if (task == "lm") return std::optional<data::MqarOptions>();
  data::MqarOptions m;
  SATDAR_ASSIGN_OR_RETURN(int64_t keys, flags.GetInt("--mqar-keys", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t values, flags.GetInt("--mqar-values", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t pairs, flags.GetInt("--mqar-pairs", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t queries, flags.GetInt("--mqar-queries", 1));
  m.keys = static_cast<int>(keys);
  m.values = static_cast<int>(values);
  m.pairs = static_cast<int>(pairs);
  m.queries = static_cast<int>(queries);
  return std::optional<data::MqarOptions>(m);
}

// --- satdar grad -------------------------------------------------------------------------

// Token batch (B, T+1) from a safetensors file, checked against the vocabulary.
absl::StatusOr<std::vector<int32_t>> LoadTokens(const std::string& path, int vocab, int* b,
                                                int* t) {
  auto file = core::SafetensorsFile::Open(path);
  if (!file.ok()) return absl::InvalidArgumentError(absl::StrCat("--tokens: ", file.status().message()));
  const core::SafetensorsEntry* e = file->Find("tokens");
  if (e == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens: ", path, " has no tensor named 'tokens'"));
  }
  if (e->dtype != core::DType::kI32 && e->dtype != core::DType::kI64) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens: ", path, ": tensor 'tokens' has dtype ",
                                                   core::DTypeName(e->dtype),
                                                   ", expected I32 or I64"));
  }
  if (e->shape.size() != 2 || e->shape[0] < 1 || e->shape[1] < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens: ", path, ": tensor 'tokens' has shape ", core::ShapeString(e->shape),
        ", expected [B, T+1] with B >= 1 and T >= 1"));
  }
  *b = static_cast<int>(e->shape[0]);
  *t = static_cast<int>(e->shape[1] - 1);
  std::vector<int32_t> tokens(e->shape[0] * e->shape[1]);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t v = e->dtype == core::DType::kI32 ? static_cast<const int32_t*>(file->data(*e))[i]
                                              : static_cast<const int64_t*>(file->data(*e))[i];
    if (v < 0 || v >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: ", path, ": token id ", v,
                                                     " at flat index ", i,
                                                     " is outside [0, vocab_size=", vocab, ")"));
    }
    tokens[i] = static_cast<int32_t>(v);
  }
  return tokens;
}

template <typename T>
absl::Status RunGradTyped(const model::ModelConfig& config, const FlagSet& flags, int threads) {
  core::cpu::InitBlas();
  core::ThreadPool pool(threads);
  SATDAR_ASSIGN_OR_RETURN(auto model, model::CreateModel<T>(config, &pool));
  const model::ParamTable& table = model->params();
  std::vector<T> params, grads(table.size(), T(0));
  std::vector<bool> present;  // never-read parameters may be absent; they get no gradient
  SATDAR_RETURN_IF_ERROR(
      LoadWeights<T>("--weights", flags.Get("--weights"), table, &params, &present));
  int b, t;
  SATDAR_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                          LoadTokens(flags.Get("--tokens"), config.vocab_size, &b, &t));
  if (t > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens: sequence length ", t, " exceeds max_position_embeddings ",
        config.max_position_embeddings));
  }
  double loss = model->Forward(params.data(), tokens.data(), b, t);
  model->Backward(params.data(), grads.data(), 1.0);
  T loss_t = static_cast<T>(loss);
  std::vector<core::TensorRef> out;
  out.push_back({"loss", core::DTypeOf<T>::value, {1}, &loss_t});
  for (size_t k = 0; k < table.specs().size(); ++k) {
    const model::ParamSpec& spec = table.specs()[k];
    if (!present[k]) continue;
    out.push_back({"grad." + spec.name, core::DTypeOf<T>::value, spec.shape,
                   grads.data() + spec.offset});
  }
  absl::Status s = core::WriteSafetensors(flags.Get("--out"), out, {});
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--out: ", s.message()));
  return absl::OkStatus();
}

absl::Status RunGrad(const std::vector<std::string>& args) {
  FlagSet flags("grad");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--weights", "weights (safetensors)", true);
  flags.Define("--tokens", "token batch (safetensors with 'tokens' [B, T+1])", true);
  flags.Define("--out", "where to write loss and grad.<name> (safetensors)", true);
  flags.Define("--dtype", "f32 or f64", false, "f32");
  flags.Define("--threads", "CPU threads", false, "1");
  if (WantsHelp(args)) {
    std::fprintf(stdout, "%s", flags.Usage().c_str());
    return absl::OkStatus();
  }
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1));
  SATDAR_ASSIGN_OR_RETURN(const bool f64, DtypeIsF64(flags, "grad"));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  return f64 ? RunGradTyped<double>(config, flags, static_cast<int>(threads))
                        : RunGradTyped<float>(config, flags, static_cast<int>(threads));
}

// --- satdar init ------------------------------------------------------------------------

absl::Status RunInit(const std::vector<std::string>& args) {
  FlagSet flags("init");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--out", "where to write the initial weights (safetensors)", true);
  flags.Define("--seed", "initialisation seed", false, "0");
  flags.Define("--dtype", "f32 or f64", false, "f32");
  if (WantsHelp(args)) {
    std::fprintf(stdout, "%s", flags.Usage().c_str());
    return absl::OkStatus();
  }
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0));
  SATDAR_ASSIGN_OR_RETURN(const bool f64, DtypeIsF64(flags, "init"));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  core::ThreadPool pool(1);
  SATDAR_ASSIGN_OR_RETURN(auto model, model::CreateModel<double>(config, &pool));
  const model::ParamTable& table = model->params();
  std::vector<double> params(table.size());
  table.Initialize(params.data(), static_cast<uint64_t>(seed));
  std::vector<float> params32(params.begin(), params.end());
  std::vector<core::TensorRef> out;
  for (const auto& spec : table.specs()) {
    const void* p = f64 ? static_cast<const void*>(params.data() + spec.offset)
                        : static_cast<const void*>(params32.data() + spec.offset);
    out.push_back({spec.name, f64 ? core::DType::kF64 : core::DType::kF32, spec.shape, p});
  }
  absl::Status s = core::WriteSafetensors(flags.Get("--out"), out,
                                          {{"config", model::ModelConfigToJson(config)}});
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--out: ", s.message()));
  return absl::OkStatus();
}

// --- satdar export ----------------------------------------------------------------------

// A checkpoint (one file, or a folder of model-parallel shards) as one weights file with the
// whole model under its MODELS.md names.
template <typename T>
absl::Status ExportTyped(const model::ModelConfig& config, const std::string& checkpoint,
                         const std::string& out_path) {
  core::ThreadPool pool(1);
  SATDAR_ASSIGN_OR_RETURN(auto model, model::CreateModel<T>(config, &pool));
  const model::ParamTable& table = model->params();
  std::vector<T> params(table.size());
  absl::Status loaded = LoadCheckpoint<T>(checkpoint, model::ModelConfigToJson(config), table,
                                          {&params, nullptr, nullptr})
                            .status();
  if (!loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat("--checkpoint: ", loaded.message()));
  }
  std::vector<core::TensorRef> out;
  for (const auto& spec : table.specs()) {
    out.push_back({spec.name, core::DTypeOf<T>::value, spec.shape, params.data() + spec.offset});
  }
  absl::Status s =
      core::WriteSafetensors(out_path, out, {{"config", model::ModelConfigToJson(config)}});
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--out: ", s.message()));
  return absl::OkStatus();
}

absl::Status RunExport(const std::vector<std::string>& args) {
  FlagSet flags("export");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--checkpoint", "checkpoint file or folder (any training layout)", true);
  flags.Define("--out", "where to write the weights (safetensors)", true);
  flags.Define("--dtype", "the checkpoint's dtype: f32 or f64", false, "f32");
  if (WantsHelp(args)) {
    std::fprintf(stdout, "%s", flags.Usage().c_str());
    return absl::OkStatus();
  }
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_ASSIGN_OR_RETURN(const bool f64, DtypeIsF64(flags, "export"));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  return f64 ? ExportTyped<double>(config, flags.Get("--checkpoint"), flags.Get("--out"))
             : ExportTyped<float>(config, flags.Get("--checkpoint"), flags.Get("--out"));
}

// --- satdar eval ------------------------------------------------------------------------

absl::Status RunEval(const std::vector<std::string>& args) {
  FlagSet flags("eval");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--weights", "weights or checkpoint (safetensors)", true);
  flags.Define("--data", "folder of text files (byte-level tokens)");
  flags.Define("--data-format", "auto, text or brown", false, "auto");
  flags.DefineBool("--synthetic-data", "evaluate on uniformly random tokens");
  flags.Define("--batch-size", "sequences per batch", false, "8");
  flags.Define("--seq-len", "tokens per sequence", true);
  flags.Define("--batches", "batches to average over", false, "8");
  flags.Define("--seed", "data seed", false, "0");
  flags.Define("--threads", "CPU threads", false, "1");
  flags.Define("--dtype", "f32 or f64", false, "f32");
  flags.Define("--gate-ablation", "none, zero or mean: SATFormer's gate intervention", false,
               "none");
  flags.DefineBool("--gate-by-category",
                   "SATFormer gates averaged by part-of-speech group (tagged Brown datasets)");
  DefineTaskFlags(&flags);
  flags.Define("--json", "also write the result as JSON to this file");
  if (WantsHelp(args)) {
    std::fprintf(stdout, "%s", flags.Usage().c_str());
    return absl::OkStatus();
  }
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  EvalOptions o;
  SATDAR_ASSIGN_OR_RETURN(int64_t batch, flags.GetInt("--batch-size", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t seq, flags.GetInt("--seq-len", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t batches, flags.GetInt("--batches", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1));
  o.batch_size = static_cast<int>(batch);
  o.seq_len = static_cast<int>(seq);
  o.batches = static_cast<int>(batches);
  o.seed = static_cast<uint64_t>(seed);
  o.threads = static_cast<int>(threads);
  o.weights = flags.Get("--weights");
  o.synthetic_data = flags.GetBool("--synthetic-data");
  o.data_dir = flags.Get("--data");
  o.data_format = flags.Get("--data-format");
  SATDAR_ASSIGN_OR_RETURN(o.mqar, TaskFromFlags(flags, "eval"));
  o.gate_by_category = flags.GetBool("--gate-by-category");
  if (!o.mqar.has_value() && o.synthetic_data == flags.Has("--data")) {
    return absl::InvalidArgumentError(
        "satdar eval: give exactly one of --data DIR or --synthetic-data (or --task mqar)");
  }
  SATDAR_ASSIGN_OR_RETURN(const bool f64, DtypeIsF64(flags, "eval"));
  o.f64 = f64;
  o.gate_ablation = flags.Get("--gate-ablation");
  if (o.gate_ablation != "none" && o.gate_ablation != "zero" && o.gate_ablation != "mean") {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar eval: flag --gate-ablation must be none, zero or mean, got '", o.gate_ablation,
        "'"));
  }
  SATDAR_ASSIGN_OR_RETURN(o.config, model::LoadModelConfig(flags.Get("--config")));
  if (o.seq_len > o.config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar eval: --seq-len ", o.seq_len, " exceeds max_position_embeddings ",
        o.config.max_position_embeddings));
  }
  SATDAR_ASSIGN_OR_RETURN(nlohmann::json result, Evaluate(o));
  std::printf("loss %.6f over %lld tokens\n", result["loss"].get<double>(),
              static_cast<long long>(result["tokens"].get<int64_t>()));
  if (result.contains("mqar_accuracy")) {
    std::printf("MQAR recall accuracy %.4f over %lld queries\n",
                result["mqar_accuracy"].get<double>(),
                static_cast<long long>(result["queries"].get<int64_t>()));
  }
  if (result.contains("gate_by_category")) {
    // One row per layer and KV head: the mean gate of each part-of-speech group.
    std::printf("mean SATFormer gate by part-of-speech group\nlayer head");
    const auto& by = result["gate_by_category"];
    for (const auto& [group, unused] : by.items()) std::printf(" %12s", group.c_str());
    std::printf("\n");
    const size_t layers = by.begin()->size();
    for (size_t l = 0; l < layers; ++l) {
      for (size_t h = 0; h < (*by.begin())[l].size(); ++h) {
        std::printf("%5zu %4zu", l + 2, h);
        for (const auto& [group, values] : by.items()) std::printf(" %12.4f", values[l][h].get<double>());
        std::printf("\n");
      }
    }
  }
  if (result.contains("ablated_loss")) {
    std::printf("gates set to their %s: loss %.6f (change %+.6f)\n",
                o.gate_ablation == "zero" ? "zero" : "mean",
                result["ablated_loss"].get<double>(), result["loss_change"].get<double>());
  }
  if (flags.Has("--json")) {
    absl::Status s = core::WriteFileAtomically(flags.Get("--json"), result.dump(2) + "\n");
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--json: ", s.message()));
  }
  return absl::OkStatus();
}

// --- satdar info ------------------------------------------------------------------------

absl::Status RunInfo(const std::vector<std::string>& args) {
  FlagSet flags("info");
  flags.Define("--config", "model config JSON", true);
  flags.DefineBool("--params", "list every parameter with its shape");
  if (WantsHelp(args)) {
    std::fprintf(stdout, "%s", flags.Usage().c_str());
    return absl::OkStatus();
  }
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  core::ThreadPool pool(1);
  SATDAR_ASSIGN_OR_RETURN(auto model, model::CreateModel<float>(config, &pool));
  const model::ParamTable& table = model->params();
  int64_t embedding = config.vocab_size * static_cast<int64_t>(config.hidden_size);
  std::printf("%s: residual %s, value_residual %s, %s; %lld parameters (%.1fM; %.1fM without "
              "the embedding)\n",
              flags.Get("--config").c_str(), config.residual.c_str(),
              config.value_residual.c_str(), config.moe ? "MoE FFN" : "dense FFN",
              static_cast<long long>(table.size()), table.size() / 1e6,
              (table.size() - embedding) / 1e6);
  if (flags.GetBool("--params")) {
    for (const auto& spec : table.specs()) {
      std::printf("  %-60s %s\n", spec.name.c_str(), core::ShapeString(spec.shape).c_str());
    }
  }
  return absl::OkStatus();
}

// --- satdar prep ------------------------------------------------------------------------

absl::Status RunPrep(const std::vector<std::string>& args) {
  FlagSet flags("prep");
  flags.DefineList("--input", "text files or folders (the Brown corpus folder is detected)", true);
  flags.Define("--out", "the dataset folder to create", true);
  flags.Define("--vocab-size", "train a SentencePiece BPE tokenizer of this size");
  flags.Define("--tokenizer", "use this SentencePiece .model instead of training one");
  flags.Define("--val-fraction", "documents held out for validation", false, "0.01");
  flags.Define("--format", "auto, text or brown", false, "auto");
  flags.Define("--shard-tokens", "tokens per shard", false, "16777216");
  flags.Define("--threads", "threads for tokenizer training and encoding", false, "1");
  flags.Define("--seed", "which documents are held out", false, "0");
  flags.DefineBool("--quiet", "no progress output");
  if (WantsHelp(args)) {
    std::fprintf(stdout, "%s", flags.Usage().c_str());
    return absl::OkStatus();
  }
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  data::PrepOptions o;
  o.inputs = flags.GetList("--input");
  o.out = flags.Get("--out");
  if (flags.Has("--vocab-size")) {
    SATDAR_ASSIGN_OR_RETURN(int64_t v, flags.GetInt("--vocab-size", 1));
    o.vocab_size = static_cast<int>(v);
  }
  o.tokenizer = flags.Get("--tokenizer");
  SATDAR_ASSIGN_OR_RETURN(o.val_fraction, flags.GetDouble("--val-fraction", 0.0));
  o.format = flags.Get("--format");
  SATDAR_ASSIGN_OR_RETURN(o.shard_tokens, flags.GetInt("--shard-tokens", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0));
  o.threads = static_cast<int>(threads);
  o.seed = static_cast<uint64_t>(seed);
  o.progress = !flags.GetBool("--quiet");
  SATDAR_ASSIGN_OR_RETURN(data::PrepSummary s, data::Prep(o));
  std::printf("prep: %lld documents (%lld held out), %.1f MB of text -> %lld training and %lld "
              "validation tokens in %d shard(s), vocabulary %d, %.1f s (%.2f MB/s)\n",
              static_cast<long long>(s.documents), static_cast<long long>(s.val_documents),
              s.bytes / 1e6, static_cast<long long>(s.train_tokens),
              static_cast<long long>(s.val_tokens), s.shards, s.vocab_size, s.seconds,
              s.seconds > 0 ? s.bytes / 1e6 / s.seconds : 0.0);
  return absl::OkStatus();
}

// --- satdar train ------------------------------------------------------------------------

// --rank, --world-size and --rendezvous, when given, override what *id holds (the environment's).
absl::Status ApplyRankFlags(const FlagSet& flags, parallel::GlooOptions* id) {
  if (flags.Has("--rank")) {
    SATDAR_ASSIGN_OR_RETURN(int64_t r, flags.GetInt("--rank", 0));
    id->rank = static_cast<int>(r);
  }
  if (flags.Has("--world-size")) {
    SATDAR_ASSIGN_OR_RETURN(int64_t w, flags.GetInt("--world-size", 1));
    id->world_size = static_cast<int>(w);
  }
  if (flags.Has("--rendezvous")) id->store_dir = flags.Get("--rendezvous");
  return absl::OkStatus();
}

absl::Status RunTrain(const std::vector<std::string>& args) {
  FlagSet flags("train");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--steps", "optimizer steps", true);
  flags.Define("--batch-size", "sequences per optimizer step", true);
  flags.Define("--seq-len", "tokens per sequence", true);
  flags.Define("--data", "folder of text files (byte-level tokens; Brown corpus detected)");
  flags.Define("--data-format", "auto, text or brown", false, "auto");
  flags.DefineBool("--synthetic-data", "train on uniformly random tokens");
  flags.Define("--microbatches", "micro-batches per step (gradient accumulation)", false, "1");
  flags.Define("--threads", "CPU threads", false, "1");
  flags.Define("--seed", "initial weights and data order", false, "0");
  flags.Define("--dtype", "f32 or f64 (cpu); bf16 or f32 compute (cuda, default bf16)", false,
               "f32");
  flags.Define("--device", "cpu, cuda or cuda:N", false, "cpu");
  flags.DefineBool("--recompute",
                   "with --device cuda: recompute each sublayer's activations in backward");
  flags.Define("--peak-tflops", "with --device cuda: the GPU's dense bf16 peak, for MFU", false,
               "989");
  flags.Define("--lr", "peak learning rate", false, "1e-3");
  flags.Define("--min-lr-ratio", "final learning rate as a fraction of peak", false, "0.1");
  flags.Define("--warmup-steps", "linear warmup steps [default: steps/10]");
  flags.Define("--weight-decay", "AdamW weight decay (all parameters)", false, "0.1");
  flags.Define("--beta1", "AdamW beta1", false, "0.9");
  flags.Define("--beta2", "AdamW beta2", false, "0.95");
  flags.Define("--eps", "AdamW epsilon", false, "1e-8");
  flags.Define("--grad-clip", "global gradient-norm clip (0 = off)", false, "1.0");
  flags.Define("--log-jsonl", "append one JSON object per step");
  flags.Define("--summary-json", "write a summary at the end");
  flags.Define("--log-every", "console line every N steps", false, "1");
  flags.Define("--eval-every", "validation loss on the held-out split every N steps (0 = never)",
               false, "0");
  flags.Define("--eval-batches", "batches of the validation split per evaluation", false, "4");
  DefineTaskFlags(&flags);
  flags.Define("--stats-every",
               "add the analysis statistics to the --log-jsonl line every N steps (0 = never)",
               false, "50");
  flags.Define("--checkpoint-dir", "folder for checkpoints");
  flags.Define("--checkpoint-every", "checkpoint every N steps (and at the end)", false, "0");
  flags.Define("--keep-checkpoints", "newest checkpoints kept", false, "3");
  flags.DefineBool("--resume", "continue from the newest checkpoint in --checkpoint-dir");
  flags.Define("--dp", "data-parallel replicas", false, "1");
  flags.Define("--tp", "tensor-parallel ranks per model (heads, KV groups, MLP, vocabulary)",
               false, "1");
  flags.Define("--pp", "pipeline stages (layers split evenly; 1F1B over --microbatches)", false,
               "1");
  flags.Define("--ep", "expert-parallel ranks (MoE experts split; otherwise more replicas)",
               false, "1");
  flags.Define("--comm-timeout", "seconds a rank waits for a peer before the run fails", false,
               "300");
  flags.Define("--zero", "ZeRO stage with --dp: 0 (replicated optimizer) or 1 (sharded)",
               false, "0");
  flags.Define("--launcher",
               "how the dp x tp x pp x ep ranks run: mpi (one process each, under mpirun), "
               "gloo (one process each, started any way, meeting in --rendezvous) or threads "
               "(one process)",
               false, "mpi");
  flags.Define("--rank",
               "with --launcher gloo or --device cuda: this process's rank (or $SATDAR_RANK)");
  flags.Define("--world-size",
               "with --launcher gloo or --device cuda: the number of processes (or "
               "$SATDAR_WORLD_SIZE)");
  flags.Define("--rendezvous",
               "with --launcher gloo or --device cuda --dp > 1: a folder every rank can reach "
               "(shared file system), "
               "fresh per launch (or $SATDAR_RENDEZVOUS_DIR)");
  flags.Define("--gloo-iface", "with --launcher gloo: network interface (default: loopback)");
  flags.DefineBool("--quiet", "no console output");
  if (WantsHelp(args)) {
    std::fprintf(stdout, "%s", flags.Usage().c_str());
    return absl::OkStatus();
  }
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  TrainOptions o;
  SATDAR_ASSIGN_OR_RETURN(o.steps, flags.GetInt("--steps", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t batch, flags.GetInt("--batch-size", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t seq, flags.GetInt("--seq-len", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t micro, flags.GetInt("--microbatches", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0));
  SATDAR_ASSIGN_OR_RETURN(o.lr, flags.GetDouble("--lr", 0.0, false));
  SATDAR_ASSIGN_OR_RETURN(o.min_lr_ratio, flags.GetDouble("--min-lr-ratio", 0.0));
  SATDAR_ASSIGN_OR_RETURN(o.weight_decay, flags.GetDouble("--weight-decay", 0.0));
  SATDAR_ASSIGN_OR_RETURN(o.beta1, flags.GetDouble("--beta1", 0.0));
  SATDAR_ASSIGN_OR_RETURN(o.beta2, flags.GetDouble("--beta2", 0.0));
  SATDAR_ASSIGN_OR_RETURN(o.eps, flags.GetDouble("--eps", 0.0, false));
  SATDAR_ASSIGN_OR_RETURN(o.grad_clip, flags.GetDouble("--grad-clip", 0.0));
  SATDAR_ASSIGN_OR_RETURN(o.log_every, flags.GetInt("--log-every", 1));
  SATDAR_ASSIGN_OR_RETURN(o.stats_every, flags.GetInt("--stats-every", 0));
  SATDAR_ASSIGN_OR_RETURN(o.eval_every, flags.GetInt("--eval-every", 0));
  SATDAR_ASSIGN_OR_RETURN(int64_t eval_batches, flags.GetInt("--eval-batches", 1));
  o.eval_batches = static_cast<int>(eval_batches);
  SATDAR_ASSIGN_OR_RETURN(o.mqar, TaskFromFlags(flags, "train"));
  SATDAR_ASSIGN_OR_RETURN(o.checkpoint_every, flags.GetInt("--checkpoint-every", 0));
  SATDAR_ASSIGN_OR_RETURN(int64_t keep, flags.GetInt("--keep-checkpoints", 1));
  o.batch_size = static_cast<int>(batch);
  o.seq_len = static_cast<int>(seq);
  o.microbatches = static_cast<int>(micro);
  o.threads = static_cast<int>(threads);
  o.seed = static_cast<uint64_t>(seed);
  o.keep_checkpoints = static_cast<int>(keep);
  if (o.beta1 >= 1.0 || o.beta2 >= 1.0) {
    return absl::InvalidArgumentError("satdar train: --beta1 and --beta2 must be < 1");
  }
  if (o.min_lr_ratio > 1.0) {
    return absl::InvalidArgumentError("satdar train: --min-lr-ratio must be <= 1");
  }
  if (flags.Has("--warmup-steps")) {
    SATDAR_ASSIGN_OR_RETURN(o.warmup_steps, flags.GetInt("--warmup-steps", 0));
  } else {
    o.warmup_steps = o.steps / 10;
  }
  if (o.batch_size % o.microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("satdar train: --batch-size ", o.batch_size,
                                                   " is not divisible by --microbatches ",
                                                   o.microbatches));
  }
  o.synthetic_data = flags.GetBool("--synthetic-data");
  o.data_dir = flags.Get("--data");
  o.data_format = flags.Get("--data-format");
  if (!o.mqar.has_value() && o.synthetic_data == flags.Has("--data")) {
    return absl::InvalidArgumentError(
        "satdar train: give exactly one of --data DIR or --synthetic-data (or --task mqar)");
  }
  SATDAR_ASSIGN_OR_RETURN(core::Device device, core::ParseDevice(flags.Get("--device")));
  const bool cuda = device.type == core::DeviceType::kCuda;
  GpuTrainOptions gpu;
  if (cuda) {
    const std::string dtype = flags.Has("--dtype") ? flags.Get("--dtype") : "bf16";
    if (dtype != "bf16" && dtype != "f32") {
      return absl::InvalidArgumentError(absl::StrCat(
          "satdar train --device cuda: flag --dtype must be bf16 or f32, got '", dtype, "'"));
    }
    gpu.compute = dtype == "bf16" ? core::DType::kBF16 : core::DType::kF32;
    gpu.recompute = flags.GetBool("--recompute");
    gpu.device = flags.Get("--device").find(':') != std::string::npos ? device.index : -1;
    SATDAR_ASSIGN_OR_RETURN(gpu.peak_tflops, flags.GetDouble("--peak-tflops", 0.0, false));
    SATDAR_RETURN_IF_ERROR(core::CheckDeviceAvailable(device));
  } else {
    SATDAR_ASSIGN_OR_RETURN(const bool f64, DtypeIsF64(flags, "train"));
    o.f64 = f64;
    for (const char* f : {"--recompute", "--peak-tflops"}) {
      if (flags.Has(f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("satdar train: flag ", f, " is for --device cuda"));
      }
    }
  }
  o.log_jsonl = flags.Get("--log-jsonl");
  o.summary_json = flags.Get("--summary-json");
  o.checkpoint_dir = flags.Get("--checkpoint-dir");
  o.resume = flags.GetBool("--resume");
  o.quiet = flags.GetBool("--quiet");
  if ((o.resume || o.checkpoint_every > 0) && o.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "satdar train: --resume and --checkpoint-every need --checkpoint-dir");
  }
  SATDAR_ASSIGN_OR_RETURN(o.config, model::LoadModelConfig(flags.Get("--config")));
  if (o.seq_len > o.config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train: --seq-len ", o.seq_len, " exceeds max_position_embeddings ",
        o.config.max_position_embeddings, " of ", flags.Get("--config")));
  }
  parallel::MeshShape mesh;
  for (const char* f : {"--dp", "--tp", "--pp", "--ep"}) {
    SATDAR_ASSIGN_OR_RETURN(int64_t v, flags.GetInt(f, 1));
    (f[2] == 'd' ? mesh.dp : f[2] == 't' ? mesh.tp : f[2] == 'p' ? mesh.pp : mesh.ep) =
        static_cast<int>(v);
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t timeout, flags.GetInt("--comm-timeout", 1));
  o.comm_timeout_seconds = static_cast<int>(timeout);
  SATDAR_ASSIGN_OR_RETURN(int64_t zero, flags.GetInt("--zero", 0));
  if (zero > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("satdar train: flag --zero must be 0 or 1, got ", zero));
  }
  o.zero_stage = static_cast<int>(zero);
  // Layout errors (divisibility, designs that cannot be split) before any rank starts.
  SATDAR_RETURN_IF_ERROR(model::ValidateSharding(o.config, mesh.tp, mesh.pp, mesh.ep));
  o.mesh = mesh;
  const std::string launcher = flags.Get("--launcher");
  if (launcher != "mpi" && launcher != "threads" && launcher != "gloo") {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train: flag --launcher must be mpi, gloo or threads, got '", launcher, "'"));
  }
  const int world_size = mesh.size();
  absl::StatusOr<TrainSummary> summary;
  bool print_done = true;
  if (cuda) {
    // One process per GPU: the rank comes from mpirun or from --rank/--world-size (or
    // $SATDAR_RANK / $SATDAR_WORLD_SIZE); the ranks meet over NCCL through --rendezvous.
    if (!flags.Has("--stats-every")) o.stats_every = 0;
    parallel::GlooOptions id;  // rank, world size and rendezvous folder (not Gloo's transport)
    const absl::StatusOr<parallel::GlooOptions> env = parallel::GlooOptionsFromEnv();
    if (env.ok()) id = *env;
    if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) id.rank = std::atoi(r);
    if (const char* w = std::getenv("OMPI_COMM_WORLD_SIZE")) id.world_size = std::atoi(w);
    SATDAR_RETURN_IF_ERROR(ApplyRankFlags(flags, &id));
    if (id.world_size < 1) id.world_size = 1;  // alone
    if (id.rank < 0 && id.world_size == 1) id.rank = 0;
    if (id.rank < 0 || id.rank >= id.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("satdar train --device cuda: rank ",
                                                     id.rank, " is outside the world of ",
                                                     id.world_size));
    }
    gpu.rank = id.rank;
    gpu.world_size = id.world_size;
    gpu.rendezvous_dir = id.store_dir;
    summary = TrainGpu(o, gpu);
    print_done = gpu.rank == 0;
    if (summary.ok() && !o.quiet && print_done) {
      std::printf("done: %lld steps, final loss %.4f, %.0f tokens/s, MFU %.1f%%, peak GPU memory "
                  "%.2f GiB\n",
                  static_cast<long long>(summary->steps), summary->final_loss,
                  summary->tokens_per_second, 100 * summary->mfu,
                  summary->peak_device_bytes / 1073741824.0);
      print_done = false;
    }
  } else if (launcher == "gloo") {
    // One rank of a launch without mpirun: the ranks meet through a key-value store.
    parallel::GlooOptions g;
    const absl::StatusOr<parallel::GlooOptions> env = parallel::GlooOptionsFromEnv();
    if (env.ok()) g = *env;
    SATDAR_RETURN_IF_ERROR(ApplyRankFlags(flags, &g));
    if (flags.Has("--gloo-iface")) g.interface = flags.Get("--gloo-iface");
    if (g.rank < 0 || g.world_size < 1 || g.store_dir.empty()) {
      return absl::InvalidArgumentError(
          "satdar train: --launcher gloo needs --rank, --world-size and --rendezvous (or "
          "$SATDAR_RANK, $SATDAR_WORLD_SIZE and $SATDAR_RENDEZVOUS_DIR)");
    }
    if (g.world_size != world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the world has ", g.world_size, " ranks but --dp x --tp x --pp x --ep = ",
          mesh.ToString(), " = ", world_size));
    }
    g.timeout = absl::Seconds(o.comm_timeout_seconds);
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> world, parallel::GlooWorld(g));
    o.world = world->size() > 1 ? world.get() : nullptr;
    summary = Train(o);
    print_done = g.rank == 0;
  } else if (launcher == "threads" && world_size > 1) {
    // Every rank a thread of this process, talking through the in-process communicator.
    SATDAR_RETURN_IF_ERROR(parallel::ValidateMesh(mesh, world_size));
    auto comms = parallel::MakeLocalCommunicators(world_size);
    std::vector<absl::StatusOr<TrainSummary>> results(world_size);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world_size; ++r) {
      ranks.emplace_back([&, r] {
        TrainOptions ro = o;
        ro.world = comms[r].get();
        results[r] = Train(ro);
      });
    }
    for (auto& t : ranks) t.join();
    for (auto& res : results) {
      if (!res.ok()) return res.status();
    }
    summary = results[0];
  } else if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    // One rank of an mpirun launch.
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> world,
                            parallel::MpiWorld(nullptr, nullptr));
    absl::Status layout = parallel::ValidateMesh(mesh, world->size());
    if (layout.ok()) {
      o.world = world->size() > 1 ? world.get() : nullptr;
      summary = Train(o);
    } else {
      summary = layout;
    }
    world.reset();
    parallel::MpiFinalize();
  } else if (world_size > 1) {
    std::string layout;
    for (const auto& [flag, v] : {std::pair<const char*, int>{"--dp", mesh.dp}, {"--tp", mesh.tp},
                                  {"--pp", mesh.pp}, {"--ep", mesh.ep}}) {
      if (v > 1) absl::StrAppend(&layout, layout.empty() ? "" : " ", flag, " ", v);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train: ", layout, " needs ", world_size, " ranks: run under mpirun -np ",
        world_size, " (or add --launcher threads)"));
  } else {
    summary = Train(o);
  }
  if (!summary.ok()) return summary.status();
  if (!o.quiet && print_done) {
    std::printf("done: %lld steps, final loss %.4f, %.0f tokens/s, peak RSS %.1f MiB\n",
                static_cast<long long>(summary->steps), summary->final_loss,
                summary->tokens_per_second, summary->peak_rss_bytes / 1048576.0);
  }
  return absl::OkStatus();
}

}  // namespace

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists: return 2;
    default: return 1;
  }
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    PrintUsage();
    return args.empty() ? 2 : 0;
  }
  std::string command = args[0];
  args.erase(args.begin());
  absl::Status status;
  if (command == "grad") {
    status = RunGrad(args);
  } else if (command == "train") {
    status = RunTrain(args);
  } else if (command == "init") {
    status = RunInit(args);
  } else if (command == "eval") {
    status = RunEval(args);
  } else if (command == "export") {
    status = RunExport(args);
  } else if (command == "info") {
    status = RunInfo(args);
  } else if (command == "prep") {
    status = RunPrep(args);
  } else if (command == "version" || command == "--version") {
    std::printf("%s (%s)\n", kVersion, core::BuiltWithCuda() ? "CUDA build" : "CPU-only build");
    return 0;
  } else {
    std::fprintf(stderr, "satdar: unknown command '%s'\n", command.c_str());
    PrintUsage();
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "satdar %s: error: %s\n", command.c_str(),
                 std::string(status.message()).c_str());
    return ExitCodeFor(status);
  }
  return 0;
}

}  // namespace satdar::worker
