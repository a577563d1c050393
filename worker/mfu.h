// worker/mfu.h: model FLOPs utilisation, MFU = FLOPs per token x tokens per second per rank /
// the rank's peak FLOP/s (docs/OBSERVABILITY.md has the formula and its terms).
#ifndef SATDAR_WORKER_MFU_H_
#define SATDAR_WORKER_MFU_H_

#include <cstdint>
#include <string>

#include "core/thread_pool.h"
#include "model/config.h"

namespace satdar::worker {

// Training FLOPs per token (forward and backward) of the whole model with `parameters`
// elements: 6 per active parameter (the MoE's top_k routed experts, not all of them; the
// SATFormer gate and the depth-retrieval keys are parameters too), 6 x L x T x C for causal
// attention's scores and weighted sums, and 12 x C per history entry a DAR or AttnRes depth
// retrieval reads (a score and a weighted sum per source, per stream).
double FlopsPerToken(int64_t parameters, const model::ModelConfig& config, int seq_len);

// MFU of one rank: flops_per_token x tokens_per_second / ranks (the job's tokens are shared by
// its ranks) / peak_flops (per rank).
inline double Mfu(double tokens_per_second, int ranks, double flops_per_token, double peak_flops) {
  return tokens_per_second / ranks * flops_per_token / peak_flops;
}

// History entries the depth retrievals of one token read in a forward pass, over every
// retrieval (2L sublayers and the final readout) and stream: 0 for designs without them.
int64_t DepthRetrievalReads(const model::ModelConfig& config);

// Dense bf16 peak FLOP/s of a GPU from its name ("NVIDIA H200" -> 989e12), or 0 when the table
// does not know it.
double GpuPeakFlops(const std::string& device_name);

// The FLOP/s this process reaches on `threads` threads with the GEMM the CPU model uses (f32,
// 512 x 512 x 512, best of several runs over about 0.2 s): a CPU rank's MFU peak.
double MeasureCpuPeakFlops(core::ThreadPool* pool);

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_MFU_H_
