// model/variants/denseformer.h: DenseFormer depth-weighted averages (docs/MODELS.md).
#ifndef SATDAR_MODEL_VARIANTS_DENSEFORMER_H_
#define SATDAR_MODEL_VARIANTS_DENSEFORMER_H_

#include <memory>

#include "model/param_layout.h"
#include "model/sharding.h"
#include "model/topology.h"

namespace satdar::model {

template <class B>
std::unique_ptr<TopologyT<B>> MakeDenseFormer(const ModelConfig& config, const Sharding& shard,
                                              const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddDenseFormerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                          int layer, ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_DENSEFORMER_H_
