// model/param_layout.h: a rank's parameter table from the config and its sharding alone.
//
// The decoder's table (MODELS.md section 5 names) is, in this order:
//   the token embedding (first stage, or last stage with tied embeddings)
//   the value residual's ParamPlace::kGlobal parameters
//   per block i of this stage: input_layernorm, q/k/v/o (+ q/k norms), the value residual's
//     kLayer parameters, post_attention_layernorm, the FFN's kLayer parameters, then the
//     topology's kLayer parameters
//   last stage: model.norm, the topology's kFinal parameters, lm_head (untied)
// Each design contributes one AddParamsFn, a row of the registry (registry.cc) beside its
// Make function; its class binds the offsets by the same names (Topology::Bind, ...).
#ifndef SATDAR_MODEL_PARAM_LAYOUT_H_
#define SATDAR_MODEL_PARAM_LAYOUT_H_

#include "model/config.h"
#include "model/param_table.h"
#include "model/sharding.h"

namespace satdar::model {

enum class ParamPlace { kGlobal, kLayer, kFinal };

// Adds this rank's parameters of one design at `place` (`layer`: the block for kLayer,
// else -1). A design with nothing at a place adds nothing.
using AddParamsFn = void (*)(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                             int layer, ParamTable* table);

struct DesignParams {
  AddParamsFn topology = nullptr;
  AddParamsFn value_residual = nullptr;  // null: no value residual
  AddParamsFn ffn = nullptr;
};

// The whole table of this rank in the order above (model/decoder.cc). The config and the
// sharding must already be valid together (ValidateSharding); BuildParamTable (model.h)
// checks that and picks the design's rows. align: ParamTable's (1 on the CPU).
ParamTable DecoderParams(const ModelConfig& config, const Sharding& shard,
                         const DesignParams& design, int64_t align = 1);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_PARAM_LAYOUT_H_
