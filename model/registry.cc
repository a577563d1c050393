// model/registry.cc: the one list of model designs. A config picks a residual topology
// ("residual"), a value residual ("value_residual") and an FFN ("moe" null or not); each is
// one line below, and no other switch in the code names a design.
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "model/decoder.h"
#include "model/dense_ffn.h"
#include "model/model.h"
#include "model/variants/attnres.h"
#include "model/variants/dar.h"
#include "model/variants/denseformer.h"
#include "model/variants/hyper_connections.h"
#include "model/variants/mhc.h"
#include "model/variants/moe.h"
#include "model/variants/muddformer.h"
#include "model/variants/resformer.h"
#include "model/variants/satformer.h"
#include "model/variants/standard.h"

namespace satdar::model {

namespace {

template <typename P>
using Maker = std::function<P(const ModelConfig&, const Sharding&, core::ThreadPool*)>;

template <typename T>
struct Registry {
  std::vector<std::pair<std::string, Maker<std::unique_ptr<Topology<T>>>>> topologies = {
      {"standard", MakeStandard<T>},
      {"attnres", MakeAttnRes<T>},
      {"dar", MakeDar<T>},
      {"hc", MakeHc<T>},
      {"mhc", MakeMhc<T>},
      {"denseformer", MakeDenseFormer<T>},
      {"muddformer", MakeMuddFormer<T>},
  };
  std::vector<std::pair<std::string, Maker<std::unique_ptr<ValueResidual<T>>>>> value_residuals = {
      {"none", [](const ModelConfig&, const Sharding&, core::ThreadPool*) { return nullptr; }},
      {"resformer", MakeResformer<T>},
      {"satformer", MakeSatformer<T>},
  };
  std::vector<std::pair<bool, Maker<std::unique_ptr<Ffn<T>>>>> ffns = {
      {false, MakeDenseFfn<T>},
      {true, MakeMoe<T>},
  };
};

template <typename V>
const V* Find(const std::vector<std::pair<std::string, V>>& list, const std::string& key) {
  for (const auto& [name, value] : list) {
    if (name == key) return &value;
  }
  return nullptr;
}

template <typename V>
std::string Names(const std::vector<std::pair<std::string, V>>& list) {
  std::vector<std::string> names;
  for (const auto& entry : list) names.push_back("\"" + entry.first + "\"");
  return absl::StrJoin(names, ", ");
}

}  // namespace

bool TopologySupportsStages(const ModelConfig& config) {
  Registry<float> r;
  const auto* topology = Find(r.topologies, Name(config.residual));
  SATDAR_CHECK(topology != nullptr) << Name(config.residual);
  core::ThreadPool pool(1);
  return (*topology)(config, Sharding{}, &pool)->SupportsStages();
}

int TopologyBoundaryTensors(const ModelConfig& config, int after_sublayer) {
  Registry<float> r;
  const auto* topology = Find(r.topologies, Name(config.residual));
  SATDAR_CHECK(topology != nullptr) << Name(config.residual);
  core::ThreadPool pool(1);
  return (*topology)(config, Sharding{}, &pool)->BoundaryTensors(after_sublayer);
}

template <typename T>
absl::StatusOr<std::unique_ptr<Model<T>>> CreateModel(const ModelConfig& config,
                                                      core::ThreadPool* pool) {
  return CreateModel<T>(config, Sharding{}, pool);
}

template <typename T>
absl::StatusOr<std::unique_ptr<Model<T>>> CreateModel(const ModelConfig& config,
                                                      const Sharding& shard,
                                                      core::ThreadPool* pool) {
  SATDAR_RETURN_IF_ERROR(
      ValidateSharding(config, shard.tp_size, shard.pp_size, shard.ep_size, LayoutNames(),
                       shard.vocab_multiple));
  Registry<T> r;
  const auto* topology = Find(r.topologies, Name(config.residual));
  if (topology == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field \"residual\": \"", Name(config.residual),
        "\" is not available in this build (available: ", Names(r.topologies), ")"));
  }
  const auto* value_residual = Find(r.value_residuals, Name(config.value_residual));
  if (value_residual == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field \"value_residual\": \"", Name(config.value_residual),
        "\" is not available in this build (available: ", Names(r.value_residuals), ")"));
  }
  const Maker<std::unique_ptr<Ffn<T>>>* ffn = nullptr;
  for (const auto& [is_moe, make] : r.ffns) {
    if (is_moe == config.moe.has_value()) ffn = &make;
  }
  if (ffn == nullptr) {
    return absl::InvalidArgumentError(
        "config field \"moe\": the sparse MoE FFN is not available in this build");
  }
  auto branches = std::make_unique<Branches<T>>(
      config, shard, pool, (*value_residual)(config, shard, pool), (*ffn)(config, shard, pool));
  return std::unique_ptr<Model<T>>(std::make_unique<DecoderModel<T>>(
      config, shard, pool, std::move(branches), (*topology)(config, shard, pool)));
}

absl::StatusOr<ParamTable> BuildParamTable(const ModelConfig& config, const Sharding& shard) {
  core::ThreadPool pool(1);
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<Model<float>> model,
                          CreateModel<float>(config, shard, &pool));
  return model->params();
}

template absl::StatusOr<std::unique_ptr<Model<float>>> CreateModel<float>(const ModelConfig&,
                                                                          core::ThreadPool*);
template absl::StatusOr<std::unique_ptr<Model<double>>> CreateModel<double>(const ModelConfig&,
                                                                            core::ThreadPool*);
template absl::StatusOr<std::unique_ptr<Model<float>>> CreateModel<float>(const ModelConfig&,
                                                                          const Sharding&,
                                                                          core::ThreadPool*);
template absl::StatusOr<std::unique_ptr<Model<double>>> CreateModel<double>(const ModelConfig&,
                                                                            const Sharding&,
                                                                            core::ThreadPool*);

}  // namespace satdar::model
