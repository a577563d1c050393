// worker/cuda_engine.h: the step of trainer.cc on a GPU rank.
//
// Micro-batches run forward and backward on one CUDA stream (bf16 or f32 compute, fp32 master
// weights and gradients, model/device_model.h). Under data parallelism each layer's gradient
// slice is all-reduced over the device communicator (GpuOptions::world) as soon as the
// backward pass is done with it: the communicator waits on an event recorded on the compute
// stream, so communication overlaps the rest of the backward pass. Then the global gradient
// norm (one device reduction), clipping and the fused AdamW update, all on the device; the
// host reads back two numbers a step (loss and norm). Checkpoints are the CPU engine's format
// (a GPU checkpoint resumes on the CPU and back). ZeRO-1 (dp > 1): the gradients are
// reduce-scattered after the last backward pass, each replica keeps the AdamW moments of its
// slice of the flat buffer and updates only that, the weights are all-gathered; checkpoints
// gather the moments. Tensor, pipeline and expert parallelism and --stats-every are the CPU
// engine's only (CheckCudaEngine says so).
#ifndef SATDAR_WORKER_CUDA_ENGINE_H_
#define SATDAR_WORKER_CUDA_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/mesh_groups.h"
#include "worker/step_engine.h"
#include "worker/train_options.h"

namespace satdar::worker {

// Before anything starts: FailedPrecondition without a CUDA build, InvalidArgument for what
// the GPU engine does not have (model parallelism, statistics, f64; the design,
// naming the field).
absl::Status CheckCudaEngine(const TrainOptions& options);

// FailedPrecondition when the machine has no GPU; InvalidArgument for a device it lacks.
// `groups` outlives the engine.
absl::StatusOr<std::unique_ptr<StepEngine>> CreateCudaEngine(const TrainOptions& options,
                                                             MeshGroups* groups);

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_CUDA_ENGINE_H_
