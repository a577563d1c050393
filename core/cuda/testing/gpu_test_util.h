// core/cuda/testing/gpu_test_util.h: what the gpu-tagged tests share (testonly). A test body
// starts with SATDAR_SKIP_WITHOUT_GPU(); inputs come from RandomNormal / RandomUniform,
// rounded with Quantize when the kernel under test reads bf16; DeviceBuffer / DeviceArray hold
// them on the device (host floats converted to the element type on the way in and back), and
// RelErr / ExpectClose compare the GPU's results with the CPU reference.
#ifndef SATDAR_CORE_CUDA_TESTING_GPU_TEST_UTIL_H_
#define SATDAR_CORE_CUDA_TESTING_GPU_TEST_UTIL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/dtype.h"
#include "gtest/gtest.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_bf16.h>
#endif

// In a TEST body: skips the test when the build has no CUDA or the machine has no GPU.
#define SATDAR_SKIP_WITHOUT_GPU()                                                         \
  do {                                                                                    \
    if (!::satdar::core::cuda::BuiltWithCuda()) {                                         \
      GTEST_SKIP() << "built without CUDA (no nvcc at build time)";                       \
    }                                                                                     \
    if (::satdar::core::cuda::DeviceCount() == 0) {                                       \
      GTEST_SKIP() << "no CUDA GPU on this machine";                                      \
    }                                                                                     \
  } while (0)

// x in a CUDA build, nothing otherwise (for calls of helpers defined under SATDAR_WITH_CUDA).
#ifdef SATDAR_WITH_CUDA
#define SATDAR_IF_CUDA(x) x
#else
#define SATDAR_IF_CUDA(x)
#endif

// Two tests, suite.CudaMatchesCpuF32 and suite.CudaMatchesCpuBf16, that run check<float>() and
// check<__nv_bfloat16>() (a template defined under SATDAR_WITH_CUDA), each skipped without a GPU.
#define SATDAR_CUDA_MATCHES_CPU_TESTS(suite, check)                 \
  TEST(suite, CudaMatchesCpuF32) {                                  \
    SATDAR_SKIP_WITHOUT_GPU();                                      \
    SATDAR_IF_CUDA(check<float>());                                 \
  }                                                                 \
  TEST(suite, CudaMatchesCpuBf16) {                                 \
    SATDAR_SKIP_WITHOUT_GPU();                                      \
    SATDAR_IF_CUDA(check<::satdar::core::gpu_test::Bf16>());        \
  }

namespace satdar::core::gpu_test {

// ---- Inputs.

// n samples of Normal(0, scale) from std::mt19937(seed).
std::vector<float> RandomNormal(size_t n, uint32_t seed, float scale = 1.0f);

// One step of the 32-bit LCG s = s * 1664525 + 1013904223; returns the new state.
uint32_t LcgNext(uint32_t* state);

// n values amp * (u - 0.5), u uniform in [0, 1) from the top 24 bits of successive LcgNext
// states, starting from seed * 2654435761 + offset.
std::vector<float> RandomUniform(size_t n, uint32_t seed, uint32_t offset, float amp = 1.0f);

// n token ids uniform in [0, v) from std::mt19937(seed).
std::vector<int32_t> RandomTokens(size_t n, int v, uint32_t seed);

// Rounds every element to bf16 precision in place when dtype is kBF16 (no-op otherwise), so
// the CPU reference sees exactly the GPU's inputs.
void Quantize(std::vector<float>* v, DType dtype);

// ---- Comparisons.

// max_i |got_i - want_i| / max_i |want_i| (the denominator at least 1e-30).
double RelErr(const std::vector<float>& got, const std::vector<float>& want);

// Element i passes when |got_i - want_i| <= rtol * max(|want_i|, rms(want)), rms over the
// whole array. Reports the first 5 failing elements, then the count and the worst element
// (the one that would need the largest rtol).
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                 const std::string& what);

// The name suffix of a TEST_P instance parameterised on DType: "F32", "BF16", ...
std::string DTypeParamName(const ::testing::TestParamInfo<DType>& info);

// ---- Device memory.

// n elements of dtype (kF32 or kBF16) on device 0, freed on destruction; the host side is
// always float (rounded to nearest even into bf16, widened back exactly).
class DeviceBuffer {
 public:
  DeviceBuffer(size_t n, DType dtype);  // uninitialised
  DeviceBuffer(const std::vector<float>& host, DType dtype);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  size_t size() const { return n_; }
  DType dtype() const { return dtype_; }

  void Upload(const std::vector<float>& host);  // host.size() must be size()
  std::vector<float> Download() const;          // synchronises the device first

 private:
  size_t n_;
  DType dtype_;
  void* ptr_ = nullptr;
};

// A raw device copy of host elements (token ids, slot indices, device pointers), freed on
// destruction.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    static_assert(std::is_trivially_copyable_v<T>);
    ptr_ = static_cast<T*>(*cuda::Malloc(std::max<size_t>(n_, 1) * sizeof(T), 0));
    EXPECT_TRUE(cuda::CopyToDevice(ptr_, host.data(), n_ * sizeof(T)).ok());
  }
  ~DeviceVector() { cuda::Free(ptr_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

#ifdef SATDAR_WITH_CUDA

using Bf16 = __nv_bfloat16;

template <typename T>
inline constexpr bool kIsBf16 = std::is_same_v<T, Bf16>;

// The DType of a kernel element type T (float or __nv_bfloat16).
template <typename T>
inline constexpr DType kDTypeOf = kIsBf16<T> ? DType::kBF16 : DType::kF32;

// v rounded to T's precision (a copy; unchanged for float).
template <typename T>
std::vector<float> Quantize(std::vector<float> v) {
  Quantize(&v, kDTypeOf<T>);
  return v;
}

// A DeviceBuffer typed for the kernels' T* arguments (T float or __nv_bfloat16).
template <typename T>
class DeviceArray : public DeviceBuffer {
  static_assert(std::is_same_v<T, float> || kIsBf16<T>, "float or __nv_bfloat16");

 public:
  explicit DeviceArray(size_t n) : DeviceBuffer(n, kDTypeOf<T>) {}
  explicit DeviceArray(const std::vector<float>& host) : DeviceBuffer(host, kDTypeOf<T>) {}

  T* get() const { return static_cast<T*>(DeviceBuffer::get()); }
};

#endif  // SATDAR_WITH_CUDA

}  // namespace satdar::core::gpu_test

#endif  // SATDAR_CORE_CUDA_TESTING_GPU_TEST_UTIL_H_
