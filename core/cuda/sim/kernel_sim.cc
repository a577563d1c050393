// core/cuda/sim/kernel_sim.cc: see kernel_sim.h. The grid's thread pool and the per-block
// fiber scheduler (barriers and warp collectives).
#include "core/cuda/sim/kernel_sim.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/sim/fiber.h"
#include "core/cuda/sim/kernel_profile.h"

#if defined(__SANITIZE_ADDRESS__)
#define SATDAR_SIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SATDAR_SIM_ASAN 1
#endif
#endif

#if defined(SATDAR_SIM_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace satdar::cuda_sim {
namespace internal {

__thread __attribute__((tls_model("initial-exec"))) uint3 g_thread_idx;
__thread __attribute__((tls_model("initial-exec"))) uint3 g_block_idx;
__thread __attribute__((tls_model("initial-exec"))) dim3 g_block_dim;
__thread __attribute__((tls_model("initial-exec"))) dim3 g_grid_dim;

}  // namespace internal

namespace {

using internal::WarpOp;

// The largest block (CUDA's limit); launch.h rejects more before we get here.
constexpr unsigned kMaxThreads = 1024;
constexpr unsigned kWarpSize = 32;

// ---------------------------------------------------------------------------------------------
// Settings.

std::atomic<int> g_order{-1};  // FiberOrder, or -1 before the environment is read.
std::atomic<uint64_t> g_seed{0};

void ReadOrderFromEnv() {
  if (g_order.load(std::memory_order_acquire) >= 0) return;
  FiberOrder order = FiberOrder::kForward;
  uint64_t seed = 0;
  if (const char* env = std::getenv("SATDAR_SIM_ORDER"); env != nullptr && *env != '\0') {
    if (std::strcmp(env, "reverse") == 0) {
      order = FiberOrder::kReverse;
    } else if (std::strncmp(env, "shuffle", 7) == 0) {
      order = FiberOrder::kShuffle;
      if (env[7] == ':') seed = std::strtoull(env + 8, nullptr, 10);
    } else if (std::strcmp(env, "forward") != 0) {
      Report(std::string("SATDAR_SIM_ORDER=") + env +
             " is not forward, reverse or shuffle:SEED; using forward");
    }
  }
  g_seed.store(seed);
  int expected = -1;
  g_order.compare_exchange_strong(expected, static_cast<int>(order));
}

size_t StackBytes() {
  static const size_t bytes = [] {
#if defined(SATDAR_SIM_ASAN)
    size_t kb = 256;  // ASan's redzones grow frames several times.
#else
    size_t kb = 64;
#endif
    if (const char* env = std::getenv("SATDAR_SIM_STACK_KB")) kb = std::strtoull(env, nullptr, 10);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return std::max<size_t>((kb * 1024 + page - 1) / page * page, 4 * page);
  }();
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// The grid.

struct GridJob {
  std::string name;
  dim3 grid, block;
  size_t smem = 0;
  std::function<void()> body;
  FiberOrder order = FiberOrder::kForward;
  uint64_t seed = 0;
  uint64_t total = 0;  // blocks
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> finished{0};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> resumes{0};  // fiber resumes over all blocks, for the profile
  std::mutex mu;
  std::condition_variable done_cv;
};

// ---------------------------------------------------------------------------------------------
// Fibers and the per-host-thread state.

enum class FiberState : uint8_t { kRunnable, kBarrier, kWarp, kDone, kAborted };

struct Stack {
  char* map = nullptr;  // guard page, then the usable stack
  size_t map_bytes = 0;
  char* lo = nullptr;
  char* hi = nullptr;
};

struct Fiber {
  FiberContext ctx;
  Stack* stack = nullptr;
  uint3 tid{0, 0, 0};
  unsigned linear = 0;
  FiberState state = FiberState::kRunnable;
  uint64_t barriers = 0;  // __syncthreads passed
  // The posted warp collective, while state == kWarp.
  WarpOp op = WarpOp::kSync;
  unsigned mask = 0;
  uint32_t value = 0;
  int lane_mask = 0;
  int width = 0;
  uint32_t result = 0;
#if defined(SATDAR_SIM_ASAN)
  void* fake_stack = nullptr;
#endif
};

// One host thread's block runner. Stacks are kept for the thread's life and reused by every
// block it runs (a fresh mmap per block would cost more than the block).
struct ThreadState {
  std::vector<Stack> stacks;
  std::vector<Fiber> fibers;
  std::vector<unsigned> order;
  // Per warp: the lanes that have not exited, and the lanes posted at a warp collective
  // (state kWarp). A collective is checked only once every live lane of its mask has posted.
  std::vector<uint32_t> warp_live;
  std::vector<uint32_t> warp_posted;
  FiberContext sched;
  const void* sched_stack_bottom = nullptr;  // for ASan's fiber switch annotations
  size_t sched_stack_size = 0;
  GridJob* job = nullptr;
  unsigned threads = 0;
  Fiber* current = nullptr;
  bool failed = false;
  std::string failure;
  std::unique_ptr<char[]> dynamic_shared;
  // The signal stack this thread installed for OnSegv (nullptr: none, or the thread had one).
  std::unique_ptr<char[]> alt_stack;

  ~ThreadState() {
    if (alt_stack != nullptr) {
      stack_t ss{};
      ss.ss_flags = SS_DISABLE;
      sigaltstack(&ss, nullptr);
    }
    for (Stack& s : stacks) munmap(s.map, s.map_bytes);
  }
};

thread_local ThreadState t_state;
__thread __attribute__((tls_model("initial-exec"))) ThreadState* t_running = nullptr;
__thread __attribute__((tls_model("initial-exec"))) void* t_dynamic_shared = nullptr;

// ---------------------------------------------------------------------------------------------
// Fiber stack overflow: the guard page faults; say which kernel overflowed before the process
// dies (a bare SIGSEGV on a stream thread says nothing). Not under ASan, which reports stack
// overflows itself.

#if !defined(SATDAR_SIM_ASAN)
struct sigaction g_prev_segv;

void OnSegv(int sig, siginfo_t* info, void* uctx) {
  const ThreadState* ts = t_running;
  if (ts != nullptr && ts->current != nullptr && ts->job != nullptr) {
    const char* addr = static_cast<const char*>(info->si_addr);
    const Stack& st = *ts->current->stack;
    if (addr >= st.map && addr < st.lo) {
      char buf[512];
      const uint3 b = internal::g_block_idx, t = ts->current->tid;
      const int len = std::snprintf(
          buf, sizeof(buf),
          "satdar cuda simulator: kernel '%s' block (%u,%u,%u) thread (%u,%u,%u) overflowed its "
          "%zu KiB fiber stack (SATDAR_SIM_STACK_KB sets the size)\n",
          ts->job->name.c_str(), b.x, b.y, b.z, t.x, t.y, t.z,
          static_cast<size_t>(st.hi - st.lo) / 1024);
      if (len > 0) (void)!write(2, buf, static_cast<size_t>(std::min<int>(len, sizeof(buf) - 1)));
    }
  }
  // Hand the fault on: to the previous handler, or to the default action when the faulting
  // access runs again.
  if ((g_prev_segv.sa_flags & SA_SIGINFO) != 0 && g_prev_segv.sa_sigaction != nullptr) {
    g_prev_segv.sa_sigaction(sig, info, uctx);
  } else if (g_prev_segv.sa_handler != SIG_DFL && g_prev_segv.sa_handler != SIG_IGN) {
    g_prev_segv.sa_handler(sig);
  } else {
    signal(SIGSEGV, SIG_DFL);
  }
}

// Once per process the handler; once per host thread a signal stack (the handler cannot run
// on the stack that overflowed).
void InstallOverflowReport(ThreadState& ts) {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = &OnSegv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGSEGV, &sa, &g_prev_segv) == 0;
  }();
  if (!installed || ts.alt_stack != nullptr) return;
  stack_t old{};
  if (sigaltstack(nullptr, &old) != 0 || (old.ss_flags & SS_DISABLE) == 0) return;
  constexpr size_t kAltBytes = 64 * 1024;
  ts.alt_stack.reset(new char[kAltBytes]);
  stack_t ss{};
  ss.ss_sp = ts.alt_stack.get();
  ss.ss_size = kAltBytes;
  if (sigaltstack(&ss, nullptr) != 0) ts.alt_stack.reset();
}
#else
void InstallOverflowReport(ThreadState&) {}
#endif

