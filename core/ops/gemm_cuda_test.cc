// cuBLASLt GEMM / linear layer against the CPU path (gemm.h, matmul.h). Skips without a CUDA
// build or without a GPU.
//
// Tolerances (max |gpu - cpu| / max |cpu| over the output):
//   f32:  1e-4  (CUBLAS_COMPUTE_32F, no TF32; only the summation order differs)
//   bf16: 2e-2  (inputs rounded to bf16 before both paths, so the gap is the bf16 rounding of
//                the output and of accumulated gradients, plus order)
#include "core/ops/gemm_cuda.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/dtype.h"
#include "core/exec.h"
#include "core/ops/gemm.h"
#include "core/ops/matmul.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"

namespace satdar::core {
namespace {

#ifdef SATDAR_WITH_CUDA

using gpu_test::DeviceBuffer;
using gpu_test::Quantize;
using gpu_test::RelErr;

std::vector<float> Random(size_t n, uint32_t seed) {
  return gpu_test::RandomUniform(n, seed, /*offset=*/1);
}

double Tol(DType dtype) { return dtype == DType::kBF16 ? 2e-2 : 1e-4; }

class GemmCuda : public ::testing::TestWithParam<DType> {};

TEST_P(GemmCuda, GeneralGemmAllTransposes) {
  SATDAR_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  auto h = cuda::GemmHandle::Create();
  ASSERT_TRUE(h.ok()) << h.status();
  const int m = 37, n = 53, k = 129;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = ta ? m : k, ldb = tb ? k : n;
      std::vector<float> a = Random(static_cast<size_t>(m) * k, 1), b = Random(size_t{1} * k * n, 2);
      std::vector<float> c = Random(static_cast<size_t>(m) * n, 3);
      Quantize(&a, dt);
      Quantize(&b, dt);
      Quantize(&c, dt);
      DeviceBuffer da(a, dt), db(b, dt), dc(c, dt);
      cpu::Gemm<float>(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), n);
      ASSERT_TRUE((*h)->Gemm(dt, ta, tb, m, n, k, 0.5f, da.get(), lda, db.get(), ldb, 1.0f,
                             dc.get(), n)
                      .ok());
      EXPECT_LT(RelErr(dc.Download(), c), Tol(dt)) << "trans_a " << ta << " trans_b " << tb;
    }
  }
  EXPECT_EQ((*h)->CachedAlgorithms(), 4u);
}

// k == 0 is an empty sum: C = beta C, for beta 0, 1 and anything else.
TEST_P(GemmCuda, EmptySumScalesC) {
  SATDAR_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  auto h = cuda::GemmHandle::Create();
  ASSERT_TRUE(h.ok()) << h.status();
  const int m = 5, n = 7;
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    std::vector<float> c = Random(static_cast<size_t>(m) * n, 4);
    Quantize(&c, dt);
    DeviceBuffer dc(c, dt);
    ASSERT_TRUE((*h)->Gemm(dt, false, false, m, n, 0, 1.0f, nullptr, 1, nullptr, n, beta,
                           dc.get(), n)
                    .ok());
    for (float& v : c) v *= beta;
    EXPECT_LT(RelErr(dc.Download(), c), Tol(dt)) << "beta " << beta;
  }
}

