// model/variants/attnres.h: Attention Residuals, full (block_size 1) and block (MODELS.md
// section 4): every sublayer reads a softmax-weighted mix of the completed block sums (the
// embedding first) and the current partial sum, with a learned pseudo-query per sublayer.
#ifndef SATDAR_MODEL_VARIANTS_ATTNRES_H_
#define SATDAR_MODEL_VARIANTS_ATTNRES_H_

#include <memory>

#include "model/param_layout.h"
#include "model/sharding.h"
#include "model/topology.h"

namespace satdar::model {

template <class B>
std::unique_ptr<TopologyT<B>> MakeAttnRes(const ModelConfig& config, const Sharding& shard,
                                          const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddAttnResParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                      ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_ATTNRES_H_