bool EnsureStacks(ThreadState& ts, unsigned n) {
  if (ts.stacks.empty()) InstallOverflowReport(ts);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = StackBytes();
  while (ts.stacks.size() < n) {
    Stack s;
    s.map_bytes = bytes + page;
    void* p = mmap(nullptr, s.map_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    s.map = static_cast<char*>(p);
    // The guard page below the stack turns an overflow into a fault at the overflowing frame.
    if (mprotect(s.map, page, PROT_NONE) != 0) {
      munmap(s.map, s.map_bytes);
      return false;
    }
    s.lo = s.map + page;
    s.hi = s.map + s.map_bytes;
    ts.stacks.push_back(s);
  }
  return true;
}

std::string Hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

std::string Dim(uint3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

std::string Where(const ThreadState& ts) {
  return "kernel '" + ts.job->name + "' block " + Dim(internal::g_block_idx);
}

// Scheduler -> fiber.
void Resume(ThreadState& ts, Fiber& f) {
  ts.current = &f;
  internal::g_thread_idx = f.tid;
#if defined(SATDAR_SIM_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack->lo,
                                 static_cast<size_t>(f.stack->hi - f.stack->lo));
  SwitchFiber(&ts.sched, &f.ctx);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  SwitchFiber(&ts.sched, &f.ctx);
#endif
  ts.current = nullptr;
}

// Fiber -> scheduler; returns when the scheduler resumes this fiber.
void Yield(ThreadState& ts, Fiber& f) {
#if defined(SATDAR_SIM_ASAN)
  __sanitizer_start_switch_fiber(&f.fake_stack, ts.sched_stack_bottom, ts.sched_stack_size);
  SwitchFiber(&f.ctx, &ts.sched);
  __sanitizer_finish_switch_fiber(f.fake_stack, &ts.sched_stack_bottom, &ts.sched_stack_size);
#else
  SwitchFiber(&f.ctx, &ts.sched);
#endif
}

void FiberMain(void* arg) {
  auto* f = static_cast<Fiber*>(arg);
  ThreadState& ts = *t_running;
#if defined(SATDAR_SIM_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &ts.sched_stack_bottom, &ts.sched_stack_size);
#endif
  ts.job->body();
  f->state = FiberState::kDone;
#if defined(SATDAR_SIM_ASAN)
  // nullptr: this fiber is finished, so ASan may drop its fake stack.
  __sanitizer_start_switch_fiber(nullptr, ts.sched_stack_bottom, ts.sched_stack_size);
#endif
  SwitchFiber(&f->ctx, &ts.sched);
  __builtin_unreachable();
}

// Records a misuse found inside the block; the scheduler stops the block after this fiber
// yields.
void Fail(ThreadState& ts, const std::string& what) {
  if (ts.failed) return;
  ts.failed = true;
  ts.failure = Where(ts) + ": " + what;
}

// Fails the block from the running fiber and leaves it for good: it is never resumed, and its
// stack is reset before reuse.
[[noreturn]] void AbortFiber(ThreadState& ts, Fiber& f, const std::string& what) {
  Fail(ts, what);
  f.state = FiberState::kAborted;
  Yield(ts, f);
  std::abort();  // never resumed
}

void ShuffleOrder(ThreadState& ts, std::mt19937_64& rng) {
  std::shuffle(ts.order.begin(), ts.order.end(), rng);
}

// ---------------------------------------------------------------------------------------------
// Warp collectives.

// Whether every live lane in `leader`'s mask has posted the same collective. Lanes that
// exited (or do not exist in a partial last warp) do not take part, as on the device.
bool GroupReady(ThreadState& ts, unsigned warp_base, const Fiber& leader) {
  for (unsigned l = 0; l < kWarpSize; ++l) {
    if (!(leader.mask >> l & 1u) || warp_base + l >= ts.threads) continue;
    const Fiber& g = ts.fibers[warp_base + l];
    if (g.state == FiberState::kDone) continue;
    if (g.state != FiberState::kWarp) return false;
    if (g.op != leader.op || g.mask != leader.mask) {
      Fail(ts, "threads " + std::to_string(leader.linear) + " and " + std::to_string(g.linear) +
                   " of one warp meet at different warp collectives or masks (" +
                   Hex(leader.mask) + " vs " + Hex(g.mask) + ")");
      return false;
    }
  }
  return true;
}

// Whether every live lane of `mask` in the warp at `warp_base` has posted.
bool AllPosted(const ThreadState& ts, unsigned warp_base, unsigned mask) {
  const unsigned w = warp_base / kWarpSize;
  return (mask & ts.warp_live[w] & ~ts.warp_posted[w]) == 0;
}

// Computes every posted lane's result and makes those lanes runnable.
void CompleteGroup(ThreadState& ts, unsigned warp_base, const Fiber& leader) {
  const unsigned mask = leader.mask;
  uint32_t ballot = 0;
  for (unsigned l = 0; l < kWarpSize; ++l) {
    if (!(mask >> l & 1u) || warp_base + l >= ts.threads) continue;
    const Fiber& g = ts.fibers[warp_base + l];
    if (g.state == FiberState::kWarp && g.value != 0) ballot |= 1u << l;
  }
  for (unsigned l = 0; l < kWarpSize; ++l) {
    if (!(mask >> l & 1u) || warp_base + l >= ts.threads) continue;
    Fiber& g = ts.fibers[warp_base + l];
    if (g.state != FiberState::kWarp) continue;
    switch (g.op) {
      case WarpOp::kSync:
        g.result = 0;
        break;
      case WarpOp::kBallot:
        g.result = ballot;
        break;
      case WarpOp::kShflXor: {
        // PTX shfl.bfly: a source past the end of this lane's width-segment reads its own value.
        const unsigned seg = (kWarpSize - static_cast<unsigned>(g.width)) & 31u;
        const unsigned max_lane = (l & seg) | (31u & ~seg);
        unsigned src = l ^ (static_cast<unsigned>(g.lane_mask) & 31u);
        if (src > max_lane) src = l;
        const unsigned src_idx = warp_base + src;
        if (!(mask >> src & 1u) || src_idx >= ts.threads ||
            ts.fibers[src_idx].state != FiberState::kWarp) {
          Fail(ts, "__shfl_xor_sync in thread " + std::to_string(g.linear) + " reads lane " +
                       std::to_string(src) +
                       ", which is not in the mask or has exited (undefined on the device)");
          return;
        }
        g.result = ts.fibers[src_idx].value;
        break;
      }
    }
  }
  for (unsigned l = 0; l < kWarpSize; ++l) {
    if (!(mask >> l & 1u) || warp_base + l >= ts.threads) continue;
    Fiber& g = ts.fibers[warp_base + l];
    if (g.state == FiberState::kWarp) {
      g.state = FiberState::kRunnable;
      ts.warp_posted[warp_base / kWarpSize] &= ~(1u << l);
    }
  }
}

// After thread `exited` exits, collectives of its warp waiting only on it may now be complete.
void RecheckWarp(ThreadState& ts, unsigned exited) {
  const unsigned warp_base = exited - exited % kWarpSize, w = exited / kWarpSize;
  ts.warp_live[w] &= ~(1u << (exited % kWarpSize));
  if (ts.warp_posted[w] == 0) return;
  for (unsigned l = 0; l < kWarpSize && warp_base + l < ts.threads && !ts.failed; ++l) {
    if (!(ts.warp_posted[w] >> l & 1u)) continue;
    const Fiber& g = ts.fibers[warp_base + l];
    if (g.state == FiberState::kWarp && AllPosted(ts, warp_base, g.mask) &&
        GroupReady(ts, warp_base, g)) {
      const Fiber leader = g;  // CompleteGroup changes g's state
      CompleteGroup(ts, warp_base, leader);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One block.

// Describes a block in which no fiber can run although some have not finished.
std::string DescribeStuck(const ThreadState& ts) {
  unsigned done = 0, barrier = 0, warp = 0;
  uint64_t min_b = UINT64_MAX, max_b = 0;
  int first_done = -1, first_barrier = -1, first_warp = -1;
  for (unsigned i = 0; i < ts.threads; ++i) {
    const Fiber& f = ts.fibers[i];
    if (f.state == FiberState::kDone) {
      ++done;
      if (first_done < 0) first_done = static_cast<int>(i);
    } else if (f.state == FiberState::kBarrier) {
      ++barrier;
      if (first_barrier < 0) first_barrier = static_cast<int>(i);
      min_b = std::min(min_b, f.barriers);
      max_b = std::max(max_b, f.barriers);
    } else if (f.state == FiberState::kWarp) {
      ++warp;
      if (first_warp < 0) first_warp = static_cast<int>(i);
    }
  }
  std::string s = "divergent __syncthreads: " + std::to_string(barrier) + " of " +
                  std::to_string(ts.threads) + " threads wait at a barrier";
  if (barrier > 0) {
    s += " (e.g. thread " + std::to_string(first_barrier) + ", at barrier #" +
         std::to_string(min_b) + (min_b != max_b ? " to #" + std::to_string(max_b) : "") + ")";
  }
  if (done > 0) {
    s += ", " + std::to_string(done) + " exited without reaching it (e.g. thread " +
         std::to_string(first_done) + ")";
  }
  if (warp > 0) {
    s += ", " + std::to_string(warp) + " wait in a warp collective whose lanes never arrive " +
         "(e.g. thread " + std::to_string(first_warp) + ")";
  }
  return s;
}

// Whether every fiber of the block waits at the same barrier; then releases them.
bool ReleaseBarrier(ThreadState& ts) {
  const uint64_t count = ts.fibers[0].barriers;
  for (unsigned i = 0; i < ts.threads; ++i) {
    const Fiber& f = ts.fibers[i];
    if (f.state != FiberState::kBarrier || f.barriers != count) return false;
  }
  for (unsigned i = 0; i < ts.threads; ++i) ts.fibers[i].state = FiberState::kRunnable;
  return true;
}

void ResetStacksAfterAbort(ThreadState& ts) {
#if defined(SATDAR_SIM_ASAN)
  // Abandoned frames leave poisoned redzones on the stacks they were using.
  for (unsigned i = 0; i < ts.threads; ++i) {
    Stack& s = ts.stacks[i];
    __asan_unpoison_memory_region(s.lo, static_cast<size_t>(s.hi - s.lo));
  }
#else
  (void)ts;
#endif
}

// Runs block number `b` of the job on this host thread; false (and the reason in
// ts.failure) if it failed.
bool RunBlock(GridJob& job, uint64_t b) {
  ThreadState& ts = t_state;
  t_running = &ts;
  const unsigned n = job.block.x * job.block.y * job.block.z;
  ts.job = &job;
  ts.threads = n;
  ts.failed = false;
  ts.failure.clear();
  internal::g_grid_dim = job.grid;
  internal::g_block_dim = job.block;
  internal::g_block_idx = uint3{static_cast<unsigned>(b % job.grid.x),
                                static_cast<unsigned>(b / job.grid.x % job.grid.y),
                                static_cast<unsigned>(b / job.grid.x / job.grid.y)};
  if (!EnsureStacks(ts, n)) {
    Fail(ts, "cannot map " + std::to_string(n) + " fiber stacks");
    return false;
  }
  if (job.smem > 0) {
    ts.dynamic_shared.reset(new char[job.smem]);
    std::memset(ts.dynamic_shared.get(), 0xff, job.smem);
  }
  t_dynamic_shared = ts.dynamic_shared.get();

  if (ts.fibers.size() < n) ts.fibers.resize(n);
  ts.order.resize(n);
  const unsigned warps = (n + kWarpSize - 1) / kWarpSize;
  ts.warp_live.assign(warps, ~0u);
  if (n % kWarpSize != 0) ts.warp_live[warps - 1] = (1u << (n % kWarpSize)) - 1;
  ts.warp_posted.assign(warps, 0u);
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = ts.fibers[i];
    f = Fiber();
    f.stack = &ts.stacks[i];
    f.linear = i;
    f.tid = uint3{i % job.block.x, i / job.block.x % job.block.y, i / job.block.x / job.block.y};
    // Offsetting each stack top by a different cache line keeps the fibers' saved registers
    // out of one L1 set (the stacks are all page aligned).
    MakeFiberContext(&f.ctx, f.stack->lo, f.stack->hi - (i % 32) * 64, &FiberMain, &f);
    ts.order[i] = job.order == FiberOrder::kReverse ? n - 1 - i : i;
  }
  std::mt19937_64 rng(job.seed ^ (b * 0x9e3779b97f4a7c15ull));
  if (job.order == FiberOrder::kShuffle) ShuffleOrder(ts, rng);

  bool ok = true;
  uint64_t resumes = 0;
  for (;;) {
    bool ran = false;
    for (unsigned idx : ts.order) {
      Fiber& f = ts.fibers[idx];
      if (f.state != FiberState::kRunnable) continue;
      Resume(ts, f);
      ++resumes;
      ran = true;
      if (f.state == FiberState::kDone) RecheckWarp(ts, idx);
      if (ts.failed) break;
    }
    if (ts.failed) {
      ok = false;
      break;
    }
    if (ran) continue;
    bool all_done = true;
    for (unsigned i = 0; i < n && all_done; ++i) all_done = ts.fibers[i].state == FiberState::kDone;
    if (all_done) break;
    if (ReleaseBarrier(ts)) {
      if (job.order == FiberOrder::kShuffle) ShuffleOrder(ts, rng);
      continue;
    }
    Fail(ts, DescribeStuck(ts));
    ok = false;
    break;
  }
  if (!ok) ResetStacksAfterAbort(ts);
  job.resumes.fetch_add(resumes, std::memory_order_relaxed);
  ts.dynamic_shared.reset();
  t_dynamic_shared = nullptr;
  t_running = nullptr;
  return ok;
}

// ---------------------------------------------------------------------------------------------
// The pool.

class Pool {
 public:
  explicit Pool(unsigned workers) {
    for (unsigned i = 0; i < workers; ++i) std::thread([this] { Work(); }).detach();
    workers_ = workers;
  }

  unsigned workers() const { return workers_; }

  void Add(const std::shared_ptr<GridJob>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(job);
    }
    cv_.notify_all();
  }

  void Remove(const std::shared_ptr<GridJob>& job) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(jobs_.begin(), jobs_.end(), job);
    if (it != jobs_.end()) jobs_.erase(it);
  }

 private:
  void Work() {
    for (;;) {
      std::shared_ptr<GridJob> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !jobs_.empty(); });
        job = jobs_.front();
      }
      RunBlocks(*job);
      Remove(job);  // its blocks are all taken
    }
  }

 public:
  // Takes blocks of `job` until none is left.
  static void RunBlocks(GridJob& job) {
    for (;;) {
      const uint64_t b = job.next.fetch_add(1, std::memory_order_relaxed);
      if (b >= job.total) return;
      if (!job.failed.load(std::memory_order_relaxed) && !RunBlock(job, b)) {
        // The first failing block reports; the rest of the grid is skipped, as a fault
        // ends a kernel on the device.
        if (!job.failed.exchange(true)) Report(t_state.failure);
      }
      if (job.finished.fetch_add(1, std::memory_order_acq_rel) + 1 == job.total) {
        std::lock_guard<std::mutex> lock(job.mu);
        job.done_cv.notify_all();
      }
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GridJob>> jobs_;
  unsigned workers_ = 0;
};

Pool& ThePool() {
  // Never destroyed: detached workers may still wait on it at exit.
  static Pool* pool = [] {
    unsigned n = std::thread::hardware_concurrency();
    if (const char* env = std::getenv("SATDAR_SIM_THREADS"); env != nullptr && *env != '\0') {
      n = static_cast<unsigned>(std::strtoul(env, nullptr, 10));
    }
    if (n == 0) n = 1;
    return new Pool(n - 1);  // the launching stream's thread is the n-th
  }();
  return *pool;
}

cudaError_t RunGrid(const std::shared_ptr<GridJob>& job) {
  Profiler* const profiler = Profiler::Get();
  const auto start = std::chrono::steady_clock::now();
  if (job->total > 1 && ThePool().workers() > 0) ThePool().Add(job);
  Pool::RunBlocks(*job);
  {
    std::unique_lock<std::mutex> lock(job->mu);
    job->done_cv.wait(lock, [&] { return job->finished.load() == job->total; });
  }
  if (job->total > 1) ThePool().Remove(job);
  if (profiler != nullptr) {
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    profiler->Add(job->name, job->total,
                  job->total * uint64_t{job->block.x} * job->block.y * job->block.z,
                  job->resumes.load(), took.count());
  }
  return job->failed.load() ? cudaErrorLaunchFailure : cudaSuccess;
}

}  // namespace