TEST_P(GemmCuda, LinearForwardBackwardMatchesCpu) {
  SATDAR_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  auto h = cuda::GemmHandle::Create();
  ASSERT_TRUE(h.ok()) << h.status();
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{nullptr, h->get(), nullptr};
  struct Shape { int m, n, k; };
  for (Shape s : {Shape{64, 96, 128}, Shape{7, 33, 65}, Shape{256, 512, 64}}) {
    std::vector<float> x = Random(size_t{1} * s.m * s.k, 4), w = Random(size_t{1} * s.n * s.k, 5);
    std::vector<float> dout = Random(size_t{1} * s.m * s.n, 6);
    std::vector<float> dx = Random(size_t{1} * s.m * s.k, 7), dw = Random(size_t{1} * s.n * s.k, 8);
    for (auto* v : {&x, &w, &dout, &dx, &dw}) Quantize(v, dt);
    DeviceBuffer gx(x, dt), gw(w, dt), gdout(dout, dt), gdx(dx, dt), gdw(dw, dt);
    DeviceBuffer gout(std::vector<float>(size_t{1} * s.m * s.n, 0.f), dt);
    std::vector<float> out(size_t{1} * s.m * s.n);
    ASSERT_TRUE(ops::MatmulForward(on_cpu, out.data(), x.data(), w.data(), s.m, s.n, s.k).ok());
    ASSERT_TRUE(ops::MatmulBackward(on_cpu, dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                    s.m, s.n, s.k)
                    .ok());
    ASSERT_TRUE(ops::MatmulForward(on_gpu, dt, gout.get(), gx.get(), gw.get(), s.m, s.n, s.k).ok());
    ASSERT_TRUE(ops::MatmulBackward(on_gpu, dt, gdx.get(), gdw.get(), gdout.get(), gx.get(),
                                    gw.get(), s.m, s.n, s.k)
                    .ok());
    EXPECT_LT(RelErr(gout.Download(), out), Tol(dt)) << "out m=" << s.m;
    EXPECT_LT(RelErr(gdx.Download(), dx), Tol(dt)) << "dinp m=" << s.m;
    EXPECT_LT(RelErr(gdw.Download(), dw), Tol(dt)) << "dweight m=" << s.m;
  }
}

