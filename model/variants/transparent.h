// model/variants/transparent.h: Transparent Attention (Bapna et al. 2018; MODELS.md section 4):
// AttnRes' sources and partial sums (block_size 1 full, else even), each sublayer reading
// them mixed with learned static weights softmax(z_l) that do not depend on the input.
#ifndef SATDAR_MODEL_VARIANTS_TRANSPARENT_H_
#define SATDAR_MODEL_VARIANTS_TRANSPARENT_H_

#include <memory>

#include "model/param_layout.h"
#include "model/sharding.h"
#include "model/topology.h"

namespace satdar::model {

template <class B>
std::unique_ptr<TopologyT<B>> MakeTransparent(const ModelConfig& config, const Sharding& shard,
                                              const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddTransparentParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                          int layer, ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_TRANSPARENT_H_
