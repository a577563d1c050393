// model/memory_estimate.h: how much host memory a CPU command will allocate, before it does.
//
//   MemoryEstimate e;
//   SATDAR_ASSIGN_OR_RETURN(e, EstimateMemory(config, {.batch = 16, .seq_len = 128}));
//   if (e.total() > AvailableMemoryBytes()) ... refuse, naming e.Largest()
//
// Per rank of the layout, for its largest pipeline stage: parameters, gradients and AdamW
// moments (exact: counted from the rank's own parameter table) and the activations one model
// instance saves for its backward pass (from each component's buffer sizes: attention with its
// (B, NH, T, T) probabilities, the FFN or MoE, the value residual, and the residual topology's
// per-sublayer state). A pipeline stage keeps one instance per micro-batch in flight. The
// activation part is an estimate within a factor of two of what the CPU model allocates
// (memory_estimate_test measures it for every design).
#ifndef SATDAR_MODEL_MEMORY_ESTIMATE_H_
#define SATDAR_MODEL_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/layout_check.h"

namespace satdar::model {

enum class MemoryUse {
  kWeights,   // init, export, info: the parameters only
  kForward,   // eval: parameters and one forward pass
  kGradient,  // grad: parameters, gradients, one forward and backward pass
  kTraining,  // train: the above plus the AdamW moments
};

struct MemoryShape {
  MemoryUse use = MemoryUse::kTraining;
  int64_t batch = 1;         // sequences per optimizer step per data-parallel replica
  int64_t seq_len = 1;
  int64_t microbatches = 1;
  int64_t dtype_bytes = 4;   // 4 (f32) or 8 (f64); 2 (bf16) with mixed_precision
  // The GPU trainer's precision (docs/GPU.md): activations and a compute copy of the weights
  // in dtype_bytes (bf16), fp32 master weights, gradients and AdamW moments.
  bool mixed_precision = false;
  // Attention keeps only its log-sum-exp for backward (the GPU's flash-style kernel), never
  // the (B, NH, T, T) probabilities.
  bool flash_attention = false;
  int tp = 1, pp = 1, ep = 1, dp = 1;
  int zero_stage = 0;        // 1: the moments are sharded over the dp x ep replicas
  int vocab_multiple = 1;    // the embedding and head padded as Sharding::vocab_multiple says
  Recompute recompute = Recompute::kNone;  // which activations are recomputed, not kept
  bool sequence_parallel = false;  // the residual stream's state split over the tp ranks
  int virtual_stages = 1;          // model chunks per pipeline rank (interleaved 1F1B)
};

struct MemoryEstimate {
  int64_t parameters = 0;     // elements on this rank
  int64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;  // optimizer: moments
                                                    // (and fp32 master weights when mixed)
  int64_t activation_bytes = 0;  // all model instances of the rank
  int64_t embedding_parameters = 0;  // of `parameters`: embedding and head rows
  bool mixed_precision = false;      // optimizer_bytes include the fp32 master weights
  int64_t total() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes;
  }
  // "parameters 1.2 GiB, gradients 1.2 GiB, AdamW moments 2.4 GiB, activations 3.1 GiB"
  std::string Breakdown() const;
  // What to shrink: the sizes (as `names` calls them) or config fields behind the largest part.
  std::string Largest(const BatchNames& names = {}) const;
};

absl::StatusOr<MemoryEstimate> EstimateMemory(const ModelConfig& config,
                                              const MemoryShape& shape);

// Memory this process may still allocate: the smallest of MemAvailable (/proc/meminfo), the
// cgroup's memory.max - memory.current, and RLIMIT_AS; -1 when none can be read.
int64_t AvailableMemoryBytes();

// "12.3 GiB", "512.0 MiB"
std::string FormatBytes(int64_t bytes);

// OK when `ranks` ranks of this shape fit in AvailableMemoryBytes(); otherwise InvalidArgument
// "<what> needs about X per rank (breakdown) ..., more than the Y this machine has available;
// reduce <largest>". Nothing is checked when the available memory is unknown.
absl::Status CheckFitsInMemory(const ModelConfig& config, const MemoryShape& shape, int ranks,
                               const std::string& what, const BatchNames& names = {});

}  // namespace satdar::model

#endif  // SATDAR_MODEL_MEMORY_ESTIMATE_H_
