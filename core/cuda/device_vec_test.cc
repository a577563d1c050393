// DeviceVec / DevicePtrList / AllocScope (core/cuda/device_vec.h) on a real device: sizing as
// std::vector (kept contents, zero fill, shrink), fills by memset and by kernel, deep copies and
// cheap moves, nested scopes and the allocator each block goes back to, failures recorded by
// the scope, and a pointer list read back from the device. Work runs on a non-blocking stream
// and every host read synchronises it first. Skips without a CUDA build or without a GPU.
// Tolerances: none (exact values and bits).
#include "core/cuda/device_vec.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/exec.h"
#include "gtest/gtest.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

namespace satdar::core::cuda {
namespace {

#ifdef SATDAR_WITH_CUDA

// An allocator backend whose every request fails, as a device out of memory would.
class FailingBackend : public AllocatorBackend {
 public:
  absl::StatusOr<void*> Allocate(size_t /*bytes*/) override {
    ++attempts;
    return absl::ResourceExhaustedError("fake out of memory");
  }
  void Release(void* /*ptr*/) override {}
  int attempts = 0;
};

// A stream, an allocator on the device and the CudaExec that names both.
class DeviceVecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!BuiltWithCuda() || DeviceCount() == 0) return;  // the test body skips
    absl::StatusOr<Stream> s = Stream::Create();
    ASSERT_TRUE(s.ok()) << s.status();
    stream_ = std::move(*s);
    x_ = CudaExec{stream_.get(), nullptr, nullptr, &alloc_};
  }

  // The contents of v, after the stream's work is done.
  template <typename U>
  std::vector<U> ToHost(const DeviceVec<U>& v) {
    EXPECT_TRUE(stream_.Synchronize().ok());
    std::vector<U> out(v.size());
    if (!out.empty()) {
      EXPECT_EQ(cudaMemcpy(out.data(), v.data(), v.size() * sizeof(U), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return out;
  }

  // v = host (resize, then a copy on the stream).
  template <typename U>
  void Upload(DeviceVec<U>* v, const std::vector<U>& host) {
    v->resize(host.size());
    ASSERT_EQ(v->size(), host.size());
    ASSERT_EQ(cudaMemcpyAsync(v->data(), host.data(), host.size() * sizeof(U),
                              cudaMemcpyHostToDevice, stream_.get()),
              cudaSuccess);
    ASSERT_TRUE(stream_.Synchronize().ok());
  }

  CachingAllocator alloc_;
  Stream stream_;
  CudaExec x_;
};

// Bits of a bf16, for exact comparisons.
uint16_t Bits(__nv_bfloat16 b) {
  uint16_t u;
  std::memcpy(&u, &b, sizeof(u));
  return u;
}

TEST_F(DeviceVecTest, ResizeKeepsContentsAndZeroFills) {
  SATDAR_SKIP_WITHOUT_GPU();
  AllocScope scope(x_);
  DeviceVec<float> v;
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.data(), nullptr);
  v.resize(4);
  EXPECT_EQ(ToHost(v), std::vector<float>(4, 0.0f));
  Upload(&v, {1.0f, 2.0f, 3.0f, 4.0f});
  v.resize(7);  // grow: old elements kept, new ones zero
  EXPECT_EQ(ToHost(v), (std::vector<float>{1, 2, 3, 4, 0, 0, 0}));
  v.resize(2);  // shrink
  EXPECT_EQ(ToHost(v), (std::vector<float>{1, 2}));
  v.resize(5);  // grow again: the dropped elements come back as zeros
  EXPECT_EQ(ToHost(v), (std::vector<float>{1, 2, 0, 0, 0}));
  v.resize(0);
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.data(), nullptr);
  EXPECT_TRUE(scope.status().ok()) << scope.status();
}

