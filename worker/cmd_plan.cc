// `satdar plan`: the cost of one training step of a config on a layout, before a single rank
// runs (model/cost_model.h): the bytes global rank 0 hands to each group and what each
// pipeline boundary carries, in the form `satdar train --log-jsonl` logs them, and the memory
// a rank needs by kind.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "model/cost_model.h"
#include "nlohmann/json.hpp"
#include "worker/cli_util.h"
#include "worker/commands.h"
#include "worker/flags.h"

namespace satdar::worker {

namespace {

using Json = nlohmann::json;

// "DP,TP,PP,EP" -> the four sizes.
absl::Status ParseLayout(const std::string& text, model::MemoryShape* l) {
  const std::vector<std::string> parts = absl::StrSplit(text, ',');
  int v[4];
  bool ok = parts.size() == 4;
  for (size_t i = 0; ok && i < 4; ++i) ok = absl::SimpleAtoi(parts[i], &v[i]) && v[i] >= 1 && v[i] <= kMaxRanks;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar plan: flag --layout must be DP,TP,PP,EP (four sizes from 1 to ", kMaxRanks,
        "), got '", text, "'"));
  }
  l->dp = v[0];
  l->tp = v[1];
  l->pp = v[2];
  l->ep = v[3];
  return absl::OkStatus();
}

Json ToJson(const model::StepCost& cost, const model::MemoryShape& l) {
  Json boundaries = Json::array();
  for (const auto& [fwd, bwd] : cost.pp_boundary_bytes) boundaries.push_back({fwd, bwd});
  const model::MemoryEstimate& m = cost.memory;
  return {{"layout", {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"ep", l.ep},
                      {"virtual_stages", l.virtual_stages}, {"microbatches", l.microbatches},
                      {"sequence_parallel", l.sequence_parallel}}},
          {"comm_bytes", cost.comm_bytes},
          {"ep_bytes_exact", cost.ep_exact},
          {"pp_boundary_bytes", boundaries},
          {"memory_bytes", {{"weights", m.parameter_bytes},
                            {"gradients", m.gradient_bytes},
                            {"optimizer", m.optimizer_bytes},
                            {"activations", m.activation_bytes},
                            {"total", m.total()}}}};
}

}  // namespace

absl::Status RunPlan(const std::vector<std::string>& args) {
  FlagSet flags("plan");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--layout", "DP,TP,PP,EP: the layout to cost", true);
  flags.Define("--batch-size", "sequences per optimizer step per data-parallel replica", true);
  flags.Define("--seq-len", "tokens per sequence", true);
  flags.Define("--microbatches", "micro-batches per step (the pipeline's M)", false, "1");
  flags.Define("--virtual-stages", "model chunks per pipeline rank (interleaved 1F1B)", false, "1");
  flags.DefineBool("--sequence-parallel", "sequence parallelism over the TP group");
  flags.DefineEnum("--recompute", "activations recomputed in backward",
                   {"none", "selective", "full"}, "none");
  flags.DefineEnum("--zero", "ZeRO stage: 0 or 1", {"0", "1"}, "0");
  flags.Define("--vocab-multiple", "the vocabulary padded to a multiple of TP x N", false, "1");
  flags.DefineEnum("--dtype", "what the step computes in (the bytes per element)",
                   {"f32", "f64"}, "f32");
  flags.DefineBool("--json", "one JSON object");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_RETURN_IF_ERROR(CheckInputs({{"--config", flags.Get("--config")}}));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  model::MemoryShape l;
  SATDAR_RETURN_IF_ERROR(ParseLayout(flags.Get("--layout"), &l));
  SATDAR_ASSIGN_OR_RETURN(l.batch, flags.GetInt("--batch-size", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(l.seq_len, flags.GetInt("--seq-len", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(l.microbatches, flags.GetInt("--microbatches", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t chunks, flags.GetInt("--virtual-stages", 1, 64));
  SATDAR_ASSIGN_OR_RETURN(int64_t multiple, flags.GetInt("--vocab-multiple", 1, 65536));
  l.virtual_stages = static_cast<int>(chunks);
  l.vocab_multiple = static_cast<int>(multiple);
  l.sequence_parallel = flags.GetBool("--sequence-parallel");
  l.recompute = model::RecomputeNamed(flags.Get("--recompute"));
  l.zero_stage = flags.Get("--zero") == "1" ? 1 : 0;
  l.dtype_bytes = flags.Get("--dtype") == "f64" ? 8 : 4;
  if (l.batch % l.microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("satdar plan: --batch-size ", l.batch,
                                                   " is not divisible by --microbatches ",
                                                   l.microbatches));
  }
  if (l.seq_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar plan: --seq-len ", l.seq_len, " exceeds max_position_embeddings ",
        config.max_position_embeddings, " of ", flags.Get("--config")));
  }
  absl::StatusOr<model::StepCost> cost = model::PredictStep(config, l);
  if (!cost.ok()) {
    return absl::Status(cost.status().code(),
                        absl::StrCat("satdar plan: ", cost.status().message()));
  }
  if (flags.GetBool("--json")) {
    std::printf("%s\n", ToJson(*cost, l).dump().c_str());
    return absl::OkStatus();
  }
  std::printf("one step of %s on dp=%d tp=%d pp=%d ep=%d (batch %lld x %lld, %lld micro-batches)\n",
              flags.Get("--config").c_str(), l.dp, l.tp, l.pp, l.ep,
              static_cast<long long>(l.batch), static_cast<long long>(l.seq_len),
              static_cast<long long>(l.microbatches));
  std::printf("bytes rank 0 hands to each group:\n");
  for (const auto& [group, bytes] : cost->comm_bytes) {
    std::printf("  %-5s %12.2f MiB%s\n", group.c_str(), bytes / 1048576.0,
                group == "ep" && !cost->ep_exact ? " (expected, uniform routing)" : "");
  }
  for (size_t j = 0; j < cost->pp_boundary_bytes.size(); ++j) {
    std::printf("  boundary %zu: %.2f MiB forward, %.2f MiB backward\n", j,
                cost->pp_boundary_bytes[j].first / 1048576.0,
                cost->pp_boundary_bytes[j].second / 1048576.0);
  }
  std::printf("memory of the largest stage's rank: %s (%s)\n",
              model::FormatBytes(cost->memory.total()).c_str(), cost->memory.Breakdown().c_str());
  return absl::OkStatus();
}

}  // namespace satdar::worker
