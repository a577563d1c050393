// MoE permute / combine and their backward on the GPU (variants/moe_cuda.h) against loops
// written exactly as model/variants/moe.cc does them (dispatch in (expert, token) order).
// Skips without a CUDA build or without a GPU. (This file sits in model/, not model/variants/,
// because the :model library compiles every variants/*.cc.)
//
// Tolerances (max |gpu - cpu| / max |cpu| per output):
//   f32:  1e-5 for permute (a copy: exact in practice), 1e-4 for combine, dweight, dx
//   bf16: 2e-2 (row data rounded to bf16 before both paths; outputs stored bf16)
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "model/variants/moe_cuda.h"

namespace satdar::model {
namespace {

using core::DType;
namespace rt = core::cuda;  // the runtime shim; cuda:: below is model::cuda

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceBuffer;
using core::gpu_test::DeviceVector;
using core::gpu_test::LcgNext;
using core::gpu_test::RelErr;

// Row data, rounded to bf16 when dt is bf16.
std::vector<float> Random(size_t n, uint32_t seed, DType dt) {
  std::vector<float> v = core::gpu_test::RandomUniform(n, seed, /*offset=*/3);
  core::gpu_test::Quantize(&v, dt);
  return v;
}

struct Case {
  int n, e, k, d;
};

void Check(const Case& c, DType dt) {
  SCOPED_TRACE(std::string(core::DTypeName(dt)) + " n=" + std::to_string(c.n) + " e=" +
               std::to_string(c.e) + " k=" + std::to_string(c.k) + " d=" + std::to_string(c.d));
  const double tol = dt == DType::kBF16 ? 2e-2 : 1e-4;
  // Routing: k distinct experts per token, fp32 weights; slots in (expert, token) order.
  uint32_t s = 12345;
  std::vector<int> sel(size_t{1} * c.n * c.k);
  std::vector<float> weight(sel.size());
  for (int r = 0; r < c.n; ++r) {
    std::vector<int> order(c.e);
    for (int e = 0; e < c.e; ++e) order[e] = e;
    for (int j = 0; j < c.k; ++j) {
      std::swap(order[j], order[j + LcgNext(&s) % (c.e - j)]);
      sel[r * c.k + j] = order[j];
      weight[r * c.k + j] = static_cast<float>(LcgNext(&s) % 1000) / 1000.0f;
    }
  }
  std::vector<int> slots;
  for (int e = 0; e < c.e; ++e) {
    for (int r = 0; r < c.n; ++r) {
      for (int j = 0; j < c.k; ++j) {
        if (sel[r * c.k + j] == e) slots.push_back(r * c.k + j);
      }
    }
  }
  const int rows = static_cast<int>(slots.size()), d = c.d, k = c.k;
  std::vector<float> x = Random(size_t{1} * c.n * d, 1, dt), y = Random(size_t{1} * rows * d, 2, dt);
  std::vector<float> dout = Random(size_t{1} * c.n * d, 3, dt);
  std::vector<float> dxp = Random(size_t{1} * rows * d, 4, dt), dx = Random(size_t{1} * c.n * d, 5, dt);

  // The CPU loops of moe.cc.
  std::vector<float> xp(size_t{1} * rows * d), out(size_t{1} * c.n * d, 0.f);
  std::vector<float> dy(size_t{1} * rows * d), dweight(sel.size(), 0.f), dx_ref = dx;
  for (int r = 0; r < rows; ++r) {
    const int slot = slots[r], tok = slot / k;
    for (int i = 0; i < d; ++i) xp[size_t{1} * r * d + i] = x[size_t{1} * tok * d + i];
    float dot = 0;
    for (int i = 0; i < d; ++i) {
      out[size_t{1} * tok * d + i] += weight[slot] * y[size_t{1} * r * d + i];
      dy[size_t{1} * r * d + i] = weight[slot] * dout[size_t{1} * tok * d + i];
      dot += y[size_t{1} * r * d + i] * dout[size_t{1} * tok * d + i];
      dx_ref[size_t{1} * tok * d + i] += dxp[size_t{1} * r * d + i];
    }
    dweight[slot] = dot;
  }

  DeviceVector<int> gslots(slots), ginv(std::vector<int>(sel.size(), 0));
  DeviceBuffer gw(weight, DType::kF32);
  DeviceBuffer gx(x, dt), gy(y, dt), gdout(dout, dt), gdxp(dxp, dt), gdx(dx, dt);
  DeviceBuffer gxp(std::vector<float>(xp.size(), 0.f), dt), gout(std::vector<float>(out.size(), 0.f), dt);
  DeviceBuffer gdy(std::vector<float>(dy.size(), 0.f), dt), gdw(std::vector<float>(sel.size(), 0.f), DType::kF32);
  ASSERT_TRUE(cuda::MoeInvertSlots(ginv.get(), gslots.get(), rows, c.n, k).ok());
  ASSERT_TRUE(cuda::MoePermute(dt, gxp.get(), gx.get(), gslots.get(), rows, k, d).ok());
  ASSERT_TRUE(cuda::MoeCombine(dt, gout.get(), gy.get(), gw.f32(), ginv.get(), c.n, k, d).ok());
  ASSERT_TRUE(cuda::MoeCombineBackward(dt, gdy.get(), gdw.f32(), gdout.get(), gy.get(), gw.f32(),
                                       gslots.get(), rows, k, d)
                  .ok());
  ASSERT_TRUE(cuda::MoePermuteBackward(dt, gdx.get(), gdxp.get(), ginv.get(), c.n, k, d).ok());
  EXPECT_LT(RelErr(gxp.Download(), xp), dt == DType::kBF16 ? tol : 1e-5) << "permute";
  EXPECT_LT(RelErr(gout.Download(), out), tol) << "combine";
  EXPECT_LT(RelErr(gdy.Download(), dy), tol) << "combine backward dy";
  EXPECT_LT(RelErr(gdw.Download(), dweight), tol) << "combine backward dweight";
  EXPECT_LT(RelErr(gdx.Download(), dx_ref), tol) << "permute backward";
  // The inverse map: every slot is dispatched exactly once.
  std::vector<int> inv(sel.size());
  ASSERT_TRUE(rt::CopyToHost(inv.data(), ginv.get(), inv.size() * 4).ok());
  for (int r = 0; r < rows; ++r) EXPECT_EQ(inv[slots[r]], r);
}

class MoeCuda : public ::testing::TestWithParam<DType> {};

TEST_P(MoeCuda, PermuteCombineMatchCpu) {
  SATDAR_SKIP_WITHOUT_GPU();
  for (const Case& c : {Case{1, 4, 1, 8}, Case{37, 8, 2, 96}, Case{256, 16, 4, 200},
                        Case{64, 64, 8, 513}}) {
    Check(c, GetParam());
  }
}

TEST_P(MoeCuda, RejectsTooLargeTopK) {
  SATDAR_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::MoeCombine(GetParam(), nullptr, nullptr, nullptr, nullptr, 4,
                                cuda::kMoeMaxTopK + 1, 8)
                   .ok());
}

INSTANTIATE_TEST_SUITE_P(DTypes, MoeCuda, ::testing::Values(DType::kF32, DType::kBF16),
                         core::gpu_test::DTypeParamName);

#else  // !SATDAR_WITH_CUDA

TEST(MoeCuda, Skipped) { SATDAR_SKIP_WITHOUT_GPU(); }

#endif  // SATDAR_WITH_CUDA

}  // namespace
}  // namespace satdar::model
