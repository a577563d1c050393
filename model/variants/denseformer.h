// model/variants/denseformer.h: DenseFormer depth-weighted averages (docs/MODELS.md).
#ifndef SATDAR_MODEL_VARIANTS_DENSEFORMER_H_
#define SATDAR_MODEL_VARIANTS_DENSEFORMER_H_

#include <memory>

#include "model/topology.h"
#include "model/sharding.h"

namespace satdar::model {

template <typename T>
std::unique_ptr<Topology<T>> MakeDenseFormer(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_DENSEFORMER_H_
