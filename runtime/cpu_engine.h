// runtime/cpu_engine.h: the step of trainer.cc on CPU ranks, for every dp x tp x pp x ep
// layout: the model pieces of model/model.h (one per micro-batch in flight under the 1F1B
// schedule, parallel/pipeline.h), the flat buffers and AdamW of train_state.h, and the
// reductions of gradient_sync.h. In f32, or f64 (TrainOptions::f64).
#ifndef SATDAR_RUNTIME_CPU_ENGINE_H_
#define SATDAR_RUNTIME_CPU_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "model/memory_estimate.h"
#include "runtime/mesh_groups.h"
#include "runtime/step_engine.h"
#include "runtime/train_options.h"

namespace satdar::runtime {

// What one CPU rank of these options allocates (model/memory_estimate.h's shape).
model::MemoryShape TrainMemoryShape(const TrainOptions& options);

// `groups` outlives the engine.
absl::StatusOr<std::unique_ptr<StepEngine>> CreateCpuEngine(const TrainOptions& options,
                                                            MeshGroups* groups);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_CPU_ENGINE_H_
