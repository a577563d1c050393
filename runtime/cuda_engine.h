// runtime/cuda_engine.h: the step of trainer.cc on a GPU rank.
//
// Micro-batches run forward and backward on one CUDA stream (bf16 or f32 compute, fp32 master
// weights and gradients, model/device_model.h), the CPU model's classes on the device. Every
// layout of the CPU engine runs here through the same classes: data parallelism (each layer's
// gradient slice all-reduced over the device communicator as soon as the backward pass is done
// with it, overlapping the rest of the pass), ZeRO-1 (runtime/zero_partition.h, also with
// expert parallelism), tensor and sequence parallelism and expert parallelism (the model's
// in-pass collectives on device memory), and pipeline stages, plain or interleaved
// (parallel/pipeline.h's 1F1B schedule over one device model instance per micro-batch in
// flight, the boundaries moving device buffers). The step is the one Engine<B, M> of both
// devices (runtime/engine.h) on Cuda<float> and DeviceModel: GradientSyncT and TrainStateT
// reduce, clip and update on the device; the host reads back two numbers a step (loss and
// norm). Checkpoints are the CPU's format (a GPU checkpoint resumes on the CPU and back,
// sharded ones in any layout).
#ifndef SATDAR_RUNTIME_CUDA_ENGINE_H_
#define SATDAR_RUNTIME_CUDA_ENGINE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/mesh_groups.h"
#include "runtime/step_engine.h"
#include "runtime/train_options.h"

namespace satdar::runtime {

// Before anything starts: FailedPrecondition without a CUDA build, InvalidArgument for what
// the GPU engine does not have (f64; a design the kernels cannot take, naming the field).
absl::Status CheckCudaEngine(const TrainOptions& options);

// FailedPrecondition when the machine has no GPU; InvalidArgument for a device it lacks.
// `groups` outlives the engine.
absl::StatusOr<std::unique_ptr<StepEngine>> CreateCudaEngine(const TrainOptions& options,
                                                             MeshGroups* groups);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_CUDA_ENGINE_H_
