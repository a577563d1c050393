// model/layout_check.h: whether a config can be split into a dp x tp x pp x ep layout, and
// whether the device (CUDA) backend's kernels can run it, checked from the config alone (no
// model is built, no kernel linked), so the coordinator can refuse an impossible job at submit
// and `satdar train` before any rank starts.
#ifndef SATDAR_MODEL_LAYOUT_CHECK_H_
#define SATDAR_MODEL_LAYOUT_CHECK_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "model/config.h"

namespace satdar::model {

// What a rank keeps of each layer's activations for the backward pass (--recompute):
//   kNone:      everything (fastest);
//   kSelective: everything but attention's (B, NH, T, T) probabilities, which one shared
//               buffer holds and each layer's backward recomputes from its saved Q and K
//               (Megatron-LM's selective recomputation);
//   kFull:      only what the residual topology keeps (each branch's input); each branch
//               re-runs its forward right before its backward, into one shared set of buffers.
enum class Recompute { kNone, kSelective, kFull };
// "none", "selective", "full" (the --recompute values); RecomputeNamed is its inverse, kNone
// for any other name (the flag parser has checked it).
const char* Name(Recompute r);
Recompute RecomputeNamed(const std::string& name);

// What the caller calls the layout's sizes in its own messages (the command line's flags, a
// job spec's fields); the library's errors use these names and the config's field names.
struct LayoutNames {
  std::string tp = "tensor-parallel size";
  std::string pp = "pipeline stages";
  std::string ep = "expert-parallel size";
  std::string vocab_multiple = "vocabulary multiple";
};

// What the caller calls the batch's sizes in its messages (flags, job-spec fields); the memory
// estimate's errors (memory_estimate.h) use these names.
struct BatchNames {
  std::string batch = "the batch size";
  std::string seq_len = "the sequence length";
  std::string microbatches = "the number of micro-batches";
};

// The vocabulary the embedding and head are padded to inside the model: vocab_size rounded up
// to a multiple of tp x vocab_multiple (Megatron-LM's make-vocab-size-divisible-by), so each
// of the tp ranks holds an equal slice whose width is a multiple of vocab_multiple. The
// padded rows are zero, their logits get no probability, and checkpoints and exported weights
// hold the true [vocab_size, C].
int PaddedVocab(int vocab_size, int tp, int vocab_multiple);

// How a design may be split, from the design table (layout_check.cc: one row per residual
// topology and per value residual; the registry, registry.cc, builds them). A blocker names
// the config field that prevents the split.
struct Capabilities {
  bool pipeline_stages = true;  // its state can cross a stage boundary (topology.h)
  std::string stages_blocker;
  bool tensor_parallel = true;  // every branch input can be split over TP ranks
  std::string tp_blocker;
};
Capabilities CapabilitiesOf(const ModelConfig& config);

// Heads, KV heads and intermediate size divisible by tp; layers by pp; experts by ep; every
// TP rank holding at least one true vocabulary row after padding; and the design able to be
// split that way (CapabilitiesOf). The InvalidArgument error names the size (as `names`
// calls it), the config field and the change that would run.
absl::Status ValidateSharding(const ModelConfig& config, int tp, int pp, int ep,
                              const LayoutNames& names = {}, int vocab_multiple = 1);

// The GPU's parameter tables start every tensor at a multiple of this many elements.
inline constexpr int64_t kDeviceParamAlign = 32;
// Limits of the CUDA kernels (per-thread arrays, shared memory), checked from the config alone.
// Copies, so this library needs no kernel headers: static_asserts keep each equal to the
// kernels' own constant (variants/hyper_ops_cpu.cc, variants/moe_ops_cpu.cc,
// layers/attention.cc).
inline constexpr int kDeviceMaxHyperStreams = 8;  // = cuda::kMaxHyperStreams (variants/hyper_ops.h)
inline constexpr int kDeviceMaxExperts = 256;     // = kMoeMaxExperts (variants/moe_ops.h)
inline constexpr int kDeviceMaxTopK = 16;         // = kMoeMaxTopK
inline constexpr int kDeviceMaxHeadSize = 128;    // = core::cuda::kAttentionMaxHeadSize

// OK when the device (CUDA) backend can run this config; otherwise InvalidArgument naming the
// config field and the limit: hc_streams (HC and mHC), the dense FFN's and the experts'
// gate/up weight (a multiple of kDeviceParamAlign elements: gate_proj and up_proj run as one
// (2F, D) GEMM, adjacent in the table), moe.num_experts and moe.top_k, and the head size.
// tp: the tensor-parallel size (a rank's dense FFN weights are intermediate_size / tp rows).
absl::Status CheckDeviceSupport(const ModelConfig& config, int tp = 1);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYOUT_CHECK_H_
