// core/cuda/sim/kernel_sim_test.cc: the simulator's kernel execution: barriers and fiber
// orders, divergence reports, warp collectives, builtins, shared memory, atomics, bf16 and
// launch configuration checks. Compiled as plain C++ with prelude.h force-included, as the
// simulator build compiles a .cu file.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "core/cuda/sim/kernel_sim.h"
#include "gtest/gtest.h"

namespace satdar::cuda_sim {
namespace {

using ::satdar::core::cuda::Launch;
using ::satdar::core::cuda::LaunchBounds;

// A device buffer of n T, copied in and out with cudaMemcpy (the host must not touch device
// memory directly).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n, T fill = T()) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), cudaSuccess);
    std::vector<T> host(n, fill);
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

// Runs on a stream of its own, so an expected failure stays out of the other tests.
class KernelSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    SetFiberOrder(FiberOrder::kForward);
  }
  void TearDown() override {
    SetFiberOrder(FiberOrder::kForward);
    cudaStreamDestroy(stream_);  // drops the stream's sticky error, if the test made one
    cudaGetLastError();
  }
  // Synchronises on a stream whose kernel faulted: the fault is the stream's error and this
  // thread's last error, as after a device fault.
  void ExpectLaunchFailure() {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  }
  cudaStream_t stream_ = nullptr;
};

// ---- Barriers and fiber order.

constexpr int kRingThreads = 64;

// Each thread reads its neighbour's slot: correct only with the barrier.
template <bool kBarrier>
__global__ void RingKernel(int* out) {
  __shared__ int s[kRingThreads];
  const int t = threadIdx.x;
  s[t] = static_cast<int>(blockIdx.x) * 1000 + t;
  if (kBarrier) __syncthreads();
  out[blockIdx.x * kRingThreads + t] = s[(t + 1) % kRingThreads];
  if (kBarrier) __syncthreads();  // s is reused by the next block on this host thread
}

std::vector<int> RunRing(cudaStream_t stream, bool barrier, FiberOrder order, uint64_t seed) {
  SetFiberOrder(order, seed);
  constexpr int kBlocks = 8;
  DeviceBuffer<int> out(kBlocks * kRingThreads, -1);
  cudaError_t err = barrier ? Launch("RingKernel", RingKernel<true>, dim3(kBlocks),
                                     dim3(kRingThreads), 0, stream, out.get())
                            : Launch("RingKernel", RingKernel<false>, dim3(kBlocks),
                                     dim3(kRingThreads), 0, stream, out.get());
  EXPECT_EQ(err, cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return out.Download();
}

TEST_F(KernelSimTest, MissingBarrierChangesResultsWithOrder) {
  const std::vector<int> fwd = RunRing(stream_, false, FiberOrder::kForward, 0);
  const std::vector<int> rev = RunRing(stream_, false, FiberOrder::kReverse, 0);
  EXPECT_NE(fwd, rev);
}

TEST_F(KernelSimTest, CorrectKernelIsOrderIndependent) {
  std::vector<int> want(8 * kRingThreads);
  for (int b = 0; b < 8; ++b) {
    for (int t = 0; t < kRingThreads; ++t) {
      want[b * kRingThreads + t] = b * 1000 + (t + 1) % kRingThreads;
    }
  }
  EXPECT_EQ(RunRing(stream_, true, FiberOrder::kForward, 0), want);
  EXPECT_EQ(RunRing(stream_, true, FiberOrder::kReverse, 0), want);
  EXPECT_EQ(RunRing(stream_, true, FiberOrder::kShuffle, 1), want);
  EXPECT_EQ(RunRing(stream_, true, FiberOrder::kShuffle, 12345), want);
}

__global__ void DivergentBarrierKernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1;
}

