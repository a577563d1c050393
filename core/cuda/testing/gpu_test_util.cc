#include "core/cuda/testing/gpu_test_util.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace satdar::core::gpu_test {

std::vector<float> RandomNormal(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

uint32_t LcgNext(uint32_t* state) { return *state = *state * 1664525u + 1013904223u; }

std::vector<float> RandomUniform(size_t n, uint32_t seed, uint32_t offset, float amp) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + offset;
  for (float& x : v) {
    x = amp * (static_cast<float>(LcgNext(&s) >> 8) / static_cast<float>(1 << 24) - 0.5f);
  }
  return v;
}

std::vector<int32_t> RandomTokens(size_t n, int v, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, v - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = dist(gen);
  return t;
}

void Quantize(std::vector<float>* v, DType dtype) {
  if (dtype != DType::kBF16) return;
  for (float& x : *v) x = BF16ToFloat(FloatToBF16(x));
}

double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / scale;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double ss = 0;
  for (float w : want) ss += static_cast<double>(w) * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(ss / want.size());
  int bad = 0;
  size_t worst = 0;
  double worst_rtol = -1;  // the rtol element `worst` would need (NaN counts as the largest)
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double scale = std::max<double>(std::fabs(want[i]), rms);
    const double limit = rtol * scale;
    const double need = err == 0 ? 0.0 : err / scale;  // inf when scale is 0, NaN for NaN
    if (!(need <= worst_rtol) && !std::isnan(worst_rtol)) {
      worst = i;
      worst_rtol = need;
    }
    if (!(err <= limit)) {
      if (bad < 5) {
        ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << " cpu " << want[i]
                      << " (limit " << limit << ")";
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size()
                    << " elements outside rtol " << rtol << "; worst " << what << "[" << worst
                    << "]: gpu " << got[worst] << " cpu " << want[worst] << " (needs rtol "
                    << worst_rtol << ")";
}

std::string DTypeParamName(const ::testing::TestParamInfo<DType>& info) {
  return std::string(DTypeName(info.param));
}

DeviceBuffer::DeviceBuffer(size_t n, DType dtype) : n_(n), dtype_(dtype) {
  ptr_ = *cuda::Malloc(std::max<size_t>(1, n_ * DTypeSize(dtype_)), 0);
}

DeviceBuffer::DeviceBuffer(const std::vector<float>& host, DType dtype)
    : DeviceBuffer(host.size(), dtype) {
  Upload(host);
}

DeviceBuffer::~DeviceBuffer() { cuda::Free(ptr_); }

void DeviceBuffer::Upload(const std::vector<float>& host) {
  ASSERT_EQ(host.size(), n_);
  if (dtype_ == DType::kBF16) {
    std::vector<BF16> b(n_);
    for (size_t i = 0; i < n_; ++i) b[i] = FloatToBF16(host[i]);
    ASSERT_TRUE(cuda::CopyToDevice(ptr_, b.data(), n_ * sizeof(BF16)).ok());
  } else {
    ASSERT_TRUE(cuda::CopyToDevice(ptr_, host.data(), n_ * sizeof(float)).ok());
  }
}

std::vector<float> DeviceBuffer::Download() const {
  std::vector<float> out(n_);
  EXPECT_TRUE(cuda::Synchronize().ok());
  if (dtype_ == DType::kBF16) {
    std::vector<BF16> b(n_);
    EXPECT_TRUE(cuda::CopyToHost(b.data(), ptr_, n_ * sizeof(BF16)).ok());
    for (size_t i = 0; i < n_; ++i) out[i] = BF16ToFloat(b[i]);
  } else {
    EXPECT_TRUE(cuda::CopyToHost(out.data(), ptr_, n_ * sizeof(float)).ok());
  }
  return out;
}

}  // namespace satdar::core::gpu_test
