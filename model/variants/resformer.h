// model/variants/resformer.h: value residual learning (ResFormer), V'_n = l1_n V_1 + l2_n V_n
// for n >= 2. "fixed": l1 = l2 = 0.5. "learnable_plus": l1_n = s * softmax(q)[n-2] with
// model.value_residual.lambda_scale s [1] (init L) and .lambda_logits q [L-1] (init 0), and
// l2_n = model.layers.{i}.self_attn.lambda2 [1] (init 0.5, one per layer; layer 0's is unused).
#ifndef SATDAR_MODEL_VARIANTS_RESFORMER_H_
#define SATDAR_MODEL_VARIANTS_RESFORMER_H_

#include <memory>

#include "model/backend.h"
#include "model/param_layout.h"
#include "model/sharding.h"
#include "model/value_residual.h"

namespace satdar::model {

template <class B>
std::unique_ptr<ValueResidualT<B>> MakeResformer(const ModelConfig& config, const Sharding& shard,
                                                 const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddResformerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                        int layer, ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_RESFORMER_H_
