// model/variants/muddformer.h: MUDDFormer multiway dynamic dense connections (docs/MODELS.md).
#ifndef SATDAR_MODEL_VARIANTS_MUDDFORMER_H_
#define SATDAR_MODEL_VARIANTS_MUDDFORMER_H_

#include <memory>

#include "model/param_layout.h"
#include "model/sharding.h"
#include "model/topology.h"

namespace satdar::model {

template <class B>
std::unique_ptr<TopologyT<B>> MakeMuddFormer(const ModelConfig& config, const Sharding& shard,
                                             const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddMuddFormerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                         int layer, ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_MUDDFORMER_H_
