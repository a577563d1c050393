// model/variants/attnres.h: Attention Residuals, full (block_size 1) and block (MODELS.md
// section 4): every sublayer reads a softmax-weighted mix of the completed block sums (the
// embedding first) and the current partial sum, with a learned pseudo-query per sublayer.
#ifndef SATDAR_MODEL_VARIANTS_ATTNRES_H_
#define SATDAR_MODEL_VARIANTS_ATTNRES_H_

#include <memory>

#include "model/topology.h"
#include "model/sharding.h"

namespace satdar::model {

template <typename T>
std::unique_ptr<Topology<T>> MakeAttnRes(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_ATTNRES_H_
