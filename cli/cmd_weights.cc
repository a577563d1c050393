// satdar init, export and info: a model's weights and parameter table.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/safetensors.h"
#include "model/memory_estimate.h"
#include "model/model.h"
#include "runtime/checkpoint.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "runtime/weights.h"

namespace satdar::cli {

namespace {

// A checkpoint (one file, or a folder of model-parallel shards) as one weights file with the
// whole model under its MODELS.md names.
template <typename T>
absl::Status ExportTyped(const model::ModelConfig& config, const std::string& checkpoint,
                         const std::string& out_path) {
  SATDAR_ASSIGN_OR_RETURN(const model::ParamTable table,
                          model::BuildParamTable(config, model::Sharding{}));
  std::vector<T> params(table.size());
  absl::Status loaded = runtime::LoadCheckpoint<T>(checkpoint, model::ModelConfigToJson(config),
                                                   table, {&params, nullptr, nullptr})
                            .status();
  if (!loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat("--checkpoint: ", loaded.message()));
  }
  SATDAR_RETURN_IF_ERROR(
      runtime::CheckFiniteWeights("--checkpoint: " + checkpoint, table, params.data()));
  std::vector<core::TensorRef> out;
  for (const auto& spec : table.specs()) {
    out.push_back({spec.name, core::DTypeOf<T>::value, spec.shape, params.data() + spec.offset});
  }
  absl::Status s =
      core::WriteSafetensors(out_path, out, {{"config", model::ModelConfigToJson(config)}});
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--out: ", s.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunInit(const std::vector<std::string>& args) {
  FlagSet flags("init");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--out", "where to write the initial weights (safetensors)", true);
  flags.Define("--seed", "initialisation seed", false, "0");
  flags.DefineEnum("--dtype", "dtype of the written weights", {"f32", "f64"}, "f32");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0, kMaxSeed));
  const bool f64 = flags.Get("--dtype") == "f64";
  const std::vector<InputPath> inputs = {{"--config", flags.Get("--config")}};
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  SATDAR_RETURN_IF_ERROR(CheckOutput("--out", flags.Get("--out"), false, inputs));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  model::MemoryShape shape;
  shape.use = model::MemoryUse::kWeights;
  shape.dtype_bytes = 8 + 4;  // initialised in f64, written from an f32 copy
  SATDAR_RETURN_IF_ERROR(model::CheckFitsInMemory(config, shape, 1, "satdar init", kCliBatchNames));
  SATDAR_ASSIGN_OR_RETURN(const model::ParamTable table,
                          model::BuildParamTable(config, model::Sharding{}));
  std::vector<double> params(table.size());
  table.Initialize(params.data(), static_cast<uint64_t>(seed));
  std::vector<float> params32;
  if (!f64) params32.assign(params.begin(), params.end());
  std::vector<core::TensorRef> out;
  for (const auto& spec : table.specs()) {
    const void* p = f64 ? static_cast<const void*>(params.data() + spec.offset)
                        : static_cast<const void*>(params32.data() + spec.offset);
    out.push_back({spec.name, f64 ? core::DType::kF64 : core::DType::kF32, spec.shape, p});
  }
  absl::Status s = core::WriteSafetensors(flags.Get("--out"), out,
                                          {{"config", model::ModelConfigToJson(config)}});
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--out: ", s.message()));
  return absl::OkStatus();
}

absl::Status RunExport(const std::vector<std::string>& args) {
  FlagSet flags("export");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--checkpoint", "checkpoint file or folder (any training layout)", true);
  flags.Define("--out", "where to write the weights (safetensors)", true);
  flags.DefineEnum("--dtype", "the checkpoint's dtype", {"f32", "f64"}, "f32");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  const std::vector<InputPath> inputs = {
      {"--config", flags.Get("--config")},
      {"--checkpoint", flags.Get("--checkpoint"), InputPath::kFileOrFolder}};
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  SATDAR_RETURN_IF_ERROR(CheckOutput("--out", flags.Get("--out"), false, inputs));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  const bool f64 = flags.Get("--dtype") == "f64";
  model::MemoryShape shape;
  shape.use = model::MemoryUse::kWeights;
  shape.dtype_bytes = 2 * (f64 ? 8 : 4);  // the weights, and one tensor assembled from shards
  SATDAR_RETURN_IF_ERROR(model::CheckFitsInMemory(config, shape, 1, "satdar export", kCliBatchNames));
  return f64 ? ExportTyped<double>(config, flags.Get("--checkpoint"), flags.Get("--out"))
             : ExportTyped<float>(config, flags.Get("--checkpoint"), flags.Get("--out"));
}

absl::Status RunInfo(const std::vector<std::string>& args) {
  FlagSet flags("info");
  flags.Define("--config", "model config JSON", true);
  flags.DefineBool("--params", "list every parameter with its shape");
  flags.Define("--batch-size", "with --seq-len: also estimate the memory of training this batch");
  flags.Define("--seq-len", "tokens per sequence for the memory estimate");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_RETURN_IF_ERROR(CheckInputs({{"--config", flags.Get("--config")}}));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  if (flags.Has("--batch-size") != flags.Has("--seq-len")) {
    return absl::InvalidArgumentError("satdar info: give --batch-size and --seq-len together");
  }
  SATDAR_ASSIGN_OR_RETURN(const model::ParamTable table,
                          model::BuildParamTable(config, model::Sharding{}));
  int64_t embedding = config.vocab_size * static_cast<int64_t>(config.hidden_size);
  std::printf("%s: residual %s, value_residual %s, %s; %lld parameters (%.1fM; %.1fM without "
              "the embedding)\n",
              flags.Get("--config").c_str(), model::Name(config.residual),
              model::Name(config.value_residual), config.moe ? "MoE FFN" : "dense FFN",
              static_cast<long long>(table.size()), table.size() / 1e6,
              (table.size() - embedding) / 1e6);
  if (flags.Has("--batch-size")) {
    model::MemoryShape shape;
    SATDAR_ASSIGN_OR_RETURN(shape.batch, flags.GetInt("--batch-size", 1, kMaxBatch));
    SATDAR_ASSIGN_OR_RETURN(shape.seq_len, flags.GetInt("--seq-len", 1, kMaxSeqLen));
    SATDAR_ASSIGN_OR_RETURN(model::MemoryEstimate e, model::EstimateMemory(config, shape));
    std::printf("training in f32 on the CPU (one rank, batch %lld x %lld): about %s (%s)\n",
                static_cast<long long>(shape.batch), static_cast<long long>(shape.seq_len),
                model::FormatBytes(e.total()).c_str(), e.Breakdown().c_str());
  }
  if (flags.GetBool("--params")) {
    for (const auto& spec : table.specs()) {
      std::printf("  %-60s %s\n", spec.name.c_str(), core::ShapeString(spec.shape).c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace satdar::cli
