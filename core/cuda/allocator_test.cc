// CachingAllocator and Stream/Event. The bookkeeping (bucket reuse, per-stream free lists,
// current/peak/reserved bytes, retry after a failed allocation) runs on the CPU through a fake
// backend and needs no GPU; the DeviceAllocator/StreamEvent tests use cudaMalloc and skip
// without a CUDA build or without a GPU. Tolerances: none (exact byte counts and pointers).
#include "core/cuda/allocator.h"

#include <cstdlib>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "gtest/gtest.h"

namespace satdar::core::cuda {
namespace {

class FakeBackend : public AllocatorBackend {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (fail_next > 0) {
      --fail_next;
      return absl::ResourceExhaustedError("fake out of memory");
    }
    ++allocs;
    live += static_cast<int64_t>(bytes);
    return std::malloc(bytes);
  }
  void Release(void* ptr) override {
    ++releases;
    std::free(ptr);
  }
  int allocs = 0, releases = 0, fail_next = 0;
  int64_t live = 0;
};

CUstream_st* FakeStream(uintptr_t id) { return reinterpret_cast<CUstream_st*>(id); }

TEST(CachingAllocator, RoundsToBuckets) {
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize((1u << 20) + 1), 2u << 20);
  EXPECT_EQ(CachingAllocator::RoundSize(5u << 20), 6u << 20);
}

TEST(CachingAllocator, ReusesFreedBlockOfSameBucketAndStream) {
  FakeBackend backend;
  CachingAllocator alloc(&backend);
  void* a = *alloc.Allocate(1000);
  ASSERT_TRUE(alloc.Free(a).ok());
  void* b = *alloc.Allocate(1024);  // same 1024-byte bucket
  EXPECT_EQ(a, b);
  EXPECT_EQ(backend.allocs, 1);
  void* c = *alloc.Allocate(1000, FakeStream(0x10));  // other stream: a new block
  EXPECT_NE(c, b);
  EXPECT_EQ(backend.allocs, 2);
  ASSERT_TRUE(alloc.Free(c).ok());
  void* d = *alloc.Allocate(2000, FakeStream(0x10));  // other bucket: a new block
  EXPECT_NE(d, c);
  const AllocatorStats s = alloc.Stats();
  EXPECT_EQ(s.cache_hits, 1);
  EXPECT_EQ(s.device_allocs, 3);
  EXPECT_EQ(s.current_bytes, 1024 + 2048);
  EXPECT_EQ(s.reserved_bytes, 1024 + 1024 + 2048);
  ASSERT_TRUE(alloc.Free(b).ok());
  ASSERT_TRUE(alloc.Free(d).ok());
  EXPECT_EQ(*alloc.Allocate(0), nullptr);
  EXPECT_TRUE(alloc.Free(nullptr).ok());
  int local = 0;
  EXPECT_FALSE(alloc.Free(&local).ok());
}

TEST(CachingAllocator, PeakAccounting) {
  FakeBackend backend;
  CachingAllocator alloc(&backend);
  std::vector<void*> ptrs;
  for (int i = 0; i < 4; ++i) ptrs.push_back(*alloc.Allocate(512));
  EXPECT_EQ(alloc.Stats().current_bytes, 4 * 512);
  EXPECT_EQ(alloc.Stats().peak_bytes, 4 * 512);
  for (void* p : ptrs) ASSERT_TRUE(alloc.Free(p).ok());
  EXPECT_EQ(alloc.Stats().current_bytes, 0);
  EXPECT_EQ(alloc.Stats().peak_bytes, 4 * 512);
  EXPECT_EQ(alloc.Stats().reserved_bytes, 4 * 512);
  alloc.ResetPeak();
  void* p = *alloc.Allocate(3u << 20);  // 4 MiB bucket
  EXPECT_EQ(alloc.Stats().peak_bytes, 4 << 20);
  ASSERT_TRUE(alloc.Free(p).ok());
  alloc.EmptyCache();
  EXPECT_EQ(alloc.Stats().reserved_bytes, 0);
  EXPECT_EQ(backend.releases, 5);
}

TEST(CachingAllocator, EmptiesCacheAndRetriesAfterFailure) {
  FakeBackend backend;
  CachingAllocator alloc(&backend);
  void* a = *alloc.Allocate(4096);
  ASSERT_TRUE(alloc.Free(a).ok());
  backend.fail_next = 1;
  absl::StatusOr<void*> b = alloc.Allocate(8192);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(backend.releases, 1);  // the cached 4096-byte block went back first
  backend.fail_next = 2;
  absl::StatusOr<void*> c = alloc.Allocate(8192 * 2);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(alloc.Free(*b).ok());
}

TEST(CachingAllocator, DeviceAllocator) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA (no nvcc at build time)";
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  CachingAllocator alloc;
  void* a = *alloc.Allocate(3 << 20);
  std::vector<char> host(3 << 20, 7), back(3 << 20, 0);
  ASSERT_TRUE(CopyToDevice(a, host.data(), host.size()).ok());
  ASSERT_TRUE(CopyToHost(back.data(), a, back.size()).ok());
  EXPECT_EQ(host, back);
  ASSERT_TRUE(alloc.Free(a).ok());
  void* b = *alloc.Allocate(4 << 20);
  EXPECT_EQ(a, b);
  EXPECT_EQ(alloc.Stats().device_allocs, 1);
  EXPECT_EQ(alloc.Stats().peak_bytes, 4 << 20);
  ASSERT_TRUE(alloc.Free(b).ok());
}

TEST(CudaStream, StreamEvent) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA (no nvcc at build time)";
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  absl::StatusOr<Stream> compute = Stream::Create();
  absl::StatusOr<Stream> comm = Stream::Create();
  absl::StatusOr<Event> ev = Event::Create();
  ASSERT_TRUE(compute.ok() && comm.ok() && ev.ok());
  ASSERT_TRUE(ev->Record(*compute).ok());
  ASSERT_TRUE(comm->Wait(*ev).ok());
  ASSERT_TRUE(StreamWaitStream(comm->get(), compute->get()).ok());
  ASSERT_TRUE(ev->Synchronize().ok());
  EXPECT_TRUE(*ev->Query());
  ASSERT_TRUE(comm->Synchronize().ok());
  EXPECT_TRUE(*comm->Query());
  Stream moved = std::move(*compute);
  EXPECT_EQ(compute->get(), nullptr);
  EXPECT_NE(moved.get(), nullptr);
}

}  // namespace
}  // namespace satdar::core::cuda
