// Workspace: grows to the largest request, hands the same block to smaller ones, gives the old
// block back to the allocator on growth and the last one on destruction, and passes an
// allocation failure on. Runs on the CPU through a fake allocator backend (no GPU needed).
#include "core/cuda/workspace.h"

#include <cstdint>
#include <cstdlib>

#include "gtest/gtest.h"

namespace satdar::core::cuda {
namespace {

class FakeBackend : public AllocatorBackend {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (fail) return absl::ResourceExhaustedError("fake out of memory");
    ++allocs;
    return std::malloc(bytes);
  }
  void Release(void* ptr) override { std::free(ptr); }
  bool fail = false;
  int allocs = 0;
};

CUstream_st* FakeStream() { return reinterpret_cast<CUstream_st*>(uintptr_t{7}); }

TEST(Workspace, GrowsToTheLargestRequestAndReusesItsBlock) {
  FakeBackend backend;
  CachingAllocator alloc(&backend);
  {
    Workspace ws(&alloc, FakeStream());
    EXPECT_EQ(*ws.Bytes(0), nullptr);
    EXPECT_EQ(ws.capacity(), 0u);
    float* a = *ws.Get<float>(100);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(ws.capacity(), 512u);  // the allocator's smallest bucket
    EXPECT_EQ(*ws.Get<double>(10), static_cast<void*>(a));  // fits: the same block
    EXPECT_EQ(alloc.Stats().current_bytes, 512);
    double* b = *ws.Get<double>(1000);  // 8000 bytes: a new block, the old one freed
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(ws.capacity(), CachingAllocator::RoundSize(8000));
    EXPECT_EQ(alloc.Stats().current_bytes, static_cast<int64_t>(ws.capacity()));
    EXPECT_EQ(*ws.Get<float>(2000), static_cast<void*>(b));
    EXPECT_EQ(backend.allocs, 2);
  }
  EXPECT_EQ(alloc.Stats().current_bytes, 0);  // given back when the workspace goes
}

TEST(Workspace, PassesAnAllocationFailureOn) {
  FakeBackend backend;
  CachingAllocator alloc(&backend);
  Workspace ws(&alloc, FakeStream());
  ASSERT_TRUE(ws.Get<float>(10).ok());
  backend.fail = true;
  absl::StatusOr<float*> big = ws.Get<float>(1 << 20);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ws.capacity(), 0u);  // the old block was given back before the failed request
  backend.fail = false;
  EXPECT_NE(*ws.Get<float>(1 << 20), nullptr);
}

}  // namespace
}  // namespace satdar::core::cuda
