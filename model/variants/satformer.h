// model/variants/satformer.h: SATFormer's selective access to layer 1's values.
//   alpha_n = ReLU(x W_alpha_n^T) (B*T, NKV);  V'_n[.., j, :] = V_n[.., j, :] + alpha_n[.., j] V_1[.., j, :]
// W_alpha_n: model.layers.{i}.self_attn.value_gate.weight [NKV, C] for i >= 1.
#ifndef SATDAR_MODEL_VARIANTS_SATFORMER_H_
#define SATDAR_MODEL_VARIANTS_SATFORMER_H_

#include <memory>
#include <vector>

#include "model/backend.h"
#include "model/param_layout.h"
#include "model/sharding.h"
#include "model/value_residual.h"

namespace satdar::model {

template <class B>
std::unique_ptr<ValueResidualT<B>> MakeSatformer(const ModelConfig& config, const Sharding& shard,
                                                 const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddSatformerParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                        int layer, ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_SATFORMER_H_
