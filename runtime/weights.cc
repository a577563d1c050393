#include "runtime/weights.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

}  // namespace satdar::runtime
