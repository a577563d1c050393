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
#include "model/layout_check.h"
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
#include "model/variants/transparent.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

template <class B, typename P>
using Maker = std::function<P(const ModelConfig&, const Sharding&, const typename B::Exec&)>;

// One design part: its config value, how to build it, and its parameters (param_layout.h;
// null when it has none).
template <class B, typename K, typename P>
struct Row {
  K key;
  Maker<B, P> make;
  AddParamsFn params;
};

template <class B>
struct Registry {
  using Exec = typename B::Exec;
  std::vector<Row<B, std::string, std::unique_ptr<TopologyT<B>>>> topologies = {
      {"standard", MakeStandard<B>, nullptr},
      {"attnres", MakeAttnRes<B>, AddAttnResParams},
      {"transparent", MakeTransparent<B>, AddTransparentParams},
      {"dar", MakeDar<B>, AddDarParams},
      {"hc", MakeHc<B>, AddHcParams},
      {"mhc", MakeMhc<B>, AddMhcParams},
      {"denseformer", MakeDenseFormer<B>, AddDenseFormerParams},
      {"muddformer", MakeMuddFormer<B>, AddMuddFormerParams},
  };
  std::vector<Row<B, std::string, std::unique_ptr<ValueResidualT<B>>>> value_residuals = {
      {"none",
       [](const ModelConfig&, const Sharding&, const Exec&) {
         return std::unique_ptr<ValueResidualT<B>>();
       },
       nullptr},
      {"resformer", MakeResformer<B>, AddResformerParams},
      {"satformer", MakeSatformer<B>, AddSatformerParams},
  };
  std::vector<Row<B, bool, std::unique_ptr<FfnT<B>>>> ffns = {
      {false, MakeDenseFfn<B>, AddDenseFfnParams},
      {true, MakeMoe<B>, AddMoeParams},
  };
};

template <class B, typename K, typename P>
const Row<B, K, P>* Find(const std::vector<Row<B, K, P>>& list, const K& key) {
  for (const auto& row : list) {
    if (row.key == key) return &row;
  }
  return nullptr;
}

template <class B, typename P>
std::string Names(const std::vector<Row<B, std::string, P>>& list) {
  std::vector<std::string> names;
  for (const auto& row : list) names.push_back("\"" + row.key + "\"");
  return absl::StrJoin(names, ", ");
}

// The rows `config` picks, or which config field names a design this build does not have.
template <class B>
struct Design {
  const Row<B, std::string, std::unique_ptr<TopologyT<B>>>* topology;
  const Row<B, std::string, std::unique_ptr<ValueResidualT<B>>>* value_residual;
  const Row<B, bool, std::unique_ptr<FfnT<B>>>* ffn;
  DesignParams params() const {
    return {topology->params, value_residual->params, ffn->params};
  }
};

template <class B>
absl::StatusOr<Design<B>> FindDesign(const Registry<B>& r, const ModelConfig& config,
                                     const Sharding& shard) {
  SATDAR_RETURN_IF_ERROR(
      ValidateSharding(config, shard.tp_size, shard.pp_size, shard.ep_size, LayoutNames(),
                       shard.vocab_multiple));
  Design<B> d;
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
  Registry<Cpu<float>> r;
  const auto* topology = Find(r.topologies, std::string(Name(config.residual)));
  SATDAR_CHECK(topology != nullptr) << Name(config.residual);
  core::ThreadPool pool(1);
  return topology->make(config, Sharding{}, core::CpuExec{&pool})->SupportsStages();
}

int TopologyBoundaryTensors(const ModelConfig& config, int after_sublayer) {
  Registry<Cpu<float>> r;
  const auto* topology = Find(r.topologies, std::string(Name(config.residual)));
  SATDAR_CHECK(topology != nullptr) << Name(config.residual);
  core::ThreadPool pool(1);
  return topology->make(config, Sharding{}, core::CpuExec{&pool})->BoundaryTensors(after_sublayer);
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
  using B = Cpu<T>;
  const core::CpuExec x{pool};
  Registry<B> r;
  SATDAR_ASSIGN_OR_RETURN(Design<B> d, FindDesign(r, config, shard));
  auto branches = std::make_unique<BranchesT<B>>(config, shard, x,
                                                 d.value_residual->make(config, shard, x),
                                                 d.ffn->make(config, shard, x));
  return std::unique_ptr<Model<T>>(std::make_unique<DecoderModelT<B>>(
      config, shard, x, DecoderParams(config, shard, d.params()), std::move(branches),
      d.topology->make(config, shard, x)));
}

absl::StatusOr<ParamTable> BuildParamTable(const ModelConfig& config, const Sharding& shard,
                                           int64_t align) {
  if (align < 1) {
    return absl::InvalidArgumentError(absl::StrCat("parameter alignment ", align, " is not positive"));
  }
  Registry<Cpu<float>> r;
  SATDAR_ASSIGN_OR_RETURN(Design<Cpu<float>> d, FindDesign(r, config, shard));
  return DecoderParams(config, shard, d.params(), align);
}

template <class B>
absl::StatusOr<std::unique_ptr<DecoderModelT<B>>> CreateDeviceModel(const ModelConfig& config,
                                                                   const Sharding& shard,
                                                                   const typename B::Exec& x) {
  // The same rows as the CPU's: every design is instantiated on the device backends.
  Registry<B> r;
  SATDAR_ASSIGN_OR_RETURN(Design<B> d, FindDesign(r, config, shard));
  SATDAR_RETURN_IF_ERROR(CheckDeviceSupport(config, shard.tp_size));
  if (x.gemm == nullptr || x.alloc == nullptr) {
    return absl::FailedPreconditionError(
        "the device model's execution context needs a GEMM handle and an allocator");
  }
  auto branches = std::make_unique<BranchesT<B>>(config, shard, x,
                                                 d.value_residual->make(config, shard, x),
                                                 d.ffn->make(config, shard, x));
  // The GPU's table: every tensor aligned to kDeviceParamAlign elements.
  return std::make_unique<DecoderModelT<B>>(config, shard, x,
                                            DecoderParams(config, shard, d.params(),
                                                          kDeviceParamAlign),
                                            std::move(branches),
                                            d.topology->make(config, shard, x));
}

#if defined(SATDAR_WITH_CUDA)
template absl::StatusOr<std::unique_ptr<DecoderModelT<Cuda<float>>>>
CreateDeviceModel<Cuda<float>>(const ModelConfig&, const Sharding&, const core::CudaExec&);
template absl::StatusOr<std::unique_ptr<DecoderModelT<Cuda<__nv_bfloat16>>>>
CreateDeviceModel<Cuda<__nv_bfloat16>>(const ModelConfig&, const Sharding&,
                                       const core::CudaExec&);
#endif

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
