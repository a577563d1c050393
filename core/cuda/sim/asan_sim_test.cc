// core/cuda/sim/asan_sim_test.cc: the sanitizers see kernel bugs in the simulator build
// (--config=sim-san, docs/GPU.md "Sanitizers"). Under AddressSanitizer a kernel that writes one
// element past the end of a cudaMalloc buffer, one that reads past the end of its dynamic shared
// memory, and one that uses a freed buffer die with ASan's report. With SATDAR_SIM_UBSAN (the
// config defines it with -fsanitize=undefined) a signed overflow in a kernel, and an index one
// past a static `__shared__` array, die with UBSan's: ASan cannot see the latter, since
// `__shared__` is a thread_local (prelude.h) and GCC's ASan puts no redzones around
// thread-locals; UBSan's bounds check sees an index past an array of known size.
// The out-of-bounds and overflow cases first run the correct variant of their kernel, which must
// pass cleanly, so the death is the bug's and not the simulator's (fiber stack switches, the
// thread pool). Without the sanitizer a case says it is skipped. Compiled as plain C++ with
// prelude.h force-included, as the simulator build compiles a .cu file; the kernels are
// [[maybe_unused]], since a build without the sanitizers compiles none of the cases.
#include <cuda_runtime.h>

#include <climits>
#include <vector>

#include "core/cuda/launch.h"
#include "core/cuda/sim/kernel_sim.h"
#include "gtest/gtest.h"

#if defined(__SANITIZE_ADDRESS__)
#define SATDAR_SIM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SATDAR_SIM_TEST_ASAN 1
#endif
#endif

namespace satdar::cuda_sim {
namespace {

using ::satdar::core::cuda::Launch;

constexpr int kN = 100;        // elements of the buffers
constexpr int kThreads = 128;  // one block, more threads than elements

// `limit` kN is the correct bound; kN + 1 is the off-by-one that writes out[kN].
[[maybe_unused]] __global__ void WriteKernel(int* out, int limit) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < limit) out[i] = i;
}

// Each thread writes its slot of the dynamic shared memory (one float per thread) and reads
// the slot `shift` to its right: 0 is correct, 1 makes the last thread read one float past the
// end.
[[maybe_unused]] __global__ void SharedReadKernel(float* out, int shift) {
  SATDAR_DYNAMIC_SHARED(float, s);
  const int t = static_cast<int>(threadIdx.x);
  s[t] = static_cast<float>(t);
  __syncthreads();
  out[t] = s[t + shift];
}

// The same with a static `__shared__` array of kSharedFloats floats, indexed directly.
constexpr int kSharedFloats = 64;
[[maybe_unused]] __global__ void StaticSharedReadKernel(float* out, int shift) {
  __shared__ float s[kSharedFloats];
  const int t = static_cast<int>(threadIdx.x);
  s[t] = static_cast<float>(t);
  __syncthreads();
  out[t] = s[t + shift];
}

// Adds `add` to every element; `add` INT_MAX overflows the positive ones.
[[maybe_unused]] __global__ void AddKernel(int* out, int add) {
  const int t = static_cast<int>(threadIdx.x);
  out[t] = out[t] + add;
}

class AsanSimDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // threadsafe: the child re-runs this test alone, with fresh stream and pool threads.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override { cudaStreamDestroy(stream_); }

  // A device buffer of n ints 0, 1, ..., n - 1.
  int* Iota(int n) {
    int* d = nullptr;
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(int)), cudaSuccess);
    std::vector<int> host(n);
    for (int i = 0; i < n; ++i) host[i] = i;
    EXPECT_EQ(cudaMemcpy(d, host.data(), n * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
  std::vector<int> Download(const int* d, int n) {
    std::vector<int> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

  cudaStream_t stream_ = nullptr;
};

TEST_F(AsanSimDeathTest, GlobalWritePastEndIsHeapBufferOverflow) {
#if defined(SATDAR_SIM_TEST_ASAN)
  int* d = Iota(kN);
  ASSERT_EQ(Launch("WriteKernel", WriteKernel, dim3(1), dim3(kThreads), 0, stream_, d, kN),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<int> got = Download(d, kN);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(got[i], i);
  EXPECT_DEATH(
      {
        Launch("WriteKernel", WriteKernel, dim3(1), dim3(kThreads), 0, stream_, d, kN + 1);
        cudaStreamSynchronize(stream_);
      },
      "AddressSanitizer: heap-buffer-overflow.*WRITE of size 4");
  cudaFree(d);
#else
  GTEST_SKIP() << "needs AddressSanitizer: bazel test --config=sim-san //core/cuda/sim:all";
#endif
}

TEST_F(AsanSimDeathTest, DynamicSharedReadPastEndIsHeapBufferOverflow) {
#if defined(SATDAR_SIM_TEST_ASAN)
  constexpr int kShared = 64;  // threads, and floats of dynamic shared memory
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), kShared * sizeof(float)), cudaSuccess);
  ASSERT_EQ(Launch("SharedReadKernel", SharedReadKernel, dim3(2), dim3(kShared),
                   kShared * sizeof(float), stream_, d, 0),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_DEATH(
      {
        Launch("SharedReadKernel", SharedReadKernel, dim3(2), dim3(kShared),
               kShared * sizeof(float), stream_, d, 1);
        cudaStreamSynchronize(stream_);
      },
      "AddressSanitizer: heap-buffer-overflow.*READ of size 4");
  cudaFree(d);
#else
  GTEST_SKIP() << "needs AddressSanitizer: bazel test --config=sim-san //core/cuda/sim:all";
#endif
}

TEST_F(AsanSimDeathTest, KernelOnFreedBufferIsHeapUseAfterFree) {
#if defined(SATDAR_SIM_TEST_ASAN)
  EXPECT_DEATH(
      {
        int* d = Iota(kN);
        cudaFree(d);
        Launch("WriteKernel", WriteKernel, dim3(1), dim3(kThreads), 0, stream_, d, kN);
        cudaStreamSynchronize(stream_);
      },
      "AddressSanitizer: heap-use-after-free.*WRITE of size 4");
#else
  GTEST_SKIP() << "needs AddressSanitizer: bazel test --config=sim-san //core/cuda/sim:all";
#endif
}

TEST_F(AsanSimDeathTest, SignedOverflowInKernelIsCaughtByUbsan) {
#if defined(SATDAR_SIM_UBSAN)
  int* d = Iota(kN);
  ASSERT_EQ(Launch("AddKernel", AddKernel, dim3(1), dim3(kN), 0, stream_, d, -1), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(Download(d, kN)[kN - 1], kN - 2);
  EXPECT_DEATH(
      {
        Launch("AddKernel", AddKernel, dim3(1), dim3(kN), 0, stream_, d, INT_MAX);
        cudaStreamSynchronize(stream_);
      },
      "runtime error: signed integer overflow: [0-9]+ \\+ 2147483647");
  cudaFree(d);
#else
  GTEST_SKIP() << "needs UBSan and SATDAR_SIM_UBSAN: bazel test --config=sim-san "
                  "//core/cuda/sim:all";
#endif
}

TEST_F(AsanSimDeathTest, StaticSharedIndexPastEndIsCaughtByUbsan) {
#if defined(SATDAR_SIM_UBSAN)
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), kSharedFloats * sizeof(float)), cudaSuccess);
  ASSERT_EQ(Launch("StaticSharedReadKernel", StaticSharedReadKernel, dim3(2), dim3(kSharedFloats),
                   0, stream_, d, 0),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_DEATH(
      {
        Launch("StaticSharedReadKernel", StaticSharedReadKernel, dim3(2), dim3(kSharedFloats), 0,
               stream_, d, 1);
        cudaStreamSynchronize(stream_);
      },
      "runtime error: index 64 out of bounds for type 'float ?\\[64\\]'");
  cudaFree(d);
#else
  GTEST_SKIP() << "needs UBSan and SATDAR_SIM_UBSAN: bazel test --config=sim-san "
                  "//core/cuda/sim:all";
#endif
}

}  // namespace
}  // namespace satdar::cuda_sim
