// runtime/mfu.h: model FLOPs utilisation, MFU = FLOPs per token (model/flops.h) x tokens per
// second per rank / the rank's peak FLOP/s (docs/OBSERVABILITY.md has the formula and its terms).
#ifndef SATDAR_RUNTIME_MFU_H_
#define SATDAR_RUNTIME_MFU_H_

#include <cstdint>
#include <string>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/flops.h"  // FlopsPerToken, the numerator

namespace satdar::runtime {

// MFU of one rank: flops_per_token x tokens_per_second / ranks (the job's tokens are shared by
// its ranks) / peak_flops (per rank).
inline double Mfu(double tokens_per_second, int ranks, double flops_per_token, double peak_flops) {
  return tokens_per_second / ranks * flops_per_token / peak_flops;
}

// Dense bf16 peak FLOP/s of a GPU from its name ("NVIDIA H200" -> 989e12), or 0 when the table
// does not know it.
double GpuPeakFlops(const std::string& device_name);

// The FLOP/s this process reaches on `threads` threads with the GEMM the CPU model uses (f32,
// 512 x 512 x 512, best of several runs over about 0.2 s): a CPU rank's MFU peak.
double MeasureCpuPeakFlops(core::ThreadPool* pool);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_MFU_H_
