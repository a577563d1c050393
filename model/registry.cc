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

// One design part: its config value, how to build it, and its parameters (param_layout.h;
// null when it has none).
template <typename K, typename P>
struct Row {
  K key;
  Maker<P> make;
  AddParamsFn params;
};

template <typename T>
struct Registry {
  std::vector<Row<std::string, std::unique_ptr<Topology<T>>>> topologies = {
      {"standard", MakeStandard<T>, nullptr},
      {"attnres", MakeAttnRes<T>, AddAttnResParams},
      {"dar", MakeDar<T>, AddDarParams},
      {"hc", MakeHc<T>, AddHcParams},
      {"mhc", MakeMhc<T>, AddMhcParams},
      {"denseformer", MakeDenseFormer<T>, AddDenseFormerParams},
      {"muddformer", MakeMuddFormer<T>, AddMuddFormerParams},
  };
  std::vector<Row<std::string, std::unique_ptr<ValueResidual<T>>>> value_residuals = {
      {"none", [](const ModelConfig&, const Sharding&, core::ThreadPool*) { return nullptr; },
       nullptr},
      {"resformer", MakeResformer<T>, AddResformerParams},
      {"satformer", MakeSatformer<T>, AddSatformerParams},
  };
  std::vector<Row<bool, std::unique_ptr<Ffn<T>>>> ffns = {
      {false, MakeDenseFfn<T>, AddDenseFfnParams},
      {true, MakeMoe<T>, AddMoeParams},
  };
};

template <typename K, typename P>
const Row<K, P>* Find(const std::vector<Row<K, P>>& list, const K& key) {
  for (const auto& row : list) {
    if (row.key == key) return &row;
  }
  return nullptr;
}

template <typename P>
std::string Names(const std::vector<Row<std::string, P>>& list) {
  std::vector<std::string> names;
  for (const auto& row : list) names.push_back("\"" + row.key + "\"");
  return absl::StrJoin(names, ", ");
}

// The rows `config` picks, or which config field names a design this build does not have.
template <typename T>
struct Design {
  const Row<std::string, std::unique_ptr<Topology<T>>>* topology;
  const Row<std::string, std::unique_ptr<ValueResidual<T>>>* value_residual;
  const Row<bool, std::unique_ptr<Ffn<T>>>* ffn;
  DesignParams params() const {
    return {topology->params, value_residual->params, ffn->params};
  }
};

template <typename T>
absl::StatusOr<Design<T>> FindDesign(const Registry<T>& r, const ModelConfig& config,
                                     const Sharding& shard) {
  SATDAR_RETURN_IF_ERROR(
      ValidateSharding(config, shard.tp_size, shard.pp_size, shard.ep_size, LayoutNames(),
                       shard.vocab_multiple));
  Design<T> d;
  d.topology = Find(r.topologies, std::string(Name(config.residual)));
  if (d.topology == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field \"residual\": \"", Name(config.residual),
        "\" is not available in this build (available: ", Names(r.topologies), ")"));
  }
  d.value_residual = Find(r.value_residuals, std::string(Name(config.value_residual)));
  if (d.value_residual == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field \"value_residual\": \"", Name(config.value_residual),
        "\" is not available in this build (available: ", Names(r.value_residuals), ")"));
  }
  d.ffn = Find(r.ffns, config.moe.has_value());
  if (d.ffn == nullptr) {
    return absl::InvalidArgumentError(
        "config field \"moe\": the sparse MoE FFN is not available in this build");
  }
  return d;
}

}  // namespace

bool TopologySupportsStages(const ModelConfig& config) {
  Registry<float> r;
  const auto* topology = Find(r.topologies, std::string(Name(config.residual)));
  SATDAR_CHECK(topology != nullptr) << Name(config.residual);
  core::ThreadPool pool(1);
  return topology->make(config, Sharding{}, &pool)->SupportsStages();
}

int TopologyBoundaryTensors(const ModelConfig& config, int after_sublayer) {
  Registry<float> r;
  const auto* topology = Find(r.topologies, std::string(Name(config.residual)));
  SATDAR_CHECK(topology != nullptr) << Name(config.residual);
  core::ThreadPool pool(1);
  return topology->make(config, Sharding{}, &pool)->BoundaryTensors(after_sublayer);
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
  Registry<T> r;
  SATDAR_ASSIGN_OR_RETURN(Design<T> d, FindDesign(r, config, shard));
  auto branches = std::make_unique<Branches<T>>(config, shard, pool,
                                                d.value_residual->make(config, shard, pool),
                                                d.ffn->make(config, shard, pool));
  return std::unique_ptr<Model<T>>(std::make_unique<DecoderModel<T>>(
      config, shard, pool, DecoderParams(config, shard, d.params()), std::move(branches),
      d.topology->make(config, shard, pool)));
}

absl::StatusOr<ParamTable> BuildParamTable(const ModelConfig& config, const Sharding& shard,
                                           int64_t align) {
  if (align < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parameter alignment ", align, " is not positive"));
  }
  Registry<float> r;
  SATDAR_ASSIGN_OR_RETURN(Design<float> d, FindDesign(r, config, shard));
  return DecoderParams(config, shard, d.params(), align);
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
