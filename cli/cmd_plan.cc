// `satdar plan`: what one training step of a config costs before a single rank runs.
//   --layout DP,TP,PP,EP: the bytes global rank 0 hands to each group and what each pipeline
//     boundary carries (model/cost_model.h, in the form `satdar train --log-jsonl` logs them),
//     the memory a rank needs by kind, and with --gpu or --hardware the step time, tokens/s
//     and MFU (model/step_time.h);
//   --nodes N --gpus-per-node G --gpu NAME: the best layouts of that cluster
//     (model/layout_search.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "model/cost_model.h"
#include "model/hardware.h"
#include "model/layout_search.h"
#include "model/memory_estimate.h"
#include "model/step_time.h"
#include "nlohmann/json.hpp"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/flags.h"

namespace satdar::cli {

namespace {

using Json = nlohmann::json;

absl::Status PlanError(const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("satdar plan: ", s.message()));
}

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
  const int64_t world = int64_t{v[0]} * v[1] * v[2] * v[3];
  if (world > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("satdar plan: flag --layout ", text, " is ",
                                                   world, " ranks, more than ", kMaxRanks));
  }
  l->dp = v[0];
  l->tp = v[1];
  l->pp = v[2];
  l->ep = v[3];
  return absl::OkStatus();
}

Json LayoutJson(const model::MemoryShape& l) {
  return {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"ep", l.ep},
          {"virtual_stages", l.virtual_stages}, {"microbatches", l.microbatches},
          {"sequence_parallel", l.sequence_parallel}, {"recompute", model::Name(l.recompute)},
          {"zero", l.zero_stage}, {"batch_size", l.batch}, {"seq_len", l.seq_len}};
}

Json CostJson(const model::StepCost& cost, const model::MemoryShape& l) {
  Json boundaries = Json::array();
  for (const auto& [fwd, bwd] : cost.pp_boundary_bytes) boundaries.push_back({fwd, bwd});
  const model::MemoryEstimate& m = cost.memory;
  return {{"layout", LayoutJson(l)},
          {"comm_bytes", cost.comm_bytes},
          {"ep_bytes_exact", cost.ep_exact},
          {"pp_boundary_bytes", boundaries},
          {"memory_bytes", {{"weights", m.parameter_bytes},
                            {"gradients", m.gradient_bytes},
                            {"optimizer", m.optimizer_bytes},
                            {"activations", m.activation_bytes},
                            {"total", m.total()}}}};
}

Json TimeJson(const model::Candidate& c, const model::Hardware& hw, int ops) {
  Json j = CostJson(c.cost, c.layout);
  const model::StepTime& t = c.time;
  j["hardware"] = hw.name;
  j["step_seconds"] = t.step_seconds;
  j["tokens_per_second"] = c.tokens_per_second;
  j["mfu"] = c.mfu;
  j["fits"] = c.fits;
  j["step_time"] = {{"compute", t.compute_seconds}, {"tp", t.tp_seconds}, {"ep", t.ep_seconds},
                    {"pp", t.pp_seconds},           {"bubble", t.bubble_seconds},
                    {"data", t.data_seconds},       {"optimizer", t.optimizer_seconds}};
  Json list = Json::array();
  for (int i = 0; i < ops && i < static_cast<int>(t.ops.size()); ++i) {
    const model::OpTime& op = t.ops[i];
    list.push_back({{"name", op.name}, {"flops", op.flops}, {"bytes", op.bytes},
                    {"seconds", op.seconds}});
  }
  j["ops"] = list;
  return j;
}

std::string Seconds(double s) {
  if (s >= 1) return absl::StrFormat("%.3f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.2f ms", s * 1e3);
  return absl::StrFormat("%.1f us", s * 1e6);
}

void PrintCost(const model::StepCost& cost) {
  std::printf("bytes rank 0 hands to each group:\n");
  for (const auto& [group, bytes] : cost.comm_bytes) {
    std::printf("  %-5s %12.2f MiB%s\n", group.c_str(), bytes / 1048576.0,
                group == "ep" && !cost.ep_exact ? " (expected, uniform routing)" : "");
  }
  for (size_t j = 0; j < cost.pp_boundary_bytes.size(); ++j) {
    std::printf("  boundary %zu: %.2f MiB forward, %.2f MiB backward\n", j,
                cost.pp_boundary_bytes[j].first / 1048576.0,
                cost.pp_boundary_bytes[j].second / 1048576.0);
  }
  std::printf("memory of the largest stage's rank: %s (%s)\n",
              model::FormatBytes(cost.memory.total()).c_str(), cost.memory.Breakdown().c_str());
}

