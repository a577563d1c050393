#include "core/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace satdar::core {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 10, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    for (auto& h : hits) h = 0;
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, RespectsMinChunkAndRepeats) {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  pool.ParallelFor(10, [&](int64_t, int64_t) { calls++; }, 100);
  EXPECT_EQ(calls, 1);
  int64_t total = 0;
  for (int r = 0; r < 200; ++r) {
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(100, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    total += sum;
  }
  EXPECT_EQ(total, 200 * 4950);
}

}  // namespace
}  // namespace satdar::core
