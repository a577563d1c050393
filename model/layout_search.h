// model/layout_search.h: the best dp x tp x pp x ep layouts of a cluster for a config, before a
// single GPU hour is spent (`satdar plan --nodes --gpus-per-node --gpu`).
//
//   Cluster cluster{.nodes = 4, .ranks_per_node = 8, .hardware = *FindHardware("h200")};
//   SearchRequest request{.global_batch = 512, .seq_len = 4096};
//   SATDAR_ASSIGN_OR_RETURN(SearchResult r, SearchLayouts(config, cluster, request));
//
// Every layout that uses all of the cluster's devices is tried: tp dividing the node (TP stays
// inside it), pp dividing the layers, ep the experts, the data-parallel size what is left; for
// each, the micro-batch counts dividing the replica's batch, the virtual stages that split
// the layers evenly, plain data parallelism and ZeRO-1 (which saves memory but, on satdar's
// GPU path, does not overlap the backward), and the recomputation modes (none, then selective
// on a CPU, then full: each only when the previous does not fit), with and without sequence
// parallelism when tp > 1 (it saves memory; its backward gathers the branch inputs again).
// Micro-batch counts go up to 256 and virtual stages up to 8. What the request fixes (the
// micro-batches, virtual stages, ZeRO stage, sequence parallelism, recomputation) is kept for
// every layout instead of searched. A layout fits when its largest rank's memory (model/memory_estimate.h;
// on a GPU bf16 mixed precision with flash attention) is at most kUsableMemory of the
// device's; the ones that fit are ranked by predicted tokens per second (model/step_time.h).
#ifndef SATDAR_MODEL_LAYOUT_SEARCH_H_
#define SATDAR_MODEL_LAYOUT_SEARCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/cost_model.h"
#include "model/hardware.h"
#include "model/memory_estimate.h"
#include "model/step_time.h"

namespace satdar::model {

// Of a device's memory, what a layout may plan to use: the rest is the CUDA context, NCCL's
// buffers and the allocator's fragmentation.
inline constexpr double kUsableMemory = 0.9;

struct Cluster {
  int nodes = 1;
  int ranks_per_node = 8;  // GPUs per node (CPU: processes)
  Hardware hardware;
  int threads = 1;         // CPU: threads per rank
  int dtype_bytes = 4;     // CPU only: 4 or 8 (a GPU computes in bf16)
};

struct SearchRequest {
  // Exactly one: sequences per optimizer step over all replicas (the same training run for
  // every layout), or per data-parallel replica (as `satdar train --batch-size`).
  int64_t global_batch = 0;
  int64_t batch_per_replica = 0;
  int64_t seq_len = 0;
  int vocab_multiple = 1;
  int top = 10;  // how many layouts to keep
  // Choices the caller fixes instead of searching (0 or -1: search them).
  int64_t microbatches = 0;
  int virtual_stages = 0;
  int zero_stage = -1;         // 0 or 1
  int sequence_parallel = -1;  // 0 or 1 (1 only where tp > 1 divides a micro-batch's tokens)
  bool recompute_fixed = false;
  Recompute recompute = Recompute::kNone;
};

// One predicted layout.
struct Candidate {
  MemoryShape layout;
  StepCost cost;
  StepTime time;
  double tokens_per_second = 0;  // the whole job's
  double mfu = 0;                // model FLOPs (model/flops.h) over the devices' peak
  bool fits = false;
};

// A whole layout's prediction on a cluster of `hardware` (also `satdar plan --layout --gpu`).
absl::StatusOr<Candidate> PredictLayout(const ModelConfig& config, const MemoryShape& layout,
                                        const Hardware& hardware, const Placement& placement);

struct SearchResult {
  std::vector<Candidate> best;  // fitting layouts, fastest first (at most request.top)
  int64_t tried = 0;            // layouts the config allows
  int64_t fitting = 0;          // of them, those that fit in memory
};

// InvalidArgument when the request is malformed, when no layout of the cluster can run the
// config (naming the last reason, e.g. a size that cannot divide), and when none fits in
// memory (naming the smallest one's memory by kind), as CheckFitsInMemory does.
absl::StatusOr<SearchResult> SearchLayouts(const ModelConfig& config, const Cluster& cluster,
                                           const SearchRequest& request);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYOUT_SEARCH_H_
