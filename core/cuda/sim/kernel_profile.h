// core/cuda/sim/kernel_profile.h: the simulator's per-kernel profile (SATDAR_SIM_PROFILE=1),
// used by kernel_sim.cc only.
#ifndef SATDAR_CORE_CUDA_SIM_KERNEL_PROFILE_H_
#define SATDAR_CORE_CUDA_SIM_KERNEL_PROFILE_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace satdar::cuda_sim {

// SATDAR_SIM_PROFILE=1: per kernel, the launches, blocks, threads, fiber resumes and wall time,
// printed to stderr at exit, most time first (where a simulated run spends its time; nothing
// about a real GPU's).
struct KernelProfile {
  uint64_t launches = 0, blocks = 0, threads = 0, resumes = 0;
  double seconds = 0;
};

class Profiler {
 public:
  static Profiler* Get() {
    static Profiler* profiler = [] {
      const char* env = std::getenv("SATDAR_SIM_PROFILE");
      if (env == nullptr || *env == '\0' || std::strcmp(env, "0") == 0) return (Profiler*)nullptr;
      auto* p = new Profiler();  // never destroyed: stream threads may still add at exit
      std::atexit([] { Get()->Print(); });
      return p;
    }();
    return profiler;
  }

  void Add(const std::string& name, uint64_t blocks, uint64_t threads, uint64_t resumes,
           double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    KernelProfile& k = kernels_[name];
    ++k.launches;
    k.blocks += blocks;
    k.threads += threads;
    k.resumes += resumes;
    k.seconds += seconds;
  }

 private:
  void Print() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<std::string, KernelProfile>> rows(kernels_.begin(), kernels_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    double total = 0;
    for (const auto& r : rows) total += r.second.seconds;
    std::fprintf(stderr, "CUDA simulator profile: %zu kernels, %.2f s in grids\n", rows.size(),
                 total);
    std::fprintf(stderr, "%10s %6s %9s %12s %12s %12s  %s\n", "seconds", "%", "launches",
                 "blocks", "threads", "resumes", "kernel");
    for (const auto& [name, k] : rows) {
      std::fprintf(stderr, "%10.3f %6.1f %9llu %12llu %12llu %12llu  %s\n", k.seconds,
                   total > 0 ? 100 * k.seconds / total : 0.0,
                   static_cast<unsigned long long>(k.launches),
                   static_cast<unsigned long long>(k.blocks),
                   static_cast<unsigned long long>(k.threads),
                   static_cast<unsigned long long>(k.resumes), name.c_str());
    }
  }

  std::mutex mu_;
  std::map<std::string, KernelProfile> kernels_;
};

}  // namespace satdar::cuda_sim

#endif  // SATDAR_CORE_CUDA_SIM_KERNEL_PROFILE_H_