void PrintTime(const model::Candidate& c, const model::Hardware& hw) {
  const model::StepTime& t = c.time;
  std::printf("predicted on %s: step %s, %.0f tokens/s, MFU %.1f%%%s\n", hw.description.c_str(),
              Seconds(t.step_seconds).c_str(), c.tokens_per_second, 100 * c.mfu,
              c.fits ? "" : " (does NOT fit in memory)");
  std::printf("  compute %s (of it TP %s, EP %s), bubble %s, pipeline sends %s, gradient "
              "reduction %s, optimizer %s\n",
              Seconds(t.compute_seconds).c_str(), Seconds(t.tp_seconds).c_str(),
              Seconds(t.ep_seconds).c_str(), Seconds(t.bubble_seconds).c_str(),
              Seconds(t.pp_seconds).c_str(), Seconds(t.data_seconds).c_str(),
              Seconds(t.optimizer_seconds).c_str());
  std::printf("  slowest ops (per step, slowest stage):\n");
  for (size_t i = 0; i < t.ops.size() && i < 8; ++i) {
    const model::OpTime& op = t.ops[i];
    std::printf("    %-24s %10s  %9.2f TFLOP  %9.2f GiB\n", op.name.c_str(),
                Seconds(op.seconds).c_str(), op.flops / 1e12, op.bytes / 1073741824.0);
  }
}

std::string LayoutLine(const model::Candidate& c) {
  const model::MemoryShape& l = c.layout;
  return absl::StrFormat("%4d %3d %3d %3d %4lld %2d %-9s %3s %4d  %10s %12.0f %6.1f%%  %s", l.dp,
                         l.tp, l.pp, l.ep, static_cast<long long>(l.microbatches),
                         l.virtual_stages, model::Name(l.recompute),
                         l.sequence_parallel ? "on" : "off", l.zero_stage,
                         Seconds(c.time.step_seconds), c.tokens_per_second, 100 * c.mfu,
                         model::FormatBytes(c.cost.memory.total()));
}

// The device: --gpu NAME from the table or --hardware FILE.
absl::StatusOr<model::Hardware> HardwareFrom(const FlagSet& flags) {
  if (flags.Has("--gpu") && flags.Has("--hardware")) {
    return absl::InvalidArgumentError("satdar plan: give --gpu or --hardware, not both");
  }
  if (flags.Has("--hardware")) {
    SATDAR_RETURN_IF_ERROR(CheckInputs({{"--hardware", flags.Get("--hardware")}}));
    absl::StatusOr<model::Hardware> h = model::LoadHardware(flags.Get("--hardware"));
    if (!h.ok()) return PlanError(h.status());
    return h;
  }
  return model::FindHardware(flags.Get("--gpu"));
}

