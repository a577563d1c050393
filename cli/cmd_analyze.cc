// satdar analyze cka | rescue | all: the DAR paper's analyses of the residual streams on given
// weights and held-out batches (runtime/analysis.h, docs/ANALYSIS.md): a table on stdout, and
// --json FILE / --png FILE for the result and its heatmap.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "core/file_util.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "model/memory_estimate.h"
#include "runtime/analysis.h"
#include "runtime/eval.h"
#include "runtime/heatmap_png.h"

namespace satdar::cli {

namespace {

void DefineCommonFlags(FlagSet* flags) {
  flags->Define("--config", "model config JSON", true);
  flags->Define("--weights", "weights (safetensors: init, export, PyTorch, or a checkpoint file)");
  flags->Define("--checkpoint", "or: a checkpoint file or folder of any training layout");
  flags->Define("--data", "a prepared dataset (its validation split) or a folder of text files");
  flags->DefineEnum("--data-format", "how to read a folder of text", {"auto", "text", "brown"},
                    "auto");
  flags->DefineBool("--synthetic-data", "uniformly random tokens instead of --data");
  flags->Define("--seq-len", "tokens per sequence", true);
  flags->Define("--batch-size", "sequences per batch", false, "8");
  flags->Define("--batches", "held-out batches, at most (a validation split is read once)", false,
                "4");
  flags->Define("--seed", "data seed (and the random corruption's)", false, "0");
  flags->Define("--threads", "CPU threads", false, "1");
  flags->DefineEnum("--dtype", "precision", {"f32", "f64"}, "f32");
  flags->Define("--json", "write the result as JSON to FILE");
  flags->Define("--png", "write the heatmap to FILE (PNG)");
}

absl::Status Prefixed(const char* command, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("satdar analyze ", command, ": ", s.message()));
}

// The flags every analysis reads, checked; inputs and outputs checked before any work.
absl::Status ReadCommon(const FlagSet& flags, const char* command, runtime::AnalysisOptions* o) {
  runtime::EvalOptions& e = o->eval;
  SATDAR_ASSIGN_OR_RETURN(int64_t batch, flags.GetInt("--batch-size", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t seq, flags.GetInt("--seq-len", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(int64_t batches, flags.GetInt("--batches", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0, kMaxSeed));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1, kMaxThreads));
  e.batch_size = static_cast<int>(batch);
  e.seq_len = static_cast<int>(seq);
  e.batches = static_cast<int>(batches);
  e.seed = static_cast<uint64_t>(seed);
  e.threads = static_cast<int>(threads);
  e.f64 = flags.Get("--dtype") == "f64";
  e.weights = flags.Get("--weights");
  o->checkpoint = flags.Get("--checkpoint");
  e.synthetic_data = flags.GetBool("--synthetic-data");
  e.data_dir = flags.Get("--data");
  e.data_format = flags.Get("--data-format");
  if (flags.Has("--weights") == flags.Has("--checkpoint")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar analyze ", command, ": give exactly one of --weights W or --checkpoint CKPT"));
  }
  if (e.synthetic_data == flags.Has("--data")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar analyze ", command, ": give exactly one of --data DIR or --synthetic-data"));
  }
  const std::vector<InputPath> inputs = {{"--config", flags.Get("--config")},
                                         {"--weights", e.weights},
                                         {"--checkpoint", o->checkpoint, InputPath::kFileOrFolder},
                                         {"--data", e.data_dir, InputPath::kFolder}};
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  for (const char* out : {"--json", "--png"}) {
    if (flags.Has(out)) SATDAR_RETURN_IF_ERROR(CheckOutput(out, flags.Get(out), false, inputs));
  }
  SATDAR_ASSIGN_OR_RETURN(e.config, model::LoadModelConfig(flags.Get("--config")));
  if (e.seq_len > e.config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("satdar analyze ", command, ": --seq-len ", e.seq_len,
                     " exceeds max_position_embeddings ", e.config.max_position_embeddings));
  }
  model::MemoryShape shape;
  shape.use = model::MemoryUse::kForward;
  shape.batch = e.batch_size;
  shape.seq_len = e.seq_len;
  shape.dtype_bytes = e.f64 ? 8 : 4;
  return model::CheckFitsInMemory(e.config, shape, 1, "satdar analyze", kCliBatchNames);
}

absl::Status WriteJson(const FlagSet& flags, const nlohmann::json& result) {
  if (!flags.Has("--json")) return absl::OkStatus();
  absl::Status s = core::WriteFileAtomically(flags.Get("--json"), result.dump(2) + "\n");
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--json: ", s.message()));
  return absl::OkStatus();
}

absl::Status WritePng(const FlagSet& flags, const std::vector<runtime::HeatmapPanel>& panels,
                      const runtime::HeatmapStyle& style) {
  if (!flags.Has("--png")) return absl::OkStatus();
  absl::Status s = runtime::WriteHeatmapPng(flags.Get("--png"), panels, style);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--png: ", s.message()));
  return absl::OkStatus();
}

std::string Cell(const nlohmann::json& v) {
  return v.is_null() ? std::string("  n/a") : absl::StrFormat("%5.2f", v.get<double>());
}

// The CKA table on stdout and its heatmap panels (one per pair of streams).
std::vector<runtime::HeatmapPanel> PrintCka(const nlohmann::json& r) {
  std::printf("linear CKA between depth states: %s, %lld tokens\n",
              r["label"].get<std::string>().c_str(),
              static_cast<long long>(r["tokens"].get<int64_t>()));
  std::vector<runtime::HeatmapPanel> panels;
  std::vector<std::string> labels;
  for (const auto& layer : r["depths"]) labels.push_back(absl::StrCat(layer.get<int>()));
  for (const auto& [name, m] : r["matrices"].items()) {
    const std::string a = name.substr(0, name.find('-')), b = name.substr(name.find('-') + 1);
    std::printf("%s (rows: %s, columns: %s; by layer)\n      ", name.c_str(), a.c_str(),
                b.c_str());
    for (const std::string& l : labels) std::printf(" %5s", l.c_str());
    std::printf("\n");
    runtime::HeatmapPanel p;
    p.title = name;
    p.rows = p.cols = static_cast<int>(labels.size());
    p.row_labels = p.col_labels = labels;
    p.row_axis = absl::StrCat("stream ", a.substr(1), " layer");
    p.col_axis = absl::StrCat("stream ", b.substr(1), " layer");
    for (size_t i = 0; i < m.size(); ++i) {
      std::printf("%5s ", labels[i].c_str());
      for (const auto& v : m[i]) {
        std::printf(" %s", Cell(v).c_str());
        p.values.push_back(v.is_null() ? NAN : v.get<double>());
      }
      std::printf("\n");
    }
    panels.push_back(std::move(p));
  }
  const nlohmann::json& s = r["summary"];
  std::printf("cross-stream, unpaired depths: mean CKA %s, %s of pairs >= %.2f; paired: %s\n",
              Cell(s["mean_unpaired_cross"]).c_str(), Cell(s["high_cross_fraction"]).c_str(),
              s["threshold"].get<double>(), Cell(s["mean_paired_cross"]).c_str());
  return panels;
}

// The rescue table on stdout and its heatmap panel (condition x layer).
runtime::HeatmapPanel PrintRescue(const nlohmann::json& r, int seq_len) {
  std::printf("rescue gain: %s, %s corruption of the first %d of %d positions\n",
              r["label"].get<std::string>().c_str(), r["corruption"].get<std::string>().c_str(),
              r["corrupted_positions"].get<int>(), seq_len);
  std::printf("clean loss %.4f, corrupted %.4f (on %s %d positions)\n",
              r["clean_loss"].get<double>(), r["corrupted_loss"].get<double>(),
              r["scored"] == "all" ? "all" : "the last", r["scored_positions"].get<int>());
  if (r["gap"].get<double>() < 0) {
    std::printf("note: the corruption lowers the loss here; the gains are fractions of a "
                "negative gap\n");
  }
  // Rows in a reading order: neither, s0 .., both.
  std::vector<std::string> order = {"neither"};
  for (int s = 0; s < r["streams"].get<int>(); ++s) order.push_back(absl::StrCat("s", s));
  order.push_back("both");
  std::printf("layer");
  for (const std::string& n : order) std::printf(" %8s", n.c_str());
  std::printf("\n");
  runtime::HeatmapPanel p;
  p.title = absl::StrCat("rescue gain ", r["label"].get<std::string>());
  p.rows = static_cast<int>(order.size());
  p.cols = static_cast<int>(r["depths"].size());
  p.row_labels = order;
  p.row_axis = "restored";
  p.col_axis = "after layer";
  p.values.assign(static_cast<size_t>(p.rows) * p.cols, NAN);
  for (int c = 0; c < p.cols; ++c) {
    const nlohmann::json& d = r["depths"][c];
    p.col_labels.push_back(absl::StrCat(d["layer"].get<int>()));
    std::printf("%5d", d["layer"].get<int>());
    for (size_t i = 0; i < order.size(); ++i) {
      const double g = d["gain"][order[i]].get<double>();
      std::printf(" %8.3f", g);
      p.values[i * p.cols + c] = g;
    }
    std::printf("\n");
  }
  if (!r["summary"]["asymmetry"].is_null()) {
    std::printf("mean gain s0 %.3f, s1 %.3f; asymmetry %.3f\n",
                r["summary"]["mean_gain"]["s0"].get<double>(),
                r["summary"]["mean_gain"]["s1"].get<double>(),
                r["summary"]["asymmetry"].get<double>());
  }
  // Gains beyond [0, 1] (a restored stream that overshoots) clamp in the picture only.
  return p;
}

void DefineCkaFlags(FlagSet* flags) {
  flags->Define("--threshold", "a cross-stream pair counts as highly similar from this CKA on",
                false, "0.9");
}
void DefineRescueFlags(FlagSet* flags) {
  flags->DefineEnum("--corruption",
                    "swap: the span from the next sequence of the batch; random: random tokens",
                    {"swap", "random"}, "swap");
  flags->Define("--corrupt-fraction", "the share of each sequence's first positions corrupted",
                false, "0.5");
  flags->DefineEnum("--score",
                    "the positions scored: all, or only those after the corrupted span",
                    {"all", "after"}, "all");
  flags->Define("--layers",
                "restore after these layers, comma-separated [default: all, 1 .. L-1]");
}

absl::Status ReadCkaFlags(const FlagSet& flags, runtime::AnalysisOptions* o) {
  SATDAR_ASSIGN_OR_RETURN(o->cka_threshold, flags.GetDouble("--threshold", 0, 1));
  return absl::OkStatus();
}
absl::Status ReadRescueFlags(const FlagSet& flags, runtime::AnalysisOptions* o) {
  o->corruption = flags.Get("--corruption") == "swap" ? runtime::Corruption::kSwap
                                                      : runtime::Corruption::kRandom;
  SATDAR_ASSIGN_OR_RETURN(o->corrupt_fraction, flags.GetDouble("--corrupt-fraction", 0, 1));
  o->scored = flags.Get("--score") == "all" ? runtime::Scored::kAll : runtime::Scored::kAfterSpan;
  if (flags.Has("--layers")) {
    for (absl::string_view part : absl::StrSplit(flags.Get("--layers"), ',')) {
      int k = 0;
      if (!absl::SimpleAtoi(part, &k)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "satdar analyze rescue: --layers: '", part, "' is not a layer number"));
      }
      o->layers.push_back(k);
    }
  }
  return absl::OkStatus();
}

