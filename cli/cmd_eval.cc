// satdar eval: the loss of given weights on held-out data, and SATFormer's gate analyses (v1);
// with --task FILE.jsonl or --task passage-recall, zero-shot tasks scored the lm-eval-harness
// way (v3, runtime/task_eval.h). --task lm and --task mqar keep their v1 meaning.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "data/dataset.h"
#include "model/memory_estimate.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/task_file.h"
#include "cli/tokenizer_process.h"
#include "runtime/decode_session.h"
#include "runtime/eval.h"
#include "runtime/passage_recall.h"
#include "runtime/task_eval.h"

namespace satdar::cli {

namespace {

void PrintResult(const nlohmann::json& result, const runtime::EvalOptions& o, FILE* out) {
  const int64_t sequences = result["sequences"].get<int64_t>();
  std::fprintf(out, "loss %.6f over %lld tokens (%lld sequences of %d)\n", result["loss"].get<double>(),
              static_cast<long long>(result["tokens"].get<int64_t>()),
              static_cast<long long>(sequences), o.seq_len);
  if (result.contains("split_tokens")) {
    // How much of the validation split that is, and whether --batches was capped.
    const long long split_tokens = result["split_tokens"].get<int64_t>();
    const int64_t split = result["split_sequences"].get<int64_t>();
    const int64_t asked = static_cast<int64_t>(o.batches) * o.batch_size;
    if (sequences < asked) {
      std::fprintf(out, "  all %lld sequences of the validation split (%lld tokens), each once: "
                  "--batches %d would read it %.2f times (add --repeat for that)\n",
                  static_cast<long long>(split), split_tokens, o.batches,
                  static_cast<double>(asked) / split);
    } else if (sequences > split) {
      std::fprintf(out, "  the validation split (%lld tokens) read %.2f times (--repeat)\n",
                  split_tokens, static_cast<double>(sequences) / split);
    } else {
      std::fprintf(out, "  %lld of the validation split's %lld sequences (%lld tokens)\n",
                  static_cast<long long>(sequences), static_cast<long long>(split), split_tokens);
    }
  }
  if (result.contains("mqar_accuracy")) {
    std::fprintf(out, "MQAR recall accuracy %.4f over %lld queries\n",
                result["mqar_accuracy"].get<double>(),
                static_cast<long long>(result["queries"].get<int64_t>()));
  }
  if (result.contains("gate_by_category")) {
    // One row per layer and KV head: the mean gate of each part-of-speech group.
    std::fprintf(out, "mean SATFormer gate by part-of-speech group\nlayer head");
    const auto& by = result["gate_by_category"];
    for (const auto& [group, unused] : by.items()) std::fprintf(out, " %12s", group.c_str());
    std::fprintf(out, "\n");
    const size_t layers = by.begin()->size();
    for (size_t l = 0; l < layers; ++l) {
      for (size_t h = 0; h < (*by.begin())[l].size(); ++h) {
        std::fprintf(out, "%5zu %4zu", l + 2, h);
        for (const auto& [group, values] : by.items()) {
          if (values[l][h].is_null()) {
            std::fprintf(out, " %12s", "n/a");  // no token of this group
          } else {
            std::fprintf(out, " %12.4f", values[l][h].get<double>());
          }
        }
        std::fprintf(out, "\n");
      }
    }
  }
  if (result.contains("ablated_loss")) {
    std::fprintf(out, "gates set to their %s: loss %.6f (change %+.6f)\n",
                o.gate_ablation == "zero" ? "zero" : "mean",
                result["ablated_loss"].get<double>(), result["loss_change"].get<double>());
  }
}

// Where the result goes: bare --json prints only the JSON on stdout (the table goes to
// stderr), --json FILE writes the file at the end, and without --json the text is on stdout.
struct Output {
  bool json_to_stdout = false;
  std::string json_file;
  FILE* text = stdout;
};

Output OutputOf(const FlagSet& flags) {
  Output out;
  if (flags.Has("--json")) {
    out.json_file = flags.Get("--json");
    out.json_to_stdout = out.json_file.empty();
    if (out.json_to_stdout) out.text = stderr;
  }
  return out;
}

absl::Status Emit(const nlohmann::json& result, const Output& out) {
  if (out.json_to_stdout) {
    std::fprintf(stdout, "%s\n", result.dump(2).c_str());
    std::fflush(stdout);
  } else if (!out.json_file.empty()) {
    absl::Status s = core::WriteFileAtomically(out.json_file, result.dump(2) + "\n");
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--json: ", s.message()));
  }
  return absl::OkStatus();
}

// One row per metric: task, n, metric, value, standard error.
void PrintTaskTable(const nlohmann::json& result, const std::string& ablation, FILE* out) {
  size_t width = 4;
  for (const auto& [name, unused] : result["tasks"].items()) width = std::max(width, name.size());
  const int w = static_cast<int>(width);
  std::fprintf(out, "%-*s %7s  %-22s %8s   %s\n", w, "task", "n", "metric", "value", "stderr");
  for (const auto& [name, m] : result["tasks"].items()) {
    bool first = true;
    auto row = [&](const nlohmann::json& metrics, const std::string& metric,
                   const std::string& label) {
      if (!metrics.contains(metric)) return;
      if (first) {
        std::fprintf(out, "%-*s %7lld  ", w, name.c_str(),
                     static_cast<long long>(m["n"].get<int64_t>()));
      } else {
        std::fprintf(out, "%-*s %7s  ", w, "", "");
      }
      first = false;
      std::fprintf(out, "%-22s %8.4f ± %.4f\n", label.c_str(), metrics[metric].get<double>(),
                   metrics[metric + "_stderr"].get<double>());
    };
    for (const char* metric : {"acc", "acc_norm"}) row(m, metric, metric);
    if (m.contains("ablated")) {
      for (const char* metric : {"acc", "acc_norm"}) {
        row(m["ablated"], metric, absl::StrCat(metric, " (gates ", ablation, ")"));
      }
    }
  }
}

// The flags of one mode given in the other: InvalidArgument naming the first.
absl::Status RefuseFlags(const FlagSet& flags, const std::vector<std::string>& names,
                         const std::string& why) {
  for (const std::string& name : names) {
    if (flags.Has(name)) {
      return absl::InvalidArgumentError(absl::StrCat("satdar eval: ", name, " ", why));
    }
  }
  return absl::OkStatus();
}

// The EOS id of a prepared dataset (its manifest's eos_id; data::Dataset::Open checked it).
absl::StatusOr<int> DatasetEosId(const std::string& dir) {
  const std::string manifest = dir + "/" + data::kManifestName;
  SATDAR_ASSIGN_OR_RETURN(std::string text,
                          core::ReadFileToString(manifest, core::kMaxSmallFileBytes));
  SATDAR_ASSIGN_OR_RETURN(nlohmann::json m, core::ParseJson(text, manifest));
  if (!m.is_object() || !m.contains("eos_id") || !m["eos_id"].is_number_unsigned()) {
    return absl::InvalidArgumentError(absl::StrCat(manifest, ": eos_id must be an id"));
  }
  return static_cast<int>(m["eos_id"].get<uint64_t>());
}

// v3: --task FILE.jsonl ... and --task passage-recall.
absl::Status RunTaskEval(const FlagSet& flags, const std::vector<std::string>& task_args) {
  SATDAR_RETURN_IF_ERROR(RefuseFlags(
      flags,
      {"--synthetic-data", "--data-format", "--batch-size", "--seq-len", "--batches", "--repeat",
       "--gate-by-category", "--mqar-keys", "--mqar-values", "--mqar-pairs", "--mqar-queries"},
      "is for the validation loss (satdar eval without --task FILE); tasks read the model's "
      "window"));
  const std::string weights = flags.Get("--weights"), checkpoint = flags.Get("--checkpoint");
  if (weights.empty() == checkpoint.empty()) {
    return absl::InvalidArgumentError(
        "satdar eval: give exactly one of --weights W or --checkpoint CKPT");
  }
  const std::string data_dir = flags.Get("--data"), tokenizer = flags.Get("--tokenizer");
  std::vector<InputPath> inputs = {{"--config", flags.Get("--config")},
                                   {"--weights", weights},
                                   {"--checkpoint", checkpoint, InputPath::kFileOrFolder},
                                   {"--data", data_dir, InputPath::kFolder},
                                   {"--tokenizer", tokenizer}};
  bool passage_recall = false;
  std::vector<std::string> files;
  for (const std::string& t : task_args) {
    if (t == runtime::kPassageRecallTask) {
      if (passage_recall) {
        return absl::InvalidArgumentError("satdar eval: --task passage-recall given twice");
      }
      passage_recall = true;
    } else {
      files.push_back(t);
      inputs.push_back({"--task", t});
    }
  }
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  const Output out = OutputOf(flags);
  SATDAR_RETURN_IF_ERROR(CheckOutput("--json", out.json_file, false, inputs));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0, kMaxSeed));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1, kMaxThreads));
  SATDAR_ASSIGN_OR_RETURN(int64_t max_new, flags.GetInt("--max-new-tokens", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));

  // Every task file is read and checked before the tokenizer or the model starts.
  std::vector<TaskFile> parsed;
  std::map<std::string, std::string> names;  // task name -> its --task
  if (passage_recall) names[runtime::kPassageRecallName] = runtime::kPassageRecallTask;
  for (const std::string& path : files) {
    SATDAR_ASSIGN_OR_RETURN(TaskFile file, ReadTaskFile(path));
    if (!names.emplace(file.name, path).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--task: ", path, " and ", names[file.name], " are both task \"",
                       file.name, "\" (tasks are named by their file names)"));
    }
    parsed.push_back(std::move(file));
  }

  runtime::TaskEvalOptions o;
  o.max_new_tokens = static_cast<int>(max_new);
  o.seed = static_cast<uint64_t>(seed);
  const std::string ablation = flags.Get("--gate-ablation");
  if (ablation == "zero") o.gate_ablation = model::GateAblation::kZero;
  if (ablation == "mean") o.gate_ablation = model::GateAblation::kMean;
  std::vector<runtime::Task> tasks;
  if (passage_recall) {
    if (data_dir.empty() || !data::Dataset::IsDataset(data_dir)) {
      return absl::InvalidArgumentError(
          "satdar eval: --task passage-recall needs --data DIR, a dataset prepared by satdar prep "
          "(its validation split)");
    }
    SATDAR_ASSIGN_OR_RETURN(auto dataset, data::Dataset::Open(data_dir, config.vocab_size));
    runtime::PassageRecallOptions p;
    SATDAR_ASSIGN_OR_RETURN(int64_t items, flags.GetInt("--recall-items", 1, kMaxCount));
    p.items = static_cast<int>(items);
    // Sizes not given are chosen from the window (runtime/passage_recall.h).
    for (auto [flag, min, field] :
         {std::tuple<const char*, int, int*>{"--recall-passage-tokens", 2, &p.passage_tokens},
          {"--recall-span-tokens", 2, &p.span_tokens},
          {"--recall-target-tokens", 1, &p.target_tokens}}) {
      if (!flags.Has(flag)) continue;
      SATDAR_ASSIGN_OR_RETURN(int64_t v, flags.GetInt(flag, min, kMaxSeqLen));
      *field = static_cast<int>(v);
    }
    p.seed = o.seed;
    SATDAR_ASSIGN_OR_RETURN(p.eos_id, DatasetEosId(data_dir));
    SATDAR_ASSIGN_OR_RETURN(runtime::Task task,
                            runtime::MakePassageRecall(*dataset, p, config.max_position_embeddings));
    tasks.push_back(std::move(task));
  } else {
    SATDAR_RETURN_IF_ERROR(RefuseFlags(
        flags,
        {"--recall-items", "--recall-passage-tokens", "--recall-span-tokens",
         "--recall-target-tokens"},
        "needs --task passage-recall"));
  }
  std::unique_ptr<TokenizerProcess> tok;
  if (!parsed.empty()) {
    // --tokenizer wins over --data's, so that passage-recall's --data can go with it.
    SATDAR_ASSIGN_OR_RETURN(std::string model_path,
                            ResolveTokenizerPath(tokenizer, tokenizer.empty() ? data_dir : ""));
    SATDAR_ASSIGN_OR_RETURN(tok, TokenizerProcess::Start(model_path));
    SATDAR_RETURN_IF_ERROR(CheckTokenizerFits(model_path, tok->vocab_size(), config.vocab_size));
    o.eos_id = tok->eos_id();
    TokenizerProcess* t = tok.get();
    o.detokenize = [t](const std::vector<int32_t>& ids) { return t->Decode(ids); };
    const Encoder encode = [t](const std::string& text) { return t->Encode(text); };
    for (const TaskFile& file : parsed) {
      SATDAR_ASSIGN_OR_RETURN(runtime::Task task, TokenizeTaskFile(file, encode));
      tasks.push_back(std::move(task));
    }
  }
  // The tasks in the order of the command line (names are unique, checked above).
  std::vector<runtime::Task> ordered;
  for (const std::string& t : task_args) {
    const std::string name =
        t == runtime::kPassageRecallTask ? runtime::kPassageRecallName : TaskNameOf(t);
    for (runtime::Task& task : tasks) {
      if (task.name == name && !task.name.empty()) {
        ordered.push_back(std::move(task));
        task.name.clear();
      }
    }
  }

  runtime::DecodeOptions d;
  d.config = config;
  d.weights = weights;
  d.checkpoint = checkpoint;
  d.device = flags.Get("--device");
  const std::string dtype = flags.Get("--dtype");
  d.dtype = dtype == "f64" ? core::DType::kF64 : dtype == "bf16" ? core::DType::kBF16
                                                                 : core::DType::kF32;
  d.threads = static_cast<int>(threads);
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<runtime::DecodeSession> session,
                          runtime::DecodeSession::Create(d));
  SATDAR_ASSIGN_OR_RETURN(nlohmann::json result, runtime::EvaluateTasks(session.get(), ordered, o));
  PrintTaskTable(result, ablation, out.text);
  return Emit(result, out);
}

}  // namespace

