// model/step_time.h: how long one optimizer step of a config takes on a layout and a device,
// from a roofline of every op the step runs, before any rank runs.
//
//   SATDAR_ASSIGN_OR_RETURN(StepCost cost, PredictStep(config, layout));
//   SATDAR_ASSIGN_OR_RETURN(Hardware h200, FindHardware("h200"));
//   SATDAR_ASSIGN_OR_RETURN(StepTime t, PredictStepTime(config, layout, cost, h200, {8, 1}));
//
// Each op of a micro-batch's forward and backward (the projections and FFN or expert GEMMs,
// causal attention, norms, RoPE, SwiGLU, the value residual, the residual topology's depth
// reads and writes, embedding, head and cross-entropy) costs the larger of its FLOPs at the
// device's GEMM or attention efficiency (GEMMs quantised into waves of 128 x 128 tiles over
// the SMs) and its bytes at the memory bandwidth, plus a per-op overhead. Collectives cost
// their ring wire bytes over the link their group spans (inside a node or between nodes) plus
// a latency per ring step: TP and EP inside each micro-batch, the pipeline's boundary sends,
// the gradient reduction (or ZeRO-1's reduce-scatter and gather) and the optimizer's pass over
// its state. The pipeline adds 1F1B's bubble, (pp - 1) / virtual stages of a micro-batch's
// time on the slowest stage. On a GPU (Hardware::gpu) the plain gradient all-reduce overlaps the
// last micro-batch's backward (as runtime/engine.h issues it through GradientSyncT, layer by layer; not with
// pipeline stages or expert parallelism, and ZeRO-1's reduce-scatter and gather do not overlap) and sends overlap compute but for the pipeline's
// fill and drain; on a CPU nothing overlaps and the node's ranks share its cores.
#ifndef SATDAR_MODEL_STEP_TIME_H_
#define SATDAR_MODEL_STEP_TIME_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/cost_model.h"
#include "model/hardware.h"
#include "model/memory_estimate.h"

namespace satdar::model {

struct Placement {
  int ranks_per_node = 8;  // consecutive global ranks share a node (mesh order: tp innermost)
  int threads = 1;         // CPU: threads per rank
};

struct OpTime {
  std::string name;  // "attention.qkv", "moe.experts", "tp.collectives", ...
  double flops = 0, bytes = 0, seconds = 0;  // over the step, on the slowest stage's rank
};

struct StepTime {
  std::vector<OpTime> ops;          // slowest first
  double compute_seconds = 0;       // every micro-batch's forward and backward, TP and EP inside
  double tp_seconds = 0, ep_seconds = 0;  // of compute_seconds: the collectives
  double pp_seconds = 0;            // boundary sends not hidden by compute
  double bubble_seconds = 0;        // the pipeline's fill and drain
  double data_seconds = 0;          // gradient reduction (ZeRO: and the gather) not hidden
  double optimizer_seconds = 0;     // AdamW and the gradient norm
  double step_seconds = 0;
  double executed_flops = 0;        // on that rank, recomputation included
};

// InvalidArgument for a hardware or placement that cannot hold the layout.
absl::StatusOr<StepTime> PredictStepTime(const ModelConfig& config, const MemoryShape& layout,
                                         const StepCost& cost, const Hardware& hardware,
                                         const Placement& placement);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_STEP_TIME_H_