absl::Status RunCka(const std::vector<std::string>& args) {
  FlagSet flags("analyze cka");
  DefineCommonFlags(&flags);
  DefineCkaFlags(&flags);
  flags.Define("--save-states", "also write the depth states to FILE (.npy, float64 (S, n, C))");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  runtime::AnalysisOptions o;
  SATDAR_RETURN_IF_ERROR(ReadCommon(flags, "cka", &o));
  const bool save = flags.Has("--save-states");
  if (save) {
    SATDAR_RETURN_IF_ERROR(CheckOutput("--save-states", flags.Get("--save-states"), false,
                                       {{"--config", flags.Get("--config")}}));
  }
  SATDAR_RETURN_IF_ERROR(ReadCkaFlags(flags, &o));
  runtime::CkaStates states;
  absl::StatusOr<nlohmann::json> result = runtime::AnalyzeCka(o, save ? &states : nullptr);
  SATDAR_RETURN_IF_ERROR(Prefixed("cka", result.status()));
  const std::vector<runtime::HeatmapPanel> panels = PrintCka(*result);
  SATDAR_RETURN_IF_ERROR(WriteJson(flags, *result));
  SATDAR_RETURN_IF_ERROR(WritePng(flags, panels, runtime::HeatmapStyle{}));
  if (save) {
    absl::Status st = runtime::WriteStatesNpy(flags.Get("--save-states"), states);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("--save-states: ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status RunRescue(const std::vector<std::string>& args) {
  FlagSet flags("analyze rescue");
  DefineCommonFlags(&flags);
  DefineRescueFlags(&flags);
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  runtime::AnalysisOptions o;
  SATDAR_RETURN_IF_ERROR(ReadCommon(flags, "rescue", &o));
  SATDAR_RETURN_IF_ERROR(ReadRescueFlags(flags, &o));
  absl::StatusOr<nlohmann::json> result = runtime::AnalyzeRescue(o);
  SATDAR_RETURN_IF_ERROR(Prefixed("rescue", result.status()));
  const runtime::HeatmapPanel panel = PrintRescue(*result, o.eval.seq_len);
  SATDAR_RETURN_IF_ERROR(WriteJson(flags, *result));
  return WritePng(flags, {panel}, runtime::HeatmapStyle{});
}

// Every analysis the checkpoint's design has, into one JSON (and the heatmaps beside it): the
// held-out loss and the design's statistics (eval), SATFormer's gate ablation and gates by
// part of speech (a tagged Brown dataset), and the streams' CKA and rescue (DAR, HC, mHC).
absl::Status RunAll(const std::vector<std::string>& args) {
  FlagSet flags("analyze all");
  DefineCommonFlags(&flags);
  DefineCkaFlags(&flags);
  DefineRescueFlags(&flags);
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  runtime::AnalysisOptions o;
  SATDAR_RETURN_IF_ERROR(ReadCommon(flags, "all", &o));
  SATDAR_RETURN_IF_ERROR(ReadCkaFlags(flags, &o));
  SATDAR_RETURN_IF_ERROR(ReadRescueFlags(flags, &o));
  const model::ModelConfig& c = o.eval.config;
  nlohmann::json all = {{"command", "all"}, {"design", model::DesignName(c)}};
  nlohmann::json skipped = nlohmann::json::object();
  // The loss and statistics, with SATFormer's analyses when the model has gates.
  runtime::EvalOptions e = o.eval;
  e.checkpoint = o.checkpoint;
  const bool gates = c.value_residual == model::ValueResidualKind::kSatFormer;
  if (gates) {
    e.gate_ablation = "zero";
    absl::StatusOr<bool> pos = runtime::HasPosTags(e);
    SATDAR_RETURN_IF_ERROR(Prefixed("all", pos.status()));
    e.gate_by_category = *pos;
    if (!*pos) skipped["gate_by_category"] = "the data has no part-of-speech tags";
  } else {
    skipped["gate_ablation"] = "the design has no SATFormer gates";
  }
  absl::StatusOr<nlohmann::json> eval = runtime::Evaluate(e);
  SATDAR_RETURN_IF_ERROR(Prefixed("all", eval.status()));
  std::printf("loss %.6f over %lld tokens\n", (*eval)["loss"].get<double>(),
              static_cast<long long>((*eval)["tokens"].get<int64_t>()));
  if (gates) {
    std::printf("SATFormer gates set to zero: loss %.6f (change %+.6f)\n",
                (*eval)["ablated_loss"].get<double>(), (*eval)["loss_change"].get<double>());
  }
  all["eval"] = *eval;
  const bool streams = c.residual == model::Residual::kDar || c.residual == model::Residual::kHc ||
                       c.residual == model::Residual::kMhc;
  std::vector<runtime::HeatmapPanel> panels;
  if (streams) {
    absl::StatusOr<nlohmann::json> cka = runtime::AnalyzeCka(o, nullptr);
    SATDAR_RETURN_IF_ERROR(Prefixed("all", cka.status()));
    panels = PrintCka(*cka);
    absl::StatusOr<nlohmann::json> rescue = runtime::AnalyzeRescue(o);
    SATDAR_RETURN_IF_ERROR(Prefixed("all", rescue.status()));
    panels.push_back(PrintRescue(*rescue, o.eval.seq_len));
    all["cka"] = *cka;
    all["rescue"] = *rescue;
  } else {
    skipped["cka"] = skipped["rescue"] = absl::StrCat(
        "residual \"", model::Name(c.residual), "\" keeps one residual stream");
  }
  for (const auto& [name, why] : skipped.items()) {
    std::printf("no %s: %s\n", name.c_str(), why.get<std::string>().c_str());
  }
  all["skipped"] = skipped;
  SATDAR_RETURN_IF_ERROR(WriteJson(flags, all));
  if (panels.empty()) return absl::OkStatus();
  return WritePng(flags, panels, runtime::HeatmapStyle{});
}

}  // namespace

absl::Status RunAnalyze(const std::vector<std::string>& args) {
  const std::string usage =
      "usage: satdar analyze cka|rescue|all [flags] (--help for each)\n"
      "  cka     linear CKA between the residual streams' depth states (DAR, HC, mHC)\n"
      "  rescue  how much of a corrupted input's loss each stream restores from a clean run\n"
      "  all     every analysis the design has (loss and statistics, SATFormer's gate ablation\n"
      "          and gates by part of speech, CKA and rescue) into one JSON and one PNG";
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf("%s\n", usage.c_str());
    if (args.empty()) return absl::InvalidArgumentError("satdar analyze: name an analysis");
    return absl::OkStatus();
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "cka") return RunCka(rest);
  if (args[0] == "rescue") return RunRescue(rest);
  if (args[0] == "all") return RunAll(rest);
  return absl::InvalidArgumentError(absl::StrCat("satdar analyze: unknown analysis '", args[0],
                                                 "' (cka, rescue or all)"));
}

}  // namespace satdar::cli