absl::Status RunEval(const std::vector<std::string>& args) {
  FlagSet flags("eval");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--weights", "weights or a single-file checkpoint (safetensors)");
  flags.Define("--checkpoint", "with --task FILE: a checkpoint file or folder (instead of --weights)");
  flags.Define("--data",
               "a prepared dataset (its validation split; with --task FILE, its tokenizer) or a "
               "folder of text files");
  flags.DefineEnum("--data-format", "how to read a folder of text", {"auto", "text", "brown"},
                   "auto");
  flags.DefineBool("--synthetic-data", "evaluate on uniformly random tokens");
  flags.Define("--batch-size", "sequences per batch", false, "8");
  flags.Define("--seq-len", "tokens per sequence (validation loss)");
  flags.Define("--batches",
               "batches to average over, at most: a dataset's validation split is scored once "
               "(fewer batches when it is shorter)",
               false, "8");
  flags.DefineBool("--repeat", "with --data DATASET: read the validation split again until "
                   "--batches are done");
  flags.Define("--seed", "data seed; with --task FILE, the bootstrap's and passage-recall's", false,
               "0");
  flags.Define("--threads", "CPU threads", false, "1");
  flags.DefineEnum("--dtype", "precision (bf16: --task FILE on cuda)", {"f32", "f64", "bf16"},
                   "f32");
  flags.DefineEnum("--gate-ablation", "SATFormer's gate intervention", {"none", "zero", "mean"},
                   "none");
  flags.DefineBool("--gate-by-category",
                   "SATFormer gates averaged by part-of-speech group (tagged Brown datasets)");
  // --task is defined here, not among the task settings: besides train's lm and mqar it takes
  // task files and passage-recall, several at once.
  flags.DefineRepeatedList("--task",
                           "lm (validation loss), mqar (synthetic recall), passage-recall (from "
                           "--data), or task files FILE.jsonl (docs/EVAL.md); repeatable");
  DefineSettingFlags(&flags, [](const settings::SettingDef& d) {
    return d.name != "task" && settings::IsTaskSetting(d.name);
  });
  flags.Define("--tokenizer", "with --task FILE: a SentencePiece .model (else --data's)");
  flags.Define("--max-new-tokens", "recall tasks: greedy tokens generated at most", false, "32");
  flags.Define("--device", "with --task: cpu, cuda or cuda:N", false, "cpu");
  flags.Define("--recall-items", "passage-recall: items", false, "200");
  flags.Define("--recall-passage-tokens",
               "passage-recall: passage tokens at most [default min(128, window - span)]");
  flags.Define("--recall-span-tokens",
               "passage-recall: tokens of the repeated span [default min(24, window / 4)]");
  flags.Define("--recall-target-tokens",
               "passage-recall: the span's last tokens to reproduce [default max(1, min(8, span / 3))]");
  flags.DefineOptionalValue("--json",
                            "print the result as JSON on stdout (the table goes to stderr), or "
                            "with a FILE write it there");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));

  const std::vector<std::string> task_args = flags.GetList("--task");
  const bool v1 = task_args.empty() || task_args == std::vector<std::string>{"lm"} ||
                  task_args == std::vector<std::string>{"mqar"};
  if (!v1) {
    for (const std::string& t : task_args) {
      if (t == "lm" || t == "mqar") {
        return absl::InvalidArgumentError(absl::StrCat(
            "satdar eval: --task ", t,
            " (the v1 evaluation of held-out loss) cannot be combined with other tasks"));
      }
    }
    return RunTaskEval(flags, task_args);
  }
  SATDAR_RETURN_IF_ERROR(RefuseFlags(
      flags,
      {"--checkpoint", "--tokenizer", "--max-new-tokens", "--device", "--recall-items",
       "--recall-passage-tokens", "--recall-span-tokens", "--recall-target-tokens"},
      "needs --task FILE or --task passage-recall"));
  for (const char* required : {"--weights", "--seq-len"}) {
    if (!flags.Has(required)) {
      return absl::InvalidArgumentError(
          absl::StrCat("satdar eval: missing required flag ", required,
                       " (the validation loss; or give --task FILE)"));
    }
  }
  if (flags.Get("--dtype") == "bf16") {
    return absl::InvalidArgumentError(
        "satdar eval: --dtype bf16 is for --task FILE on cuda; the validation loss runs f32 or f64");
  }
  runtime::EvalOptions o;
  SATDAR_ASSIGN_OR_RETURN(int64_t batch, flags.GetInt("--batch-size", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t seq, flags.GetInt("--seq-len", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(int64_t batches, flags.GetInt("--batches", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0, kMaxSeed));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1, kMaxThreads));
  o.batch_size = static_cast<int>(batch);
  o.seq_len = static_cast<int>(seq);
  o.batches = static_cast<int>(batches);
  o.repeat = flags.GetBool("--repeat");
  o.seed = static_cast<uint64_t>(seed);
  o.threads = static_cast<int>(threads);
  o.weights = flags.Get("--weights");
  o.synthetic_data = flags.GetBool("--synthetic-data");
  o.data_dir = flags.Get("--data");
  o.data_format = flags.Get("--data-format");
  // The task settings as train reads them (--task lm | mqar and the MQAR sizes).
  std::map<std::string, std::string> given;
  if (!task_args.empty()) given["task"] = task_args.front();
  for (const settings::SettingDef& d : settings::TrainSettingDefs()) {
    const std::string flag = settings::NameOf(d.name, settings::Spelling::kFlags);
    if (d.name != "task" && settings::IsTaskSetting(d.name) && flags.Has(flag)) {
      given[d.name] = flags.Get(flag);
    }
  }
  absl::StatusOr<std::optional<data::MqarOptions>> mqar =
      settings::TaskFromSettings(settings::SettingValues(given, settings::Spelling::kFlags));
  if (!mqar.ok()) {
    return absl::Status(mqar.status().code(),
                        absl::StrCat("satdar eval: ", mqar.status().message()));
  }
  o.mqar = *mqar;
  o.gate_by_category = flags.GetBool("--gate-by-category");
  if (!o.mqar.has_value() && o.synthetic_data == flags.Has("--data")) {
    return absl::InvalidArgumentError(
        "satdar eval: give exactly one of --data DIR or --synthetic-data (or --task mqar)");
  }
  o.f64 = flags.Get("--dtype") == "f64";
  o.gate_ablation = flags.Get("--gate-ablation");
  const std::vector<InputPath> inputs = {{"--config", flags.Get("--config")},
                                         {"--weights", o.weights},
                                         {"--data", o.data_dir, InputPath::kFolder}};
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  const Output out = OutputOf(flags);
  SATDAR_RETURN_IF_ERROR(CheckOutput("--json", out.json_file, false, inputs));
  SATDAR_ASSIGN_OR_RETURN(o.config, model::LoadModelConfig(flags.Get("--config")));
  if (o.seq_len > o.config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar eval: --seq-len ", o.seq_len, " exceeds max_position_embeddings ",
        o.config.max_position_embeddings));
  }
  model::MemoryShape shape;
  shape.use = model::MemoryUse::kForward;
  shape.batch = o.batch_size;
  shape.seq_len = o.seq_len;
  shape.dtype_bytes = o.f64 ? 8 : 4;
  SATDAR_RETURN_IF_ERROR(model::CheckFitsInMemory(o.config, shape, 1, "satdar eval", kCliBatchNames));
  SATDAR_ASSIGN_OR_RETURN(nlohmann::json result, runtime::Evaluate(o));
  PrintResult(result, o, out.text);
  return Emit(result, out);
}

}  // namespace satdar::cli

