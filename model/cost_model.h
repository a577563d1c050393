// model/cost_model.h: what one optimizer step of a config costs on a dp x tp x pp x ep layout,
// from the config and the layout alone (no activation is allocated, no rank runs): the bytes
// global rank 0 hands to each of its groups and what each pipeline boundary carries, in
// exactly the form and units `satdar train --log-jsonl` logs them (comm_bytes,
// pp_boundary_bytes), and the memory a rank needs by kind. `satdar plan` prints it.
//
//   MemoryShape l;  l.tp = 2;  l.pp = 2;  l.batch = 8;  l.seq_len = 256;  l.microbatches = 4;
//   SATDAR_ASSIGN_OR_RETURN(StepCost cost, PredictStep(config, l));
//
// The bytes follow every collective the CPU trainer issues in a step without statistics or
// validation (--stats-every 0, no --eval-every): the model's TP collectives per branch
// (all-reduces, or with sequence parallelism all-gathers and reduce-scatters, again for a
// recomputed forward), the vocabulary-parallel embedding and cross-entropy, the gradient
// reductions (TP and pipeline partial sums, the tied embedding's exchange, the replicas'
// average or ZeRO-1's reduce-scatter and all-gather, experts over dp), the loss and norm
// scalars, and the pipeline's sends. They equal the logged counts byte for byte (tested
// against real runs), except that EP's all-to-alls depend on where the router sends each
// token: the prediction is their expectation under uniform routing (ep_exact false).
#ifndef SATDAR_MODEL_COST_MODEL_H_
#define SATDAR_MODEL_COST_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/layout_check.h"
#include "model/memory_estimate.h"

namespace satdar::model {

// Rank 0's parameter elements by the role its reductions give them (runtime/gradient_sync.h).
struct RankParameters {
  int64_t total = 0;       // the rank's table (all its chunks)
  int64_t tp_partial = 0;  // gradients summed over the TP group
  int64_t pp_partial = 0;  // gradients summed over the stages (learnable_plus's lambdas)
  int64_t experts = 0;     // expert weights (reduced over dp only when ep > 1)
  int64_t embedding = 0;   // the tied embedding exchanged between the first and last stage
  int64_t vocabulary = 0;  // the embedding's and head's rows the rank holds
};

struct StepCost {
  // Group name ("tp", "pp", "ep", "data", "mp"; only the groups of more than one rank) ->
  // bytes rank 0 hands to it in one step.
  std::map<std::string, int64_t> comm_bytes;
  bool ep_exact = true;  // false: the "ep" entry is the uniform-routing expectation
  // Per (virtual) stage boundary in stage order: [activations forward, gradients backward].
  std::vector<std::pair<int64_t, int64_t>> pp_boundary_bytes;
  MemoryEstimate memory;  // the largest stage's rank (model/memory_estimate.h)
  RankParameters parameters;
};

// The layout is a training step's MemoryShape (memory_estimate.h: sizes, batch, dtype,
// ZeRO, padding, recomputation, SP, virtual stages). With mixed_precision (the GPU trainer)
// activations move in dtype_bytes and gradients in fp32. InvalidArgument (naming the field) for
// a layout the trainer would refuse.
absl::StatusOr<StepCost> PredictStep(const ModelConfig& config, const MemoryShape& layout);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_COST_MODEL_H_