void SetFiberOrder(FiberOrder order, uint64_t seed) {
  g_seed.store(seed);
  g_order.store(static_cast<int>(order), std::memory_order_release);
}

void* DynamicShared() { return t_dynamic_shared; }

namespace internal {

cudaError_t LaunchGrid(const char* name, dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, std::function<void()> body) {
  ReadOrderFromEnv();
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  cudaError_t err = cudaSuccess;
  if (threads == 0 || threads > kMaxThreads || blocks == 0) {
    err = cudaErrorInvalidConfiguration;
  } else {
    auto job = std::make_shared<GridJob>();
    job->name = name != nullptr ? name : "?";
    job->grid = grid;
    job->block = block;
    job->smem = smem;
    job->body = std::move(body);
    job->order = static_cast<FiberOrder>(g_order.load(std::memory_order_acquire));
    job->seed = g_seed.load();
    job->total = blocks;
    err = Enqueue(stream, [job]() { return RunGrid(job); });
  }
  if (err != cudaSuccess) SetLastError(err);
  return cudaGetLastError();
}

void SyncThreads() {
  ThreadState& ts = *t_running;
  Fiber& f = *ts.current;
  ++f.barriers;
  f.state = FiberState::kBarrier;
  Yield(ts, f);
}

uint32_t WarpCollective(WarpOp op, unsigned mask, uint32_t value, int lane_mask, int width) {
  ThreadState& ts = *t_running;
  Fiber& f = *ts.current;
  const unsigned lane = f.linear % kWarpSize;
  const unsigned warp_base = f.linear - lane;
  if (!(mask >> lane & 1u)) {
    AbortFiber(ts, f,
               "thread " + std::to_string(f.linear) + " calls a warp collective with mask " +
                   Hex(mask) + " that lacks its own lane " + std::to_string(lane));
  }
  if (op == WarpOp::kShflXor && (width < 1 || width > 32 || (width & (width - 1)) != 0)) {
    AbortFiber(ts, f, "__shfl_xor_sync width " + std::to_string(width) +
                          " is not a power of two in [1, 32]");
  }
  f.op = op;
  f.mask = mask;
  f.value = value;
  f.lane_mask = lane_mask;
  f.width = width;
  f.state = FiberState::kWarp;
  ts.warp_posted[warp_base / kWarpSize] |= 1u << lane;
  if (AllPosted(ts, warp_base, mask) && GroupReady(ts, warp_base, f)) {
    CompleteGroup(ts, warp_base, f);
  }
  if (ts.failed) AbortFiber(ts, f, "");
  if (f.state == FiberState::kWarp) Yield(ts, f);  // until the last lane completes the group
  return f.result;
}

}  // namespace internal
}  // namespace satdar::cuda_sim
