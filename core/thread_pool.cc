#include "core/thread_pool.h"

#include <algorithm>

#include "core/check.h"

namespace satdar::core {

namespace {
// Chunk c of `chunks` over [0, n).
inline void ChunkRange(int64_t n, int chunks, int c, int64_t* begin, int64_t* end) {
  *begin = n * c / chunks;
  *end = n * (c + 1) / chunks;
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int worker) {
  int64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
      chunks = chunks_;
    }
    if (worker < chunks) {
      int64_t begin, end;
      ChunkRange(n, chunks, worker, &begin, &end);
      (*fn)(begin, end);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t min_chunk) {
  if (n <= 0) return;
  int chunks = static_cast<int>(
      std::min<int64_t>(num_threads_, std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk))));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    SATDAR_CHECK(pending_ == 0) << "nested ParallelFor";
    fn_ = &fn;
    n_ = n;
    chunks_ = chunks;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  int64_t begin, end;
  ChunkRange(n, chunks, 0, &begin, &end);
  fn(begin, end);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace satdar::core
