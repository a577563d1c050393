// model/variants/hyper_connections.h: Hyper-Connections, dynamic (HC; docs/MODELS.md).
#ifndef SATDAR_MODEL_VARIANTS_HYPER_CONNECTIONS_H_
#define SATDAR_MODEL_VARIANTS_HYPER_CONNECTIONS_H_

#include <memory>

#include "model/topology.h"
#include "model/sharding.h"

namespace satdar::model {

template <typename T>
std::unique_ptr<Topology<T>> MakeHc(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_HYPER_CONNECTIONS_H_