// --nodes: the fastest layouts of the cluster (model/layout_search.h), as a table or JSON.
absl::Status RunSearch(const FlagSet& flags, const model::ModelConfig& config,
                       const model::Hardware& hw, const std::string& dtype, int64_t seq_len,
                       int64_t multiple, int64_t per_node, int64_t threads) {
  model::Cluster cluster;
  SATDAR_ASSIGN_OR_RETURN(int64_t nodes, flags.GetInt("--nodes", 1, kMaxRanks));
  cluster.nodes = static_cast<int>(nodes);
  cluster.ranks_per_node = static_cast<int>(per_node);
  cluster.hardware = hw;
  cluster.threads = static_cast<int>(threads);
  cluster.dtype_bytes = dtype == "f64" ? 8 : 4;
  if (nodes * per_node > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("satdar plan: --nodes x --gpus-per-node = ",
                                                   nodes * per_node, " ranks, more than ",
                                                   kMaxRanks));
  }
  model::SearchRequest request;
  request.seq_len = seq_len;
  request.vocab_multiple = static_cast<int>(multiple);
  SATDAR_ASSIGN_OR_RETURN(int64_t top, flags.GetInt("--top", 1, 1000));
  request.top = static_cast<int>(top);
  // What the user fixes, the search keeps; the rest it chooses.
  if (flags.Has("--microbatches")) {
    SATDAR_ASSIGN_OR_RETURN(request.microbatches, flags.GetInt("--microbatches", 1, kMaxBatch));
  }
  if (flags.Has("--virtual-stages")) {
    SATDAR_ASSIGN_OR_RETURN(int64_t v, flags.GetInt("--virtual-stages", 1, 64));
    request.virtual_stages = static_cast<int>(v);
  }
  if (flags.Has("--zero")) request.zero_stage = flags.Get("--zero") == "1" ? 1 : 0;
  if (flags.Has("--sequence-parallel")) request.sequence_parallel = 1;
  if (flags.Has("--recompute")) {
    request.recompute_fixed = true;
    request.recompute = model::RecomputeNamed(flags.Get("--recompute"));
  }
  if (flags.Has("--batch-size") == flags.Has("--global-batch-size")) {
    return absl::InvalidArgumentError("satdar plan: a search needs --global-batch-size "
                                      "(the same run for every layout) or --batch-size (per "
                                      "data-parallel replica), one of them");
  }
  if (flags.Has("--batch-size")) {
    SATDAR_ASSIGN_OR_RETURN(request.batch_per_replica, flags.GetInt("--batch-size", 1, kMaxBatch));
  } else {
    SATDAR_ASSIGN_OR_RETURN(request.global_batch, flags.GetInt("--global-batch-size", 1, kMaxBatch));
  }
  absl::StatusOr<model::SearchResult> result = model::SearchLayouts(config, cluster, request);
  if (!result.ok()) return PlanError(result.status());
  if (flags.GetBool("--json")) {
    Json layouts = Json::array();
    for (const model::Candidate& c : result->best) layouts.push_back(TimeJson(c, hw, 12));
    Json out = {{"cluster", {{"nodes", cluster.nodes}, {"gpus_per_node", cluster.ranks_per_node},
                             {"hardware", hw.name}}},
                {"tried", result->tried},
                {"fitting", result->fitting},
                {"layouts", layouts}};
    std::printf("%s\n", out.dump().c_str());
    return absl::OkStatus();
  }
  std::printf("%s on %lld x %lld %s: %lld layouts tried, %lld fit in %s each; the fastest:\n",
              flags.Get("--config").c_str(), static_cast<long long>(nodes),
              static_cast<long long>(per_node), hw.description.c_str(),
              static_cast<long long>(result->tried), static_cast<long long>(result->fitting),
              model::FormatBytes(static_cast<int64_t>(model::kUsableMemory * hw.memory_bytes)).c_str());
  std::printf("  dp  tp  pp  ep    M  V recompute  sp zero        step     tokens/s     MFU  memory/%s\n",
              hw.gpu ? "GPU" : "rank");
  for (const model::Candidate& c : result->best) std::printf("%s\n", LayoutLine(c).c_str());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunPlan(const std::vector<std::string>& args) {
  FlagSet flags("plan");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--layout", "DP,TP,PP,EP: the layout to cost (or --nodes to search)");
  flags.Define("--nodes", "search the layouts of this many nodes (instead of --layout)");
  flags.Define("--gpus-per-node", "devices (ranks) per node", false, "8");
  flags.DefineEnum("--gpu", "the device, from the built-in table", model::HardwareNames(), "h200");
  flags.Define("--hardware", "the device from a JSON file (model/hardware.h's fields)");
  flags.Define("--batch-size", "sequences per optimizer step per data-parallel replica");
  flags.Define("--global-batch-size", "search: sequences per optimizer step over all replicas");
  flags.Define("--seq-len", "tokens per sequence", true);
  flags.Define("--microbatches", "micro-batches per step (the pipeline's M; a search keeps it when given)", false, "1");
  flags.Define("--virtual-stages", "model chunks per pipeline rank (interleaved 1F1B; kept by a search)", false, "1");
  flags.DefineBool("--sequence-parallel", "sequence parallelism over the TP group (a search: only with it)");
  flags.DefineEnum("--recompute", "activations recomputed in backward (kept by a search)",
                   {"none", "selective", "full"}, "none");
  flags.DefineEnum("--zero", "ZeRO stage: 0 or 1 (kept by a search)", {"0", "1"}, "0");
  flags.Define("--vocab-multiple", "the vocabulary padded to a multiple of TP x N", false, "1");
  flags.DefineEnum("--dtype",
                   "what the step computes in: f32/f64 as the CPU trainer, bf16 as the GPU's "
                   "mixed precision (default with --gpu)",
                   {"auto", "f32", "f64", "bf16"}, "auto");
  flags.Define("--threads", "CPU hardware: threads per rank", false, "1");
  flags.Define("--top", "search: how many layouts to print", false, "10");
  flags.DefineBool("--json", "one JSON object");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_RETURN_IF_ERROR(CheckInputs({{"--config", flags.Get("--config")}}));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  const bool search = flags.Has("--nodes");
  if (search == flags.Has("--layout")) {
    return absl::InvalidArgumentError(
        "satdar plan: give --layout DP,TP,PP,EP (one layout) or --nodes N (a search)");
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t seq_len, flags.GetInt("--seq-len", 1, kMaxSeqLen));
  if (seq_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar plan: --seq-len ", seq_len, " exceeds max_position_embeddings ",
        config.max_position_embeddings, " of ", flags.Get("--config")));
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t multiple, flags.GetInt("--vocab-multiple", 1, 65536));
  SATDAR_ASSIGN_OR_RETURN(int64_t per_node, flags.GetInt("--gpus-per-node", 1, 1024));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1, kMaxThreads));
  const bool timed = search || flags.Has("--gpu") || flags.Has("--hardware");
  model::Hardware hw;
  if (timed) {
    SATDAR_ASSIGN_OR_RETURN(hw, HardwareFrom(flags));
  }
  const std::string dtype = flags.Get("--dtype");
  if (dtype == "bf16" && timed && !hw.gpu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar plan: --dtype bf16 is the GPU's mixed precision; hardware '", hw.name,
        "' is a CPU (f32 or f64)"));
  }
  if (dtype == "bf16" && !timed) {
    return absl::InvalidArgumentError(
        "satdar plan: --dtype bf16 needs --gpu (the CPU trainer computes in f32 or f64)");
  }
  const bool mixed = dtype == "bf16" || (dtype == "auto" && timed && hw.gpu);
  if (timed && hw.gpu && (dtype == "f32" || dtype == "f64")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar plan: on a GPU the planner models bf16 mixed precision (the default); --dtype ",
        dtype, " is for CPU hardware (--hardware)"));
  }

  if (search) {
    return RunSearch(flags, config, hw, dtype, seq_len, multiple, per_node, threads);
  }

  model::MemoryShape l;
  SATDAR_RETURN_IF_ERROR(ParseLayout(flags.Get("--layout"), &l));
  if (!flags.Has("--batch-size")) {
    return absl::InvalidArgumentError("satdar plan: --layout needs --batch-size (sequences per "
                                      "step per data-parallel replica)");
  }
  if (flags.Has("--global-batch-size") || flags.Has("--top") || flags.Has("--nodes")) {
    return absl::InvalidArgumentError("satdar plan: --global-batch-size and --top are for a "
                                      "search (--nodes)");
  }
  SATDAR_ASSIGN_OR_RETURN(l.batch, flags.GetInt("--batch-size", 1, kMaxBatch));
  l.seq_len = seq_len;
  SATDAR_ASSIGN_OR_RETURN(l.microbatches, flags.GetInt("--microbatches", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t chunks, flags.GetInt("--virtual-stages", 1, 64));
  l.virtual_stages = static_cast<int>(chunks);
  l.vocab_multiple = static_cast<int>(multiple);
  l.sequence_parallel = flags.GetBool("--sequence-parallel");
  l.recompute = model::RecomputeNamed(flags.Get("--recompute"));
  l.zero_stage = flags.Get("--zero") == "1" ? 1 : 0;
  l.mixed_precision = mixed;
  l.flash_attention = timed && hw.gpu;
  l.dtype_bytes = mixed ? 2 : dtype == "f64" ? 8 : 4;
  if (l.batch % l.microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("satdar plan: --batch-size ", l.batch,
                                                   " is not divisible by --microbatches ",
                                                   l.microbatches));
  }
  if (!timed) {
    absl::StatusOr<model::StepCost> cost = model::PredictStep(config, l);
    if (!cost.ok()) return PlanError(cost.status());
    if (flags.GetBool("--json")) {
      std::printf("%s\n", CostJson(*cost, l).dump().c_str());
      return absl::OkStatus();
    }
    std::printf("one step of %s on dp=%d tp=%d pp=%d ep=%d (batch %lld x %lld, %lld micro-batches)\n",
                flags.Get("--config").c_str(), l.dp, l.tp, l.pp, l.ep,
                static_cast<long long>(l.batch), static_cast<long long>(l.seq_len),
                static_cast<long long>(l.microbatches));
    PrintCost(*cost);
    return absl::OkStatus();
  }
  const int world = l.dp * l.tp * l.pp * l.ep;
  model::Placement placement;
  // A CPU's ranks all run on this machine unless --gpus-per-node says how many share one.
  placement.ranks_per_node =
      !hw.gpu && !flags.Has("--gpus-per-node") ? world : static_cast<int>(per_node);
  placement.threads = static_cast<int>(threads);
  absl::StatusOr<model::Candidate> c = model::PredictLayout(config, l, hw, placement);
  if (!c.ok()) return PlanError(c.status());
  if (flags.GetBool("--json")) {
    std::printf("%s\n", TimeJson(*c, hw, 1000).dump().c_str());
    return absl::OkStatus();
  }
  std::printf("one step of %s on dp=%d tp=%d pp=%d ep=%d (batch %lld x %lld, %lld micro-batches)\n",
              flags.Get("--config").c_str(), l.dp, l.tp, l.pp, l.ep,
              static_cast<long long>(l.batch), static_cast<long long>(l.seq_len),
              static_cast<long long>(l.microbatches));
  PrintCost(c->cost);
  PrintTime(*c, hw);
  return absl::OkStatus();
}

}  // namespace satdar::cli
