// core/thread_pool.h: a fixed pool of threads for data-parallel loops in CPU kernels.
//
//   ThreadPool pool(2);
//   pool.ParallelFor(rows, [&](int64_t begin, int64_t end) { ... rows [begin, end) ... });
//
// The range is cut into at most num_threads() contiguous chunks; the calling thread runs the
// first. Work is split the same way every time for a given (n, num_threads), so results are
// reproducible. ParallelFor must not be called from inside a ParallelFor body.
#ifndef SATDAR_CORE_THREAD_POOL_H_
#define SATDAR_CORE_THREAD_POOL_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace satdar::core {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(begin, end) over [0, n) in chunks of at least `min_chunk` items.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t min_chunk = 1);

 private:
  void WorkerLoop(int worker);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;  // guarded by mu_
  int64_t n_ = 0;
  int chunks_ = 0;
  int64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// K sums over [0, n): f(begin, end, acc) adds its range's contributions into acc[0..K).
// The range is cut into num_threads() chunks whose partial sums are added in chunk order, so
// the result depends only on (n, num_threads), never on timing.
template <int K, typename F>
std::array<double, K> ParallelSum(ThreadPool* pool, int64_t n, const F& f) {
  const int chunks = pool->num_threads();
  std::vector<std::array<double, K>> partial(chunks);
  pool->ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      partial[c].fill(0.0);
      f(n * c / chunks, n * (c + 1) / chunks, partial[c].data());
    }
  });
  std::array<double, K> total;
  total.fill(0.0);
  for (const auto& p : partial) {
    for (int k = 0; k < K; ++k) total[k] += p[k];
  }
  return total;
}

}  // namespace satdar::core

#endif  // SATDAR_CORE_THREAD_POOL_H_