TEST_F(DeviceVecTest, AssignZeroAndValue) {
  SATDAR_SKIP_WITHOUT_GPU();
  AllocScope scope(x_);

  DeviceVec<float> f;
  f.assign(5, 3.5f);  // fill kernel
  EXPECT_EQ(ToHost(f), std::vector<float>(5, 3.5f));
  f.assign(5, 0.0f);  // same size: the block is reused and memset
  EXPECT_EQ(ToHost(f), std::vector<float>(5, 0.0f));
  f.assign(3, -2.25f);
  EXPECT_EQ(ToHost(f), std::vector<float>(3, -2.25f));
  f.assign(2, -0.0f);  // not all zero bits: the kernel, and the sign survives
  const std::vector<float> neg_zero = ToHost(f);
  ASSERT_EQ(neg_zero.size(), 2u);
  EXPECT_TRUE(std::signbit(neg_zero[0]) && std::signbit(neg_zero[1]));

  DeviceVec<__nv_bfloat16> h;
  h.assign(4, __float2bfloat16(1.5f));
  const std::vector<__nv_bfloat16> hb = ToHost(h);
  ASSERT_EQ(hb.size(), 4u);
  for (const __nv_bfloat16& e : hb) EXPECT_EQ(Bits(e), Bits(__float2bfloat16(1.5f)));
  h.assign(4, __float2bfloat16(0.0f));
  for (const __nv_bfloat16& e : ToHost(h)) EXPECT_EQ(Bits(e), 0u);

  DeviceVec<int> i;
  i.assign(6, 7);
  EXPECT_EQ(ToHost(i), std::vector<int>(6, 7));
  i.assign(6, 0);
  EXPECT_EQ(ToHost(i), std::vector<int>(6, 0));

  DeviceVec<int64_t> l;  // the 8-byte kernel
  l.assign(3, int64_t{0x0102030405060708});
  EXPECT_EQ(ToHost(l), std::vector<int64_t>(3, int64_t{0x0102030405060708}));
  DeviceVec<double> d;
  d.assign(2, 0.125);
  EXPECT_EQ(ToHost(d), std::vector<double>(2, 0.125));
  DeviceVec<const float*> p;
  p.assign(3, f.data());
  EXPECT_EQ(ToHost(p), std::vector<const float*>(3, f.data()));
  p.assign(3, nullptr);
  EXPECT_EQ(ToHost(p), std::vector<const float*>(3, nullptr));
  EXPECT_TRUE(scope.status().ok()) << scope.status();
}

