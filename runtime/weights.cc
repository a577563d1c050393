#include "runtime/weights.h"

#include <cmath>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/safetensors.h"
#include "model/config.h"
#include "runtime/checkpoint.h"

namespace satdar::runtime {

template <typename T>
absl::Status LoadWeights(const std::string& flag, const std::string& path,
                         const model::ParamTable& table, const std::string& config_json,
                         std::vector<T>* params, std::vector<bool>* present) {
  auto file = core::SafetensorsFile::Open(path);
  if (!file.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", file.status().message()));
  }
  const auto& meta = file->metadata();
  auto format = meta.find("format");  // PyTorch's save_file writes {"format": "pt"}
  const bool checkpoint =
      format != meta.end() && absl::StartsWith(format->second, "satdar-checkpoint");
  if (checkpoint) {
    absl::Status s = VerifyCheckpointFile(*file, config_json);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
  } else if (meta.count("config") && meta.at("config") != config_json) {
    // Written by satdar init or export: the config it was made for is stored beside it.
    auto stored = model::ParseModelConfig(meta.at("config"), path);
    if (!stored.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": ", path, ": its stored config is unreadable: ", stored.status().message()));
    }
    // The positions a model may be run at do not change its weights.
    auto mine = model::ParseModelConfig(config_json, "model config");
    if (mine.ok()) stored->max_position_embeddings = mine->max_position_embeddings;
    const std::string canonical = model::ModelConfigToJson(*stored);
    if (canonical != config_json) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path,
                                                     " was written for a different model config: ",
                                                     ConfigDifference(canonical, config_json)));
    }
  }
  for (const auto& e : file->entries()) {
    if (checkpoint && absl::StartsWith(e.name, "optimizer.")) continue;
    if (table.Find(e.name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": ", path, ": tensor '", e.name, "' is not a parameter of this config"));
    }
  }
  params->assign(table.size(), T(0));
  table.Initialize(params->data(), 0);
  present->assign(table.specs().size(), true);
  for (size_t k = 0; k < table.specs().size(); ++k) {
    const model::ParamSpec& spec = table.specs()[k];
    if (spec.unused && file->Find(spec.name) == nullptr) {
      (*present)[k] = false;
      continue;
    }
    absl::Status s = file->ReadFloats(spec.name, spec.shape, core::DTypeOf<T>::value,
                                      params->data() + spec.offset);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
  }
  return CheckFiniteWeights(absl::StrCat(flag, ": ", path), table, params->data());
}

template <typename T>
absl::Status CheckFiniteWeights(const std::string& what, const model::ParamTable& table,
                                const T* params) {
  for (const model::ParamSpec& spec : table.specs()) {
    const T* p = params + spec.offset;
    for (int64_t i = 0; i < spec.numel; ++i) {
      if (std::isfinite(p[i])) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": tensor '", spec.name, "' holds ", std::isnan(p[i]) ? "NaN" : "Inf",
          " (element ", i, "); weights must be finite numbers"));
    }
  }
  return absl::OkStatus();
}

// Checkpoints are stored in their run's dtype; LoadCheckpoint reads one dtype only.
template <typename T, typename U>
absl::Status LoadCheckpointAs(const std::string& path, const std::string& config_json,
                              const model::ParamTable& table, std::vector<T>* params) {
  std::vector<U> other(table.size(), U(0));
  SATDAR_RETURN_IF_ERROR(
      LoadCheckpoint<U>(path, config_json, table, {&other, nullptr, nullptr}).status());
  params->assign(other.begin(), other.end());
  return absl::OkStatus();
}

template <typename T>
absl::Status LoadModelWeights(const std::string& weights, const std::string& checkpoint,
                              const model::ParamTable& table, const std::string& config_json,
                              std::vector<T>* params) {
  if (weights.empty() == checkpoint.empty()) {
    return absl::InvalidArgumentError("weights, checkpoint: give exactly one of the two");
  }
  if (!weights.empty()) {
    std::vector<bool> present;
    return LoadWeights<T>("weights", weights, table, config_json, params, &present);
  }
  params->assign(table.size(), T(0));
  absl::Status s =
      LoadCheckpoint<T>(checkpoint, config_json, table, {params, nullptr, nullptr}).status();
  if (!s.ok()) {
    // Written in the other dtype? (Any other fault fails again, and the first error is kept.)
    using U = std::conditional_t<std::is_same_v<T, float>, double, float>;
    if (!LoadCheckpointAs<T, U>(checkpoint, config_json, table, params).ok()) {
      return absl::Status(s.code(), absl::StrCat("checkpoint: ", s.message()));
    }
  }
  return CheckFiniteWeights("checkpoint: " + checkpoint, table, params->data());
}

template absl::Status LoadWeights<float>(const std::string&, const std::string&,
                                         const model::ParamTable&, const std::string&,
                                         std::vector<float>*, std::vector<bool>*);
template absl::Status LoadWeights<double>(const std::string&, const std::string&,
                                          const model::ParamTable&, const std::string&,
                                          std::vector<double>*, std::vector<bool>*);

template absl::Status CheckFiniteWeights<float>(const std::string&, const model::ParamTable&,
                                                const float*);
template absl::Status CheckFiniteWeights<double>(const std::string&, const model::ParamTable&,
                                                 const double*);

template absl::Status LoadModelWeights<float>(const std::string&, const std::string&,
                                              const model::ParamTable&, const std::string&,
                                              std::vector<float>*);
template absl::Status LoadModelWeights<double>(const std::string&, const std::string&,
                                               const model::ParamTable&, const std::string&,
                                               std::vector<double>*);

}  // namespace satdar::runtime
