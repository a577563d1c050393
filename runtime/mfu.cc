#include "runtime/mfu.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/ops/gemm.h"

namespace satdar::runtime {

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

}  // namespace satdar::runtime