TEST_F(DeviceVecTest, CopyMoveAndSwap) {
  SATDAR_SKIP_WITHOUT_GPU();
  {
    // Copying an empty vector needs no scope.
    DeviceVec<float> none;
    DeviceVec<float> copy(none);
    EXPECT_TRUE(copy.empty());
  }
  AllocScope scope(x_);
  DeviceVec<float> a;
  Upload(&a, {1.0f, 2.0f, 3.0f});

  DeviceVec<float> b(a);  // deep copy
  EXPECT_NE(b.data(), a.data());
  DeviceVec<float> c;
  c.assign(9, 4.0f);
  c = a;  // copy assignment replaces size and contents
  a.assign(3, 9.0f);
  EXPECT_EQ(ToHost(b), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(ToHost(c), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(ToHost(a), std::vector<float>(3, 9.0f));

  const float* block = a.data();
  DeviceVec<float> moved(std::move(a));  // the block itself moves
  EXPECT_EQ(moved.data(), block);
  EXPECT_EQ(moved.size(), 3u);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(a.data(), nullptr);
  DeviceVec<float> target;
  target.assign(2, 5.0f);
  target = std::move(moved);
  EXPECT_EQ(target.data(), block);
  EXPECT_EQ(ToHost(target), std::vector<float>(3, 9.0f));

  b.swap(target);
  EXPECT_EQ(b.data(), block);
  EXPECT_EQ(ToHost(b), std::vector<float>(3, 9.0f));
  EXPECT_EQ(ToHost(target), (std::vector<float>{1, 2, 3}));
  swap(b, target);  // the free function (std::swap-style call sites)
  EXPECT_EQ(target.data(), block);
  EXPECT_TRUE(scope.status().ok()) << scope.status();
}

TEST_F(DeviceVecTest, VectorOfVecsAssignThenResize) {
  SATDAR_SKIP_WITHOUT_GPU();
  AllocScope scope(x_);
  std::vector<DeviceVec<float>> vs;
  vs.assign(3, DeviceVec<float>());
  ASSERT_EQ(vs.size(), 3u);
  for (size_t k = 0; k < vs.size(); ++k) {
    EXPECT_TRUE(vs[k].empty());
    vs[k].resize(k + 1);
  }
  for (size_t k = 0; k < vs.size(); ++k) {
    EXPECT_EQ(ToHost(vs[k]), std::vector<float>(k + 1, 0.0f));
    for (size_t j = 0; j < k; ++j) EXPECT_NE(vs[k].data(), vs[j].data());
  }
  EXPECT_TRUE(scope.status().ok()) << scope.status();
}

TEST_F(DeviceVecTest, ScopesNestAndBlocksGoBackWhereTheyCameFrom) {
  SATDAR_SKIP_WITHOUT_GPU();
  CachingAllocator inner_alloc;
  AllocScope outer(x_);
  DeviceVec<float> from_outer;
  from_outer.resize(100);
  {
    AllocScope inner(CudaExec{stream_.get(), nullptr, nullptr, &inner_alloc});
    EXPECT_EQ(AllocScope::Current(), &inner);
    DeviceVec<float> from_inner;
    from_inner.resize(300);
    EXPECT_GT(inner_alloc.Stats().current_bytes, 0);
    from_outer.resize(200);  // the innermost scope's allocator serves the new block
    EXPECT_EQ(ToHost(from_outer), std::vector<float>(200, 0.0f));
    EXPECT_EQ(alloc_.Stats().current_bytes, 0);  // the old block went back to its allocator
    EXPECT_TRUE(inner.status().ok()) << inner.status();
  }  // from_inner is freed to inner_alloc, no scope needed
  EXPECT_EQ(AllocScope::Current(), &outer);
  EXPECT_EQ(inner_alloc.Stats().current_bytes,
            static_cast<int64_t>(CachingAllocator::RoundSize(200 * sizeof(float))));
  from_outer.clear();
  EXPECT_EQ(inner_alloc.Stats().current_bytes, 0);
  from_outer.resize(10);  // the outer scope again
  EXPECT_GT(alloc_.Stats().current_bytes, 0);
  EXPECT_TRUE(outer.status().ok()) << outer.status();
}

TEST_F(DeviceVecTest, FailureIsRecordedAndLeavesTheVectorEmpty) {
  SATDAR_SKIP_WITHOUT_GPU();
  FailingBackend backend;
  CachingAllocator failing(&backend);
  AllocScope outer(x_);
  DeviceVec<float> v;
  Upload(&v, {1.0f, 2.0f});
  DeviceVec<int> w;
  w.assign(4, 1);
  {
    AllocScope inner(CudaExec{stream_.get(), nullptr, nullptr, &failing});
    v.resize(1000);
    EXPECT_TRUE(v.empty());
    EXPECT_EQ(v.data(), nullptr);
    EXPECT_EQ(alloc_.Stats().current_bytes,  // v's old block was freed, w's remains
              static_cast<int64_t>(CachingAllocator::RoundSize(4 * sizeof(int))));
    EXPECT_EQ(inner.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(inner.status().message().find("DeviceVec::resize"), absl::string_view::npos)
        << inner.status();
    w.assign(8, 2);  // a second failure: w empty, the first one is what the scope keeps
    EXPECT_TRUE(w.empty());
    EXPECT_NE(inner.status().message().find("DeviceVec::resize"), absl::string_view::npos)
        << inner.status();
    EXPECT_GT(backend.attempts, 0);
  }
  EXPECT_TRUE(outer.status().ok()) << outer.status();  // failures stay in the inner scope
  v.resize(3);  // the outer scope's allocator works again
  EXPECT_EQ(ToHost(v), std::vector<float>(3, 0.0f));
}

TEST_F(DeviceVecTest, PtrListPublishesToTheDevice) {
  SATDAR_SKIP_WITHOUT_GPU();
  AllocScope scope(x_);
  std::vector<DeviceVec<float>> bufs(5);
  for (size_t k = 0; k < bufs.size(); ++k) bufs[k].assign(2, static_cast<float>(k + 1));

  DevicePtrList<const float*> list;
  EXPECT_EQ(list.data(), nullptr);
  for (size_t k = 0; k < 3; ++k) list.push_back(bufs[k].data());
  ASSERT_TRUE(list.Publish(x_).ok());
  const std::vector<const float*> first = {bufs[0].data(), bufs[1].data(), bufs[2].data()};
  list[0] = nullptr;  // the host entries may change as soon as Publish returns
  ASSERT_TRUE(stream_.Synchronize().ok());
  std::vector<const float*> back(3);
  ASSERT_EQ(cudaMemcpy(back.data(), list.data(), 3 * sizeof(const float*), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, first);

  // Growing the list past the first block's allocator bucket (512 bytes) grows its device
  // copy; the entries point at the buffers.
  constexpr size_t kLong = 100;
  list.assign(kLong, nullptr);
  for (size_t k = 0; k < kLong; ++k) list[k] = bufs[4 - k % 5].data();
  EXPECT_EQ(list.size(), kLong);
  ASSERT_TRUE(list.Publish(x_).ok());
  ASSERT_TRUE(stream_.Synchronize().ok());
  back.resize(kLong);
  ASSERT_EQ(cudaMemcpy(back.data(), list.data(), kLong * sizeof(const float*),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (size_t k = 0; k < kLong; ++k) {
    EXPECT_EQ(back[k], bufs[4 - k % 5].data());
    float value = 0.0f;
    ASSERT_EQ(cudaMemcpy(&value, back[k], sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(value, static_cast<float>(5 - k % 5));
  }

  DevicePtrList<float*> no_alloc;
  no_alloc.push_back(nullptr);
  EXPECT_EQ(no_alloc.Publish(CudaExec{stream_.get()}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(scope.status().ok()) << scope.status();
}

#endif  // SATDAR_WITH_CUDA

}  // namespace
}  // namespace satdar::core::cuda
