#include "worker/mfu.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/ops/gemm.h"

namespace satdar::worker {

int64_t DepthRetrievalReads(const model::ModelConfig& c) {
  int streams = 0, default_block = 1;
  if (c.residual == model::Residual::kAttnRes) {
    streams = 1;
  } else if (c.residual == model::Residual::kDar) {
    streams = 2;
    default_block = 2;
  } else {
    return 0;
  }
  // Retrieval i (0 before sublayer 1, ..., 2L the final readout) reads the embedding and one
  // entry per block of `block` sublayers begun before it: 1 + ceil(i / block).
  const int64_t block = c.block_size > 0 ? c.block_size : default_block;
  int64_t reads = 0;
  for (int64_t i = 0; i <= 2 * static_cast<int64_t>(c.num_hidden_layers); ++i) {
    reads += 1 + (i + block - 1) / block;
  }
  return reads * streams;
}

double FlopsPerToken(int64_t parameters, const model::ModelConfig& c, int seq_len) {
  double active = static_cast<double>(parameters);
  if (c.moe.has_value()) {  // a token runs top_k of the num_experts routed experts
    active -= static_cast<double>(c.num_hidden_layers) * (c.moe->num_experts - c.moe->top_k) * 3.0 *
              c.moe->expert_intermediate_size * c.hidden_size;
  }
  return 6.0 * active + 6.0 * c.num_hidden_layers * static_cast<double>(seq_len) * c.hidden_size +
         12.0 * static_cast<double>(DepthRetrievalReads(c)) * c.hidden_size;
}

double GpuPeakFlops(const std::string& name) {
  // Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, SXM parts.
  struct Row {
    const char* key;
    double tflops;
  };
  static const Row kTable[] = {{"H200", 989}, {"H100 PCIe", 756}, {"H100", 989}, {"GH200", 989},
                               {"B200", 2250}, {"A100", 312}, {"L40S", 362}, {"A10", 125}};
  for (const Row& r : kTable) {
    if (name.find(r.key) != std::string::npos) return r.tflops * 1e12;
  }
  return 0;
}

double MeasureCpuPeakFlops(core::ThreadPool* pool) {
  constexpr int kN = 512;
  std::vector<float> a(kN * kN, 0.5f), b(kN * kN, 0.25f), out(kN * kN, 0.f);
  core::cpu::InitBlas();
  const auto start = std::chrono::steady_clock::now();
  double best = 0;
  for (int run = 0; run < 50; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    core::cpu::ParallelGemm<float>(pool, false, false, kN, kN, kN, 1.f, a.data(), kN, b.data(),
                                   kN, 0.f, out.data(), kN);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * kN * kN * kN / s);
    if (run >= 3 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > 0.2) {
      break;
    }
  }
  return best;
}

}  // namespace satdar::worker
