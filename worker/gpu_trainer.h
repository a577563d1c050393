// worker/gpu_trainer.h: `satdar train --device cuda`, the training loop of trainer.h on a GPU.
//
// Per optimizer step: micro-batches run forward and backward on one CUDA stream (bf16 or f32
// compute, fp32 master weights and gradients, model/gpu/gpu_model.h); under data parallelism
// each layer's gradient slice is all-reduced over NCCL as soon as the backward pass is done
// with it (the NCCL stream waits on an event recorded on the compute stream, so communication
// overlaps the rest of the backward pass); then the global gradient norm (one device
// reduction), clipping and the fused AdamW update, all on the device. The host reads back two
// numbers a step (loss and norm). Logs, summaries and checkpoints are those of the CPU
// trainer (a GPU checkpoint resumes on the CPU and back), plus peak device memory and MFU.
#ifndef SATDAR_WORKER_GPU_TRAINER_H_
#define SATDAR_WORKER_GPU_TRAINER_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "worker/trainer.h"

namespace satdar::worker {

struct GpuTrainOptions {
  core::DType compute = core::DType::kBF16;  // kBF16 or kF32
  bool recompute = false;                    // activation recomputation per sublayer
  int device = -1;                           // CUDA device; -1: rank % visible devices
  // Data parallelism over NCCL: this process is rank `rank` of `world_size` (1: alone); rank 0
  // publishes the NCCL id in the FileKvStore folder rendezvous_dir (shared by all ranks).
  int rank = 0;
  int world_size = 1;
  std::string rendezvous_dir;
  double peak_tflops = 989.0;  // the GPU's dense bf16 peak, for MFU (H100/H200 SXM)
};

// Fails with FailedPrecondition without a CUDA build or GPU, InvalidArgument for what the GPU
// path does not have (model parallelism, evaluation, statistics; the design, naming the field).
absl::StatusOr<TrainSummary> TrainGpu(const TrainOptions& options, const GpuTrainOptions& gpu);

// Model FLOPs per token, as bench/pytorch_gpu.py counts them: 6 x parameters (matmuls forward
// and backward; for MoE only the active ones: top_k of the routed experts) + 6 x layers x
// seq_len x hidden (causal attention scores and mixing).
double FlopsPerToken(int64_t parameters, const model::ModelConfig& config, int seq_len);

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_GPU_TRAINER_H_