// The typed form of the linear layer (T = float), and a context without a GEMM handle.
TEST(GemmCudaExec, TypedFormAndMissingHandle) {
  SATDAR_SKIP_WITHOUT_GPU();
  auto h = cuda::GemmHandle::Create();
  ASSERT_TRUE(h.ok()) << h.status();
  ThreadPool pool(2);
  const int m = 7, n = 33, k = 65;
  std::vector<float> x = Random(size_t{1} * m * k, 4), w = Random(size_t{1} * n * k, 5);
  std::vector<float> out(size_t{1} * m * n);
  ASSERT_TRUE(ops::MatmulForward(CpuExec{&pool}, out.data(), x.data(), w.data(), m, n, k).ok());
  DeviceBuffer gx(x, DType::kF32), gw(w, DType::kF32);
  DeviceBuffer gout(std::vector<float>(out.size(), 0.f), DType::kF32);
  ASSERT_TRUE(ops::MatmulForward(CudaExec{nullptr, h->get(), nullptr}, gout.f32(), gx.f32(),
                                 gw.f32(), m, n, k)
                  .ok());
  EXPECT_LT(RelErr(gout.Download(), out), Tol(DType::kF32));
  EXPECT_EQ(ops::MatmulForward(CudaExec{}, gout.f32(), gx.f32(), gw.f32(), m, n, k).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Also GroupedMatmulBackwardF32 (MoE experts with fp32 weight gradients).
TEST_P(GemmCuda, GroupedMatchesPerGroupCpu) {
  SATDAR_SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  auto h = cuda::GemmHandle::Create();
  ASSERT_TRUE(h.ok()) << h.status();
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{nullptr, h->get(), nullptr};
  const int n = 48, k = 80;
  const std::vector<int> rows = {5, 0, 17, 1, 33};
  int total = 0;
  for (int r : rows) total += r;
  std::vector<float> x = Random(size_t{1} * total * k, 9), dout = Random(size_t{1} * total * n, 10);
  std::vector<float> dx(size_t{1} * total * k, 0.f);
  Quantize(&x, dt);
  Quantize(&dout, dt);
  std::vector<std::vector<float>> w, dw;
  std::vector<std::unique_ptr<DeviceBuffer>> gw, gdw;
  std::vector<const void*> wp;
  std::vector<void*> dwp;
  for (size_t g = 0; g < rows.size(); ++g) {
    w.push_back(Random(size_t{1} * n * k, 20 + g));
    Quantize(&w.back(), dt);
    dw.emplace_back(size_t{1} * n * k, 0.f);
    gw.push_back(std::make_unique<DeviceBuffer>(w.back(), dt));
    gdw.push_back(std::make_unique<DeviceBuffer>(dw.back(), dt));
    wp.push_back(gw.back()->get());
    dwp.push_back(gdw.back()->get());
  }
  std::vector<float> out(size_t{1} * total * n);
  int r0 = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    if (rows[g] > 0) {
      ASSERT_TRUE(ops::MatmulForward(on_cpu, out.data() + size_t{1} * r0 * n,
                                     x.data() + size_t{1} * r0 * k, w[g].data(), rows[g], n, k)
                      .ok());
      ASSERT_TRUE(ops::MatmulBackward(on_cpu, dx.data() + size_t{1} * r0 * k, dw[g].data(),
                                      dout.data() + size_t{1} * r0 * n,
                                      x.data() + size_t{1} * r0 * k, w[g].data(), rows[g], n, k)
                      .ok());
    }
    r0 += rows[g];
  }
  DeviceBuffer gx(x, dt), gdout(dout, dt), gout(std::vector<float>(out.size(), 0.f), dt);
  DeviceBuffer gdx0(std::vector<float>(dx.size(), 0.f), dt);  // the CPU's dx also started at zero
  const int groups = static_cast<int>(rows.size());
  ASSERT_TRUE(cuda::GroupedMatmulForward(on_gpu, dt, gout.get(), gx.get(), wp.data(), rows.data(),
                                         groups, n, k)
                  .ok());
  ASSERT_TRUE(cuda::GroupedMatmulBackward(on_gpu, dt, gdx0.get(), dwp.data(), gdout.get(), gx.get(),
                                          wp.data(), rows.data(), groups, n, k)
                  .ok());
  EXPECT_LT(RelErr(gout.Download(), out), Tol(dt));
  EXPECT_LT(RelErr(gdx0.Download(), dx), Tol(dt));
  for (size_t g = 0; g < rows.size(); ++g) {
    if (rows[g] > 0) {
      EXPECT_LT(RelErr(gdw[g]->Download(), dw[g]), Tol(dt)) << "group " << g;
    }
  }
  // The mixed-precision form: dx overwritten (starts as garbage), fp32 dW accumulated onto 1.
  DeviceBuffer gdx1(std::vector<float>(dx.size(), 7.f), dt);
  std::vector<std::unique_ptr<DeviceBuffer>> gdw32;
  std::vector<float*> dwp32;
  for (size_t g = 0; g < rows.size(); ++g) {
    gdw32.push_back(
        std::make_unique<DeviceBuffer>(std::vector<float>(dw[g].size(), 1.f), DType::kF32));
    dwp32.push_back(gdw32.back()->f32());
  }
  ASSERT_TRUE(cuda::GroupedMatmulBackwardF32(on_gpu, dt, gdx1.get(), dwp32.data(), gdout.get(),
                                             gx.get(), wp.data(), rows.data(), groups, n, k)
                  .ok());
  EXPECT_LT(RelErr(gdx1.Download(), dx), Tol(dt)) << "mixed dx";
  for (size_t g = 0; g < rows.size(); ++g) {
    std::vector<float> want = dw[g];
    for (float& v : want) v += 1.f;
    EXPECT_LT(RelErr(gdw32[g]->Download(), want), Tol(dt)) << "mixed group " << g;
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, GemmCuda, ::testing::Values(DType::kF32, DType::kBF16),
                         gpu_test::DTypeParamName);

#else  // !SATDAR_WITH_CUDA

TEST(GemmCuda, Skipped) { SATDAR_SKIP_WITHOUT_GPU(); }

#endif  // SATDAR_WITH_CUDA

}  // namespace
}  // namespace satdar::core
