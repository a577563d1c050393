// model/variants/dar.h: Dual Attention Residuals (MODELS.md section 4). Two residual streams
// keep their own depth histories; each retrieves with keys from the stream its variant names
// (cross: the other stream) and values from another (cross: its own), the two retrievals are
// mixed for the unchanged branch, and the branch output is written back through a 2x2
// doubly-stochastic transport and per-stream write gates. Full DAR is block_size 2.
#ifndef SATDAR_MODEL_VARIANTS_DAR_H_
#define SATDAR_MODEL_VARIANTS_DAR_H_

#include <memory>

#include "model/param_layout.h"
#include "model/sharding.h"
#include "model/topology.h"

namespace satdar::model {

template <class B>
std::unique_ptr<TopologyT<B>> MakeDar(const ModelConfig& config, const Sharding& shard,
                                      const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddDarParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                  ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_DAR_H_
