// bench/cpu_hardware.cc: measures this machine for `satdar plan --hardware` (model/hardware.h),
// so that the planner's CPU predictions come from measured rates, not fitted ones:
//   cpu_hardware --dtype f32|f64 [--link LINK.json] --out CPU.json      (one process)
//       one core's GEMM rate (the CPU model's GEMM, 512 x 512 x 512, median of 60) and the
//       fraction of it the forms a linear layer runs reach over sizes 128..1024, one core's
//       copy bandwidth (read + write of 128 MiB), a small GEMM call's time (the per-op
//       overhead), the cores and the memory; the link's numbers from LINK.json
//   mpirun -np 2 <the mpirun flags the trainer uses> cpu_hardware --measure-link --out LINK.json
//       the MPI link between two ranks: half a round trip of 8 bytes (latency) and of 8 MiB
//       (bandwidth), best of 20
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "core/check.h"
#include "core/ops/gemm.h"
#include "core/thread_pool.h"
#include "model/hardware.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The median rate of an n x n x n GEMM in one of the model's forms (A or B transposed): what a
// shared VM sustains over a run, not its best moment.
template <typename T>
double GemmRate(satdar::core::ThreadPool* pool, int n, int runs, double* best_seconds,
                bool trans_a = false, bool trans_b = false) {
  std::vector<T> a(static_cast<size_t>(n) * n, T(0.5)), b(a.size(), T(0.25)), c(a.size(), T(0));
  std::vector<double> times;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    satdar::core::cpu::ParallelGemm<T>(pool, trans_a, trans_b, n, n, n, T(1), a.data(), n,
                                       b.data(), n, T(0), c.data(), n);
    times.push_back(Since(t0));
  }
  std::sort(times.begin(), times.end());
  *best_seconds = times[times.size() / 2];
  return 2.0 * n * n * n / *best_seconds;
}

// What the model's GEMMs reach against the peak: the geometric mean over the forms a linear
// layer runs (x W^T forward, dout W and dout^T x backward) and sizes 128 to 1024.
template <typename T>
double GemmEfficiency(satdar::core::ThreadPool* pool, double peak) {
  double log_sum = 0;
  int count = 0;
  for (int n : {128, 256, 512, 1024}) {
    for (const auto& [ta, tb] : {std::pair{false, true}, std::pair{false, false},
                                 std::pair{true, false}}) {
      double seconds = 0;
      log_sum += std::log(GemmRate<T>(pool, n, n >= 1024 ? 5 : 21, &seconds, ta, tb) / peak);
      ++count;
    }
  }
  return std::min(1.0, std::exp(log_sum / count));
}

double CopyBandwidth() {
  const size_t n = size_t{32} << 20;  // 32 Mi floats: 128 MiB each way
  std::vector<float> src(n, 1.f), dst(n, 0.f);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    best = std::min(best, Since(t0));
  }
  return 2.0 * n * sizeof(float) / best;
}

