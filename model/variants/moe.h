// model/variants/moe.h: the sparse MoE FFN (MODELS.md section 6): token-choice top-k routing
// over SwiGLU experts, dropless, optional shared experts, sequence-wise aux loss and z-loss.
#ifndef SATDAR_MODEL_VARIANTS_MOE_H_
#define SATDAR_MODEL_VARIANTS_MOE_H_

#include <memory>

#include "model/backend.h"
#include "model/ffn.h"
#include "model/param_layout.h"
#include "model/sharding.h"

namespace satdar::model {

template <class B>
std::unique_ptr<FfnT<B>> MakeMoe(const ModelConfig& config, const Sharding& shard,
                                 const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddMoeParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                  ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_MOE_H_
