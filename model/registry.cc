// model/registry.cc: the one list of model designs. A design is selected by the config's
// (residual, value_residual, moe) fields; adding one is one line here plus its file group.
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/model.h"
#include "model/transformer.h"

namespace satdar::model {

namespace {

template <typename T>
struct Entry {
  const char* residual;
  const char* value_residual;
  bool moe;
  std::function<std::unique_ptr<Model<T>>(const ModelConfig&, core::ThreadPool*)> create;
};

template <typename T>
std::vector<Entry<T>> Registry() {
  return {
      {"standard", "none", false,
       [](const ModelConfig& c, core::ThreadPool* p) {
         return std::make_unique<Transformer<T>>(c, p);
       }},
  };
}

}  // namespace

template <typename T>
absl::StatusOr<std::unique_ptr<Model<T>>> CreateModel(const ModelConfig& config,
                                                      core::ThreadPool* pool) {
  for (const Entry<T>& e : Registry<T>()) {
    if (config.residual == e.residual && config.value_residual == e.value_residual &&
        config.moe.has_value() == e.moe) {
      return e.create(config, pool);
    }
  }
  std::string field = config.moe.has_value() ? "moe"
                      : config.residual != "standard" ? "residual"
                                                      : "value_residual";
  return absl::InvalidArgumentError(absl::StrCat(
      "config field \"", field, "\": residual=\"", config.residual, "\" value_residual=\"",
      config.value_residual, "\"", config.moe.has_value() ? " with moe" : "",
      " is not available in this build (available: residual=\"standard\", "
      "value_residual=\"none\", moe=null)"));
}

template absl::StatusOr<std::unique_ptr<Model<float>>> CreateModel<float>(const ModelConfig&,
                                                                          core::ThreadPool*);
template absl::StatusOr<std::unique_ptr<Model<double>>> CreateModel<double>(const ModelConfig&,
                                                                            core::ThreadPool*);

}  // namespace satdar::model