TEST_F(KernelSimTest, DivergentBarrierIsReportedNotHung) {
  DeviceBuffer<int> out(64);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Launch("DivergentBarrierKernel", DivergentBarrierKernel, dim3(4), dim3(64), 0,
                   stream_, out.get()),
            cudaSuccess);  // the launch itself is fine; the fault shows at synchronisation
  ExpectLaunchFailure();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("DivergentBarrierKernel"), std::string::npos) << err;
  EXPECT_NE(err.find("block ("), std::string::npos) << err;
  EXPECT_NE(err.find("exited"), std::string::npos) << err;
}

__global__ void BarrierCountKernel(int* out, int n) {
  // Threads below 16 pass one barrier more than the rest.
  for (int i = 0; i < n + (threadIdx.x < 16 ? 1 : 0); ++i) __syncthreads();
  out[threadIdx.x] = 1;
}

TEST_F(KernelSimTest, UnequalBarrierCountsAreReported) {
  DeviceBuffer<int> out(64);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Launch("BarrierCountKernel", BarrierCountKernel, dim3(1), dim3(64), 0, stream_,
                   out.get(), 3),
            cudaSuccess);
  ExpectLaunchFailure();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("BarrierCountKernel"), std::string::npos) << err;
}

__global__ void WarpSyncAcrossBarrierKernel(int* out) {
  // Lane 0 waits in __syncwarp while the other lanes wait at __syncthreads: a deadlock on the
  // device.
  if (threadIdx.x == 0) {
    __syncwarp();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

TEST_F(KernelSimTest, WarpAndBlockBarrierDeadlockIsReported) {
  DeviceBuffer<int> out(32);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Launch("WarpSyncAcrossBarrierKernel", WarpSyncAcrossBarrierKernel, dim3(1), dim3(32),
                   0, stream_, out.get()),
            cudaSuccess);
  ExpectLaunchFailure();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("WarpSyncAcrossBarrierKernel"), std::string::npos) << err;
}

#if !defined(__SANITIZE_ADDRESS__)  // ASan reports the overflow in its own words
__device__ int Deep(int d) {
  volatile char frame[1024];  // a 1 KiB frame per level: 1000 levels overflow any fiber stack
  frame[0] = static_cast<char>(d);
  return d == 0 ? frame[0] : Deep(d - 1) + frame[0];
}

__global__ void DeepRecursionKernel(int* out) { out[threadIdx.x] = Deep(1000); }

TEST_F(KernelSimTest, FiberStackOverflowIsReportedDeathTest) {
  // threadsafe: the child re-runs this test alone, with fresh stream and pool threads.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        DeviceBuffer<int> out(2);
        Launch("DeepRecursionKernel", DeepRecursionKernel, dim3(1), dim3(2), 0, stream_,
               out.get());
        cudaStreamSynchronize(stream_);
      },
      "kernel 'DeepRecursionKernel' block \\(0,0,0\\) thread \\(0,0,0\\) overflowed its");
}
#endif

// ---- Warp collectives.

// Per thread, 11 results; see WarpCollectivesMatchKnownAnswers.
constexpr int kWarpResults = 11;

__global__ void WarpKernel(unsigned* out) {
  const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32;
  unsigned* o = out + t * kWarpResults;
  const unsigned mine = warp * 1000 + lane;
  o[0] = __shfl_xor_sync(0xffffffffu, mine, 1);
  o[1] = __shfl_xor_sync(0xffffffffu, mine, 16);
  o[2] = static_cast<unsigned>(__shfl_xor_sync(0xffffffffu, static_cast<int>(mine), 5, 8));
  o[3] = __shfl_xor_sync(0xffffffffu, mine, 8, 8);  // reaches back into an earlier group only
  const float f = __shfl_xor_sync(0xffffffffu, 0.5f * static_cast<float>(mine), 3);
  o[4] = static_cast<unsigned>(f * 2.0f);
  // Half-warp masks: each half exchanges within itself.
  const unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  o[5] = __shfl_xor_sync(half, mine, 2);
  o[6] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  o[7] = __ballot_sync(half, lane % 2 == 1);
  o[8] = static_cast<unsigned>(__popc(o[6]));
  o[9] = static_cast<unsigned>(__popc(o[6] & ((1u << lane) - 1u)));
  __syncwarp();
  const double d = __shfl_xor_sync(0xffffffffu, 0.25 * mine, 4);
  o[10] = static_cast<unsigned>(d * 4.0);
}

