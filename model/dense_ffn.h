// model/dense_ffn.h: the dense SwiGLU MLP as an Ffn (MODELS.md section 2).
#ifndef SATDAR_MODEL_DENSE_FFN_H_
#define SATDAR_MODEL_DENSE_FFN_H_

#include <memory>

#include "model/backend.h"
#include "model/ffn.h"
#include "model/param_layout.h"
#include "model/sharding.h"

namespace satdar::model {

template <class B>
std::unique_ptr<FfnT<B>> MakeDenseFfn(const ModelConfig& config, const Sharding& shard,
                                      const typename B::Exec& x);
// This design's parameters at `place` (param_layout.h): the registry's row.
void AddDenseFfnParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                       int layer, ParamTable* table);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_DENSE_FFN_H_
