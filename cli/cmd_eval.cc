// satdar eval: the loss of given weights on held-out data, and SATFormer's gate analyses.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "model/memory_estimate.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "runtime/eval.h"

namespace satdar::cli {

namespace {

void PrintResult(const nlohmann::json& result, const runtime::EvalOptions& o) {
  const int64_t sequences = result["sequences"].get<int64_t>();
  std::printf("loss %.6f over %lld tokens (%lld sequences of %d)\n", result["loss"].get<double>(),
              static_cast<long long>(result["tokens"].get<int64_t>()),
              static_cast<long long>(sequences), o.seq_len);
  if (result.contains("split_tokens")) {
    // How much of the validation split that is, and whether --batches was capped.
    const long long split_tokens = result["split_tokens"].get<int64_t>();
    const int64_t split = result["split_sequences"].get<int64_t>();
    const int64_t asked = static_cast<int64_t>(o.batches) * o.batch_size;
    if (sequences < asked) {
      std::printf("  all %lld sequences of the validation split (%lld tokens), each once: "
                  "--batches %d would read it %.2f times (add --repeat for that)\n",
                  static_cast<long long>(split), split_tokens, o.batches,
                  static_cast<double>(asked) / split);
    } else if (sequences > split) {
      std::printf("  the validation split (%lld tokens) read %.2f times (--repeat)\n",
                  split_tokens, static_cast<double>(sequences) / split);
    } else {
      std::printf("  %lld of the validation split's %lld sequences (%lld tokens)\n",
                  static_cast<long long>(sequences), static_cast<long long>(split), split_tokens);
    }
  }
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
        for (const auto& [group, values] : by.items()) {
          if (values[l][h].is_null()) {
            std::printf(" %12s", "n/a");  // no token of this group
          } else {
            std::printf(" %12.4f", values[l][h].get<double>());
          }
        }
        std::printf("\n");
      }
    }
  }
  if (result.contains("ablated_loss")) {
    std::printf("gates set to their %s: loss %.6f (change %+.6f)\n",
                o.gate_ablation == "zero" ? "zero" : "mean",
                result["ablated_loss"].get<double>(), result["loss_change"].get<double>());
  }
}

}  // namespace

absl::Status RunEval(const std::vector<std::string>& args) {
  FlagSet flags("eval");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--weights", "weights or checkpoint (safetensors)", true);
  flags.Define("--data", "a prepared dataset (its validation split) or a folder of text files");
  flags.DefineEnum("--data-format", "how to read a folder of text", {"auto", "text", "brown"},
                   "auto");
  flags.DefineBool("--synthetic-data", "evaluate on uniformly random tokens");
  flags.Define("--batch-size", "sequences per batch", false, "8");
  flags.Define("--seq-len", "tokens per sequence", true);
  flags.Define("--batches",
               "batches to average over, at most: a dataset's validation split is scored once "
               "(fewer batches when it is shorter)",
               false, "8");
  flags.DefineBool("--repeat", "with --data DATASET: read the validation split again until "
                   "--batches are done");
  flags.Define("--seed", "data seed", false, "0");
  flags.Define("--threads", "CPU threads", false, "1");
  flags.DefineEnum("--dtype", "precision", {"f32", "f64"}, "f32");
  flags.DefineEnum("--gate-ablation", "SATFormer's gate intervention", {"none", "zero", "mean"},
                   "none");
  flags.DefineBool("--gate-by-category",
                   "SATFormer gates averaged by part-of-speech group (tagged Brown datasets)");
  DefineTaskFlags(&flags);
  flags.Define("--json", "also write the result as JSON to this file");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
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
  SATDAR_ASSIGN_OR_RETURN(o.mqar, TaskFromFlags(flags));
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
  SATDAR_RETURN_IF_ERROR(CheckOutput("--json", flags.Get("--json"), false, inputs));
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
  PrintResult(result, o);
  if (flags.Has("--json")) {
    absl::Status s = core::WriteFileAtomically(flags.Get("--json"), result.dump(2) + "\n");
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--json: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace satdar::cli