int MeasureLink(int* argc, char*** argv, const std::string& out) {
  auto world = satdar::comm::MpiWorld(argc, argv);
  if (!world.ok() || (*world)->size() != 2) {
    std::fprintf(stderr, "cpu_hardware: --measure-link needs mpirun -np 2\n");
    return 2;
  }
  satdar::comm::Communicator* c = world->get();
  const int peer = 1 - c->rank();
  auto ok = [](std::unique_ptr<satdar::comm::Work> w) {
    const absl::Status s = w->Wait();
    SATDAR_CHECK(s.ok()) << s;
  };
  auto half_trip = [&](size_t bytes) {
    std::vector<float> buf(bytes / sizeof(float), 1.f);
    const size_t n = buf.size();
    const auto f32 = satdar::core::DType::kF32;
    double best = 1e30;
    for (int r = 0; r < 21; ++r) {
      const auto t0 = Clock::now();
      if (c->rank() == 0) {
        ok(c->Send(buf.data(), n, f32, peer, 7, {}));
        ok(c->Recv(buf.data(), n, f32, peer, 7, {}));
      } else {
        ok(c->Recv(buf.data(), n, f32, peer, 7, {}));
        ok(c->Send(buf.data(), n, f32, peer, 7, {}));
      }
      if (r > 0) best = std::min(best, Since(t0) / 2);
    }
    return best;
  };
  const double latency = half_trip(8);
  const size_t big = size_t{8} << 20;
  const double bandwidth = big / (half_trip(big) - latency);
  if (c->rank() == 0) {
    std::ofstream(out) << nlohmann::json{{"latency", latency}, {"bandwidth", bandwidth}}.dump(2)
                       << "\n";
    std::printf("link: %.1f us, %.2f GB/s\n", latency * 1e6, bandwidth / 1e9);
  }
  world->reset();
  satdar::comm::MpiFinalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, dtype = "f32", link;
  bool measure_link = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--measure-link") {
      measure_link = true;
    } else if ((a == "--out" || a == "--dtype" || a == "--link") && i + 1 < argc) {
      (a == "--out" ? out : a == "--dtype" ? dtype : link) = argv[++i];
    } else {
      std::fprintf(stderr, "usage: cpu_hardware [--measure-link] --out FILE [--dtype f32|f64] "
                           "[--link LINK.json]\n");
      return 2;
    }
  }
  if (out.empty() || (dtype != "f32" && dtype != "f64")) {
    std::fprintf(stderr, "cpu_hardware: --out FILE is required; --dtype is f32 or f64\n");
    return 2;
  }
  if (measure_link) return MeasureLink(&argc, &argv, out);

  satdar::core::cpu::InitBlas();
  satdar::core::ThreadPool pool(1);
  double seconds = 0, tiny = 0;
  const double rate = dtype == "f64" ? GemmRate<double>(&pool, 512, 60, &seconds)
                                     : GemmRate<float>(&pool, 512, 60, &seconds);
  if (dtype == "f64") {
    GemmRate<double>(&pool, 8, 200, &tiny);
  } else {
    GemmRate<float>(&pool, 8, 200, &tiny);
  }
  // The GEMM on every core of one rank (the trainer's --threads), for the record.
  satdar::core::ThreadPool all(static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  double all_seconds = 0;
  const double all_rate = dtype == "f64" ? GemmRate<double>(&all, 1024, 10, &all_seconds)
                                         : GemmRate<float>(&all, 1024, 10, &all_seconds);
  satdar::model::Hardware h;
  h.name = "cpu";
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  h.description = std::string("this CPU (") + host + ", " + dtype + ")";
  h.peak_flops = rate;
  h.gemm_efficiency = dtype == "f64" ? GemmEfficiency<double>(&pool, rate)
                                     : GemmEfficiency<float>(&pool, rate);
  h.attention_efficiency = 1;  // unused: a CPU's attention is GEMMs and passes over memory
  h.memory_bandwidth = CopyBandwidth();
  h.memory_efficiency = 1;
  h.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  h.multiprocessors = 0;
  h.op_overhead = tiny;
  h.cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  h.gpu = false;
  h.intra_node_bandwidth = h.inter_node_bandwidth = h.memory_bandwidth / 2;
  h.intra_node_latency = h.inter_node_latency = 20e-6;
  if (!link.empty()) {
    std::ifstream in(link);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("latency") || !j.contains("bandwidth")) {
      std::fprintf(stderr, "cpu_hardware: %s is not a --measure-link output\n", link.c_str());
      return 2;
    }
    h.intra_node_bandwidth = h.inter_node_bandwidth = j["bandwidth"].get<double>();
    h.intra_node_latency = h.inter_node_latency = j["latency"].get<double>();
  }
  std::ofstream(out) << satdar::model::HardwareToJson(h) << "\n";
  std::printf("cpu: %.1f GFLOP/s per core (%s GEMM 512^3; %.0f%% over the model's forms), %.1f GB/s copy, %.1f us per small op, "
              "%d cores (%.1f GFLOP/s on all of them in one rank, 1024^3)\n",
              rate / 1e9, dtype.c_str(), 100 * h.gemm_efficiency, h.memory_bandwidth / 1e9,
              tiny * 1e6, h.cores,
              all_rate / 1e9);
  return 0;
}
