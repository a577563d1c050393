// model/variants/muddformer.h: MUDDFormer multiway dynamic dense connections (docs/MODELS.md).
#ifndef SATDAR_MODEL_VARIANTS_MUDDFORMER_H_
#define SATDAR_MODEL_VARIANTS_MUDDFORMER_H_

#include <memory>

#include "model/topology.h"
#include "model/sharding.h"

namespace satdar::model {

template <typename T>
std::unique_ptr<Topology<T>> MakeMuddFormer(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_MUDDFORMER_H_
