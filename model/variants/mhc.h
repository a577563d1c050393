// model/variants/mhc.h: manifold-constrained Hyper-Connections (mHC; docs/MODELS.md).
#ifndef SATDAR_MODEL_VARIANTS_MHC_H_
#define SATDAR_MODEL_VARIANTS_MHC_H_

#include <memory>

#include "model/param_layout.h"
#include "model/sharding.h"
#include "model/topology.h"

namespace satdar::model {

template <class B>
std::unique_ptr<TopologyT<B>> MakeMhc(const ModelConfig& config, const Sharding& shard,
                                      const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddMhcParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                  ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_MHC_H_