TEST_F(KernelSimTest, WarpCollectivesMatchKnownAnswers) {
  constexpr int kThreads = 64;
  DeviceBuffer<unsigned> out(kThreads * kWarpResults);
  ASSERT_EQ(Launch("WarpKernel", WarpKernel, dim3(1), dim3(kThreads), 0, stream_, out.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<unsigned> got = out.Download();
  auto at = [&](unsigned t, int k) { return got[t * kWarpResults + k]; };
  // Hand-checked answers for warp 0 (value = lane) and warp 1 (value = 1000 + lane).
  EXPECT_EQ(at(0, 0), 1u);
  EXPECT_EQ(at(1, 0), 0u);
  EXPECT_EQ(at(32 + 6, 0), 1007u);
  EXPECT_EQ(at(3, 1), 19u);
  EXPECT_EQ(at(19, 1), 3u);
  EXPECT_EQ(at(2, 2), 7u);   // 2 ^ 5 = 7, inside the 8-lane group
  EXPECT_EQ(at(4, 2), 1u);   // 4 ^ 5 = 1
  EXPECT_EQ(at(1, 3), 1u);   // 1 ^ 8 = 9 lies in a later group: own value
  EXPECT_EQ(at(9, 3), 1u);   // 9 ^ 8 = 1 lies in an earlier group: read it
  EXPECT_EQ(at(17, 3), 17u);
  EXPECT_EQ(at(25, 3), 17u);
  EXPECT_EQ(at(32 + 25, 3), 1017u);
  EXPECT_EQ(at(5, 4), 6u);  // float: lane 5 reads lane 6
  EXPECT_EQ(at(13, 5), 15u);
  EXPECT_EQ(at(18, 5), 16u);
  EXPECT_EQ(at(0, 6), 0x49249249u);
  EXPECT_EQ(at(40, 6), 0x49249249u);
  EXPECT_EQ(at(3, 7), 0x0000aaaau);
  EXPECT_EQ(at(20, 7), 0xaaaa0000u);
  EXPECT_EQ(at(0, 8), 11u);
  EXPECT_EQ(at(0, 9), 0u);
  EXPECT_EQ(at(4, 9), 2u);   // lanes 0 and 3 below lane 4
  EXPECT_EQ(at(31, 9), 11u);
  EXPECT_EQ(at(7, 10), 3u);  // double: lane 7 reads lane 3
  // And the general rule, for every lane.
  for (unsigned t = 0; t < kThreads; ++t) {
    const unsigned lane = t % 32, base = t - lane;
    EXPECT_EQ(at(t, 0), (base / 32) * 1000 + (lane ^ 1)) << t;
    EXPECT_EQ(at(t, 1), (base / 32) * 1000 + (lane ^ 16)) << t;
    EXPECT_EQ(at(t, 2), (base / 32) * 1000 + (lane ^ 5)) << t;
    const unsigned src3 = (lane ^ 8) > (lane | 7) ? lane : (lane ^ 8);
    EXPECT_EQ(at(t, 3), (base / 32) * 1000 + src3) << t;
    EXPECT_EQ(at(t, 5), (base / 32) * 1000 + (lane ^ 2)) << t;
  }
}

__global__ void ExitedLanesKernel(unsigned* out) {
  const unsigned lane = threadIdx.x % 32;
  if (lane >= 24) return;  // exited lanes take no part in full-mask collectives
  const unsigned b = __ballot_sync(0xffffffffu, 1);
  __syncwarp();
  out[threadIdx.x] = b;
}

TEST_F(KernelSimTest, ExitedLanesDoNotBlockWarpCollectives) {
  DeviceBuffer<unsigned> out(64, 7);
  ASSERT_EQ(Launch("ExitedLanesKernel", ExitedLanesKernel, dim3(1), dim3(32), 0, stream_,
                   out.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<unsigned> got = out.Download();
  EXPECT_EQ(got[0], 0x00ffffffu);
  EXPECT_EQ(got[23], 0x00ffffffu);
  EXPECT_EQ(got[24], 7u);
}

__global__ void ShflFromExitedLaneKernel(int* out) {
  if (threadIdx.x == 1) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

TEST_F(KernelSimTest, ShuffleFromExitedLaneIsReported) {
  DeviceBuffer<int> out(32);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Launch("ShflFromExitedLaneKernel", ShflFromExitedLaneKernel, dim3(1), dim3(32), 0,
                   stream_, out.get()),
            cudaSuccess);
  ExpectLaunchFailure();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("ShflFromExitedLaneKernel"), std::string::npos) << err;
}

// ---- Builtins, 2-D blocks, shared memory.

__global__ void TwoDKernel(unsigned* out) {
  const unsigned linear = threadIdx.y * blockDim.x + threadIdx.x;
  const unsigned block = blockIdx.y * gridDim.x + blockIdx.x;
  unsigned* o = out + (block * blockDim.x * blockDim.y + linear) * 4;
  o[0] = threadIdx.x + 100 * threadIdx.y;
  o[1] = blockIdx.x + 100 * blockIdx.y;
  // Lanes are the x-fastest linear index: with 16-wide rows, lane ^ 16 is the row below/above.
  o[2] = __shfl_xor_sync(0xffffffffu, threadIdx.y, 16);
  o[3] = blockDim.x * 10000 + blockDim.y * 100 + gridDim.x * 10 + gridDim.y + warpSize * 0;
}

TEST_F(KernelSimTest, TwoDimensionalBlocks) {
  const dim3 grid(3, 2), block(16, 4);
  const unsigned blocks = 6, threads = 64;
  DeviceBuffer<unsigned> out(blocks * threads * 4);
  ASSERT_EQ(Launch("TwoDKernel", TwoDKernel, grid, block, 0, stream_, out.get()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<unsigned> got = out.Download();
  for (unsigned by = 0; by < 2; ++by) {
    for (unsigned bx = 0; bx < 3; ++bx) {
      for (unsigned ty = 0; ty < 4; ++ty) {
        for (unsigned tx = 0; tx < 16; ++tx) {
          const unsigned* o = &got[((by * 3 + bx) * threads + ty * 16 + tx) * 4];
          EXPECT_EQ(o[0], tx + 100 * ty);
          EXPECT_EQ(o[1], bx + 100 * by);
          EXPECT_EQ(o[2], ty ^ 1u);
          EXPECT_EQ(o[3], 16u * 10000 + 4 * 100 + 3 * 10 + 2);
        }
      }
    }
  }
}

// Block-level __shared__ is one copy per block in flight: blocks running at the same time on
// different host threads do not see each other's.
__global__ void SharedPerBlockKernel(int* out, int rounds) {
  __shared__ int owner;
  int bad = 0;
  for (int r = 0; r < rounds; ++r) {
    if (threadIdx.x == r % blockDim.x) owner = static_cast<int>(blockIdx.x);
    __syncthreads();
    bad += owner != static_cast<int>(blockIdx.x);
    __syncthreads();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = bad;
}

TEST_F(KernelSimTest, SharedMemoryIsPerBlock) {
  constexpr int kBlocks = 64, kThreads = 128;
  DeviceBuffer<int> out(kBlocks * kThreads, -1);
  ASSERT_EQ(Launch("SharedPerBlockKernel", SharedPerBlockKernel, dim3(kBlocks), dim3(kThreads), 0,
                   stream_, out.get(), 200),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  for (int v : out.Download()) ASSERT_EQ(v, 0);
}

// reduce.cuh's BlockSums: a __shared__ array in a templated __device__ helper.
template <int kThreads>
__global__ void BlockSumsKernel(float* out, const float* in) {
  float v[2] = {in[blockIdx.x * kThreads + threadIdx.x], 1.0f};
  ::satdar::core::cuda::device::BlockSums<kThreads, 2>(v);
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = v[0];
    out[2 * blockIdx.x + 1] = v[1];
  }
}

TEST_F(KernelSimTest, TemplatedSharedArraysInDeviceHelpers) {
  constexpr int kThreads = 256, kBlocks = 16;
  std::vector<float> host(kThreads * kBlocks);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 7);
  DeviceBuffer<float> in(host.size());
  ASSERT_EQ(cudaMemcpy(in.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  DeviceBuffer<float> out(2 * kBlocks);
  SetFiberOrder(FiberOrder::kShuffle, 7);
  ASSERT_EQ(Launch("BlockSumsKernel", BlockSumsKernel<kThreads>, dim3(kBlocks), dim3(kThreads), 0,
                   stream_, out.get(), in.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<float> got = out.Download();
  for (int b = 0; b < kBlocks; ++b) {
    float want = 0;
    for (int t = 0; t < kThreads; ++t) want += host[b * kThreads + t];
    EXPECT_EQ(got[2 * b], want) << b;
    EXPECT_EQ(got[2 * b + 1], static_cast<float>(kThreads));
  }
}

__global__ void DynamicSharedKernel(float* out, const float* in, int n, unsigned* first_bits) {
  SATDAR_DYNAMIC_SHARED(float, buf);
  const int t = threadIdx.x;
  if (t == 0) std::memcpy(&first_bits[blockIdx.x], &buf[n - 1], 4);  // before any write
  __syncthreads();
  buf[t] = in[blockIdx.x * n + t];
  __syncthreads();
  out[blockIdx.x * n + t] = buf[n - 1 - t];
}

TEST_F(KernelSimTest, DynamicSharedMemory) {
  constexpr int kN = 96, kBlocks = 5;
  std::vector<float> host(kN * kBlocks);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  DeviceBuffer<float> in(host.size()), out(host.size());
  DeviceBuffer<unsigned> bits(kBlocks);
  ASSERT_EQ(cudaMemcpy(in.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(Launch("DynamicSharedKernel", DynamicSharedKernel, dim3(kBlocks), dim3(kN),
                   kN * sizeof(float), stream_, out.get(), in.get(), kN, bits.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<float> got = out.Download();
  for (int b = 0; b < kBlocks; ++b) {
    for (int t = 0; t < kN; ++t) ASSERT_EQ(got[b * kN + t], host[b * kN + kN - 1 - t]);
  }
  for (unsigned v : bits.Download()) EXPECT_EQ(v, 0xffffffffu);  // fresh, poisoned, per block
}

// ---- Atomics.

__global__ void AtomicKernel(int* total, unsigned* utotal, float* ftotal, int* hist_out) {
  __shared__ int hist[4];
  if (threadIdx.x < 4) hist[threadIdx.x] = 0;
  __syncthreads();
  atomicAdd(&hist[threadIdx.x % 4], 1);
  atomicAdd(total, 1);
  atomicAdd(utotal, 2u);
  atomicAdd(ftotal, 0.5f);
  __syncthreads();
  if (threadIdx.x < 4) hist_out[blockIdx.x * 4 + threadIdx.x] = hist[threadIdx.x];
}

TEST_F(KernelSimTest, AtomicAddAcrossBlocks) {
  constexpr int kBlocks = 64, kThreads = 256;
  DeviceBuffer<int> total(1, 0), hist(kBlocks * 4, -1);
  DeviceBuffer<unsigned> utotal(1, 0);
  DeviceBuffer<float> ftotal(1, 0.0f);
  ASSERT_EQ(Launch("AtomicKernel", AtomicKernel, dim3(kBlocks), dim3(kThreads), 0, stream_,
                   total.get(), utotal.get(), ftotal.get(), hist.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(total.Download()[0], kBlocks * kThreads);
  EXPECT_EQ(utotal.Download()[0], 2u * kBlocks * kThreads);
  EXPECT_EQ(ftotal.Download()[0], 0.5f * kBlocks * kThreads);  // exact: small integers / 2
  for (int v : hist.Download()) EXPECT_EQ(v, kThreads / 4);
}

// ---- Device math and min / max.

__global__ void MathKernel(float* out, long long* iout) {
  out[0] = expf(1.0f);
  out[1] = logf(2.0f);
  out[2] = sqrtf(4.0f);
  out[3] = tanhf(0.0f);
  out[4] = fmaxf(-1.0f, INFINITY);
  out[5] = erff(0.0f);
  out[6] = rsqrtf(4.0f);
  out[7] = min(2.5f, 1.5f);
  iout[0] = min(3, 7);
  iout[1] = max(static_cast<int64_t>(1) << 40, 5);
  iout[2] = max(3u, 4u);
  iout[3] = min(-1, 2);
}

TEST_F(KernelSimTest, DeviceMath) {
  DeviceBuffer<float> out(8);
  DeviceBuffer<long long> iout(4);
  ASSERT_EQ(Launch("MathKernel", MathKernel, dim3(1), dim3(1), 0, stream_, out.get(), iout.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<float> f = out.Download();
  EXPECT_FLOAT_EQ(f[0], 2.7182817f);
  EXPECT_FLOAT_EQ(f[1], 0.6931472f);
  EXPECT_EQ(f[2], 2.0f);
  EXPECT_EQ(f[3], 0.0f);
  EXPECT_EQ(f[4], INFINITY);
  EXPECT_EQ(f[5], 0.0f);
  EXPECT_EQ(f[6], 0.5f);
  EXPECT_EQ(f[7], 1.5f);
  const std::vector<long long> i = iout.Download();
  EXPECT_EQ(i[0], 3);
  EXPECT_EQ(i[1], 1ll << 40);
  EXPECT_EQ(i[2], 4);
  EXPECT_EQ(i[3], -1);
}

// ---- Launch configuration.

__global__ void NopKernel(int* out) {
  if (out != nullptr) out[0] = 1;
}

TEST_F(KernelSimTest, LaunchConfigErrors) {
  int* null = nullptr;
  EXPECT_EQ(Launch("NopKernel", NopKernel, dim3(1), dim3(1025), 0, stream_, null),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch("NopKernel", NopKernel, dim3(1), dim3(32, 32, 2), 0, stream_, null),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch("NopKernel", NopKernel, dim3(1), dim3(1, 1, 65), 0, stream_, null),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch("NopKernel", NopKernel, dim3(1, 65536), dim3(32), 0, stream_, null),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch("NopKernel", NopKernel, dim3(0), dim3(32), 0, stream_, null),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(Launch("NopKernel", NopKernel, dim3(1), dim3(32), 232448 + 1, stream_, null),
            cudaErrorInvalidValue);
  EXPECT_EQ(Launch("NopKernel", NopKernel, LaunchBounds{128}, dim3(1), dim3(256), 0, stream_,
                   null),
            cudaErrorInvalidConfiguration);
  // The error is not sticky: a good launch after it succeeds.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(Launch("NopKernel", NopKernel, LaunchBounds{128}, dim3(1), dim3(128), 232448,
                   stream_, null),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

TEST_F(KernelSimTest, LaunchOnDestroyedStreamFails) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  int* null = nullptr;
  EXPECT_EQ(Launch("NopKernel", NopKernel, dim3(1), dim3(32), 0, s, null),
            cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ---- bf16.

// core/dtype.h's FloatToBF16 (copied: dtype.h needs absl): round to nearest even.
uint16_t HostBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16Test, ConversionTable) {
  struct Case {
    uint32_t in;
    uint16_t want;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80},  // 1
      {0x3f808000u, 0x3f80},  // tie, rounds to even (down)
      {0x3f818000u, 0x3f82},  // tie, rounds to even (up)
      {0x3f808001u, 0x3f81},  // above the tie
      {0x3f807fffu, 0x3f80},  // below the tie
      {0xbf818000u, 0xbf82},  // negative tie
      {0x00000000u, 0x0000},
      {0x80000000u, 0x8000},  // -0 keeps its sign
      {0x00000001u, 0x0000},  // smallest subnormal rounds to 0
      {0x00008000u, 0x0000},  // subnormal tie to even (0)
      {0x00018000u, 0x0002},  // subnormal tie to even (up)
      {0x00008001u, 0x0001},
      {0x00010000u, 0x0001},  // smallest bf16 subnormal, exact
      {0x807f8000u, 0x8080},  // largest subnormal tie carries into the smallest normal
      {0x007fffffu, 0x0080},
      {0x7f800000u, 0x7f80},  // +inf
      {0xff800000u, 0xff80},  // -inf
      {0x7f7f0000u, 0x7f7f},  // largest finite bf16
      {0x7f7f7fffu, 0x7f7f},
      {0x7f7f8000u, 0x7f80},  // tie past the largest finite: odd, so up to inf
      {0x7f7fffffu, 0x7f80},  // FLT_MAX overflows to inf
      {0xff7fffffu, 0xff80},
      {0x7f7e8000u, 0x7f7e},  // tie below it: even, stays
      {0x7fc00000u, 0x7fff},  // NaN: the canonical bf16 NaN
      {0xffc00000u, 0x7fff},
      {0x7f800001u, 0x7fff},  // signalling NaN whose RNE would be inf stays NaN
      {0x7fffffffu, 0x7fff},
  };
  for (const Case& c : cases) {
    const __nv_bfloat16 a = __float2bfloat16_rn(FromBits(c.in));
    const __nv_bfloat16 b = __float2bfloat16(FromBits(c.in));
    EXPECT_EQ(a.__x, c.want) << std::hex << c.in;
    EXPECT_EQ(b.__x, c.want) << std::hex << c.in;
    if ((c.in & 0x7fffffffu) <= 0x7f800000u) {
      EXPECT_EQ(HostBf16(FromBits(c.in)), c.want);
    }
  }
  EXPECT_EQ(__bfloat162float(__ushort_as_bfloat16(0x3f80)), 1.0f);
  EXPECT_EQ(__bfloat162float(__ushort_as_bfloat16(0xff80)), -INFINITY);
  EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16_rn(NAN))));
  const __nv_bfloat16 implicit = 2.5f;  // CUDA's implicit conversions
  EXPECT_EQ(static_cast<float>(implicit), 2.5f);
}

TEST(Bf16Test, AgreesWithHostBf16ExceptNanPayload) {
  // Every 4097th bit pattern, plus the patterns around each rounding boundary.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4097) {
    for (uint32_t low : {0u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const uint32_t bits = (static_cast<uint32_t>(u) & 0xffff0000u) | low;
      const float f = FromBits(bits);
      const uint16_t got = __float2bfloat16_rn(f).__x;
      if (std::isnan(f)) {
        ASSERT_EQ(got, 0x7fff);
      } else {
        ASSERT_EQ(got, HostBf16(f)) << std::hex << bits;
        const float back = __bfloat162float(__ushort_as_bfloat16(got));
        ASSERT_EQ(__float2bfloat16_rn(back).__x, got);  // bf16 values convert back exactly
      }
    }
  }
}

// ---- Speed.

__global__ void TenBarriersKernel(float* out) {
  __shared__ float s[256];
  float v = static_cast<float>(threadIdx.x);
  for (int i = 0; i < 10; ++i) {
    s[threadIdx.x] = v;
    __syncthreads();
    v += s[(threadIdx.x + 1) % 256] * 0.5f;
  }
  out[blockIdx.x * 256 + threadIdx.x] = v;
}

TEST_F(KernelSimTest, SpeedOf1024Blocks256ThreadsTenBarriers) {
  DeviceBuffer<float> out(1024 * 256);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(Launch("TenBarriersKernel", TenBarriersKernel, dim3(1024), dim3(256), 0, stream_,
                   out.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("1024 blocks x 256 threads x 10 __syncthreads: %.3f s\n", s);
  EXPECT_LT(s, 60.0);
}

}  // namespace
}  // namespace satdar::cuda_sim
