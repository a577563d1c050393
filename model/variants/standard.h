// model/variants/standard.h: the baseline pre-norm residual, h' = h + f_{2n-1}(h),
// h_n = h' + f_{2n}(h') (MODELS.md section 2).
#ifndef SATDAR_MODEL_VARIANTS_STANDARD_H_
#define SATDAR_MODEL_VARIANTS_STANDARD_H_

#include <memory>

#include "model/sharding.h"
#include "model/topology.h"

namespace satdar::model {

template <class B>
std::unique_ptr<TopologyT<B>> MakeStandard(const ModelConfig& config, const Sharding& shard,
                                           const typename B::Exec& x);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_STANDARD_H_
