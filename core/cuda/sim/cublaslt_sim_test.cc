// The simulated cuBLASLt (cublaslt_sim.cc) against a naive f64 reference, and its errors.
//
// Tolerance, per element of D (f64 reference over the inputs as the device reads them, bf16
// widened exactly):
//   |D - ref| <= (k + 2) * 2^-23 * (|alpha| sum_p |a_ip b_pj| + |beta c_ij|)    f32 D
//                + 2^-8 |ref|                                                   bf16 D (rounding)
// the bound of an f32 sum of k products plus the final f32 (and bf16) rounding. Where every
// partial sum is exact in f32 (small integers), a bf16 D must equal the round-to-nearest-even
// of the exact value bit for bit.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gtest/gtest.h"

namespace satdar::cuda_sim {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float Round(cudaDataType_t type, float v) {
  return type == CUDA_R_32F ? v : core::BF16ToFloat(core::FloatToBF16(v));
}

// A column-major rows x cols matrix with leading dimension ld, of `type`, held on the host as
// f32 (bf16 values already rounded) and mirrored in one device allocation. The padding rows
// [rows, ld) hold NaN, so reading them or writing over them shows.
class Matrix {
 public:
  Matrix(cudaDataType_t type, int rows, int cols, int ld)
      : type_(type),
        rows_(rows),
        cols_(cols),
        ld_(ld),
        host_(static_cast<size_t>(ld) * cols, kNaN) {
    EXPECT_EQ(cudaMalloc(&dev_, host_.size() * ElementSize()), cudaSuccess);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&layout_, type, rows, cols, ld), CUBLAS_STATUS_SUCCESS);
  }
  ~Matrix() {
    cublasLtMatrixLayoutDestroy(layout_);
    cudaFree(dev_);
  }
  Matrix(const Matrix&) = delete;
  Matrix& operator=(const Matrix&) = delete;

  size_t ElementSize() const { return type_ == CUDA_R_32F ? 4 : 2; }
  size_t Bytes() const { return host_.size() * ElementSize(); }
  float& at(int i, int j) { return host_[i + static_cast<size_t>(j) * ld_]; }
  float at(int i, int j) const { return host_[i + static_cast<size_t>(j) * ld_]; }
  void* dev() const { return dev_; }
  cublasLtMatrixLayout_t layout() const { return layout_; }
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  int ld() const { return ld_; }

  // Random values (integers if asked), or `value` everywhere; then uploads.
  void Fill(std::mt19937* rng, float lo, float hi, bool integers = false) {
    std::uniform_real_distribution<float> u(lo, hi);
    for (int j = 0; j < cols_; ++j) {
      for (int i = 0; i < rows_; ++i) {
        at(i, j) = Round(type_, integers ? std::round(u(*rng)) : u(*rng));
      }
    }
    Upload();
  }
  void Set(float value) {
    for (int j = 0; j < cols_; ++j) {
      for (int i = 0; i < rows_; ++i) at(i, j) = value;
    }
    Upload();
  }
  void Upload() {
    if (type_ == CUDA_R_32F) {
      ASSERT_EQ(cudaMemcpy(dev_, host_.data(), Bytes(), cudaMemcpyHostToDevice), cudaSuccess);
      return;
    }
    std::vector<uint16_t> bits(host_.size());
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = core::FloatToBF16(host_[i]).bits;
    ASSERT_EQ(cudaMemcpy(dev_, bits.data(), Bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // The device contents, all ld * cols elements (padding included).
  std::vector<float> Download() const {
    std::vector<float> out(host_.size());
    if (type_ == CUDA_R_32F) {
      EXPECT_EQ(cudaMemcpy(out.data(), dev_, Bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
      return out;
    }
    std::vector<uint16_t> bits(out.size());
    EXPECT_EQ(cudaMemcpy(bits.data(), dev_, Bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < bits.size(); ++i) out[i] = core::BF16ToFloat(core::BF16{bits[i]});
    return out;
  }

 private:
  cudaDataType_t type_;
  int rows_, cols_, ld_;
  std::vector<float> host_;
  void* dev_ = nullptr;
  cublasLtMatrixLayout_t layout_ = nullptr;
};

class Desc {
 public:
  explicit Desc(cublasOperation_t ta = CUBLAS_OP_N, cublasOperation_t tb = CUBLAS_OP_N,
                cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
    EXPECT_EQ(cublasLtMatmulDescCreate(&d_, compute, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(d_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(d_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
              CUBLAS_STATUS_SUCCESS);
  }
  ~Desc() { cublasLtMatmulDescDestroy(d_); }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cublasLtMatmulDesc_t get() const { return d_; }

 private:
  cublasLtMatmulDesc_t d_ = nullptr;
};

class CublasLtSim : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cublasLtCreate(&lt_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaMalloc(&workspace_, kWorkspace), cudaSuccess);
  }
  void TearDown() override {
    cudaFree(workspace_);
    EXPECT_EQ(cublasLtDestroy(lt_), CUBLAS_STATUS_SUCCESS);
  }

  // The heuristic as gemm_cuda.cu asks it: workspace and the four alignments (default 256).
  cublasStatus_t Heuristic(const Desc& desc, const Matrix& a, const Matrix& b, const Matrix& c,
                           const Matrix& d, cublasLtMatmulAlgo_t* algo, uint32_t align = 256) {
    cublasLtMatmulPreference_t pref = nullptr;
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &kWorkspace, sizeof(kWorkspace)),
              CUBLAS_STATUS_SUCCESS);
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)),
                CUBLAS_STATUS_SUCCESS);
    }
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        lt_, desc.get(), a.layout(), b.layout(), c.layout(), d.layout(), pref, 1, &result, &found);
    EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
    if (st == CUBLAS_STATUS_SUCCESS) {
      EXPECT_EQ(found, 1);
      EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
      EXPECT_LE(result.workspaceSize, kWorkspace);
      *algo = result.algo;
    }
    return st;
  }

  // Heuristic, then Matmul (D == C when c is d) on `stream`, then synchronise.
  cublasStatus_t Run(const Desc& desc, float alpha, const Matrix& a, const Matrix& b, float beta,
                     const Matrix& c, const Matrix& d, cudaStream_t stream = nullptr) {
    cublasLtMatmulAlgo_t algo;
    cublasStatus_t st = Heuristic(desc, a, b, c, d, &algo);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    st = cublasLtMatmul(lt_, desc.get(), &alpha, a.dev(), a.layout(), b.dev(), b.layout(), &beta,
                        c.dev(), c.layout(), d.dev(), d.layout(), &algo, workspace_, kWorkspace,
                        stream);
    EXPECT_EQ(stream == nullptr ? cudaDeviceSynchronize() : cudaStreamSynchronize(stream),
              cudaSuccess);
    return st;
  }

  static constexpr size_t kWorkspace = size_t{1} << 20;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
};

// Checks D (downloaded) against the f64 reference over a, b and c's host values (C as it was
// before the call) within the tolerance at the top; D's padding rows must still be NaN.
void ExpectMatches(cublasOperation_t ta, cublasOperation_t tb, float alpha, const Matrix& a,
                   const Matrix& b, float beta, const Matrix& c, const Matrix& d,
                   cudaDataType_t d_type, bool exact = false) {
  const int m = d.rows(), n = d.cols(), k = ta == CUBLAS_OP_N ? a.cols() : a.rows();
  const std::vector<float> got = d.Download();
  int bad = 0;
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < d.ld(); ++i) {
      const float g = got[i + static_cast<size_t>(j) * d.ld()];
      if (i >= m) {
        if (!std::isnan(g) && ++bad < 5) ADD_FAILURE() << "padding (" << i << "," << j << ")";
        continue;
      }
      double sum = 0, mag = 0;
      for (int p = 0; p < k; ++p) {
        const double x = ta == CUBLAS_OP_N ? a.at(i, p) : a.at(p, i);
        const double y = tb == CUBLAS_OP_N ? b.at(p, j) : b.at(j, p);
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double cij = beta == 0.0f ? 0.0 : static_cast<double>(c.at(i, j));
      const double ref = alpha * sum + beta * cij;
      double tol =
          (k + 2) * std::ldexp(1.0, -23) * (std::fabs(alpha) * mag + std::fabs(beta * cij));
      if (d_type == CUDA_R_16BF) tol += std::ldexp(std::fabs(ref), -8);
      if (exact) tol = 0;
      const double want = exact ? Round(d_type, static_cast<float>(ref)) : ref;
      if (!(std::fabs(g - want) <= tol) && ++bad < 5) {
        ADD_FAILURE() << "D(" << i << "," << j << ") = " << g << ", want " << want << " +- " << tol;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

struct Types {
  cudaDataType_t ab, cd;
};

class CublasLtSimTypes : public CublasLtSim, public ::testing::WithParamInterface<Types> {};

// Every transpose pair, leading dimensions above the rows, alpha and beta, in place (C == D,
// as satdar calls it) and out of place (C != D, other leading dimension).
TEST_P(CublasLtSimTypes, AllTransposesLeadingDimsAlphaBeta) {
  const Types t = GetParam();
  std::mt19937 rng(7);
  const int m = 37, n = 53, k = 129;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T}) {
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      SCOPED_TRACE(testing::Message() << "transa " << ta << " transb " << tb);
      const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
      const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
      Matrix a(t.ab, ar, ac, ar + 3), b(t.ab, br, bc, br + 5);
      Matrix c(t.cd, m, n, m + 2), d(t.cd, m, n, m + 7);
      a.Fill(&rng, -1, 1);
      b.Fill(&rng, -1, 1);
      c.Fill(&rng, -1, 1);
      Desc desc(ta, tb);
      ASSERT_EQ(Run(desc, 0.75f, a, b, -0.5f, c, c), CUBLAS_STATUS_SUCCESS);
      ExpectMatches(ta, tb, 0.75f, a, b, -0.5f, c, c, t.cd);
      c.Upload();  // back to its host values (the device holds the first result)
      d.Set(kNaN);
      ASSERT_EQ(Run(desc, -1.25f, a, b, 2.0f, c, d), CUBLAS_STATUS_SUCCESS);
      ExpectMatches(ta, tb, -1.25f, a, b, 2.0f, c, d, t.cd);
    }
  }
}

// beta == 0 does not read C: NaN in it does not reach D.
TEST_P(CublasLtSimTypes, BetaZeroIgnoresC) {
  const Types t = GetParam();
  std::mt19937 rng(8);
  Matrix a(t.ab, 16, 24, 16), b(t.ab, 24, 9, 30), c(t.cd, 16, 9, 20);
  a.Fill(&rng, -2, 2);
  b.Fill(&rng, -2, 2);
  c.Set(kNaN);
  ASSERT_EQ(Run(Desc(), 1.0f, a, b, 0.0f, c, c), CUBLAS_STATUS_SUCCESS);
  ExpectMatches(CUBLAS_OP_N, CUBLAS_OP_N, 1.0f, a, b, 0.0f, c, c, t.cd);
}

TEST_P(CublasLtSimTypes, OnACreatedStream) {
  const Types t = GetParam();
  std::mt19937 rng(9);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  Matrix a(t.ab, 40, 33, 40), b(t.ab, 65, 33, 70), c(t.cd, 40, 65, 41);
  a.Fill(&rng, -1, 1);
  b.Fill(&rng, -1, 1);
  c.Fill(&rng, -1, 1);
  ASSERT_EQ(Run(Desc(CUBLAS_OP_N, CUBLAS_OP_T), 1.0f, a, b, 1.0f, c, c, s), CUBLAS_STATUS_SUCCESS);
  ExpectMatches(CUBLAS_OP_N, CUBLAS_OP_T, 1.0f, a, b, 1.0f, c, c, t.cd);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(All, CublasLtSimTypes,
                         ::testing::Values(Types{CUDA_R_32F, CUDA_R_32F},
                                           Types{CUDA_R_16BF, CUDA_R_16BF},
                                           Types{CUDA_R_16BF, CUDA_R_32F}),
                         [](const ::testing::TestParamInfo<Types>& info) {
                           return std::string(info.param.ab == CUDA_R_32F ? "F32" : "BF16") + "In" +
                                  (info.param.cd == CUDA_R_32F ? "F32" : "BF16") + "Out";
                         });

// Small integers: every partial sum is exact in f32, so a bf16 D is exactly the RNE rounding of
// the exact result (sums up to ~3000 need rounding to 8 significant bits, ties included).
TEST_F(CublasLtSim, Bf16OutputRoundsToNearestEvenExactly) {
  std::mt19937 rng(10);
  Matrix a(CUDA_R_16BF, 64, 48, 64), b(CUDA_R_16BF, 48, 64, 48), c(CUDA_R_16BF, 64, 64, 64);
  a.Fill(&rng, -8, 8, /*integers=*/true);
  b.Fill(&rng, -8, 8, /*integers=*/true);
  c.Fill(&rng, -64, 64, /*integers=*/true);
  ASSERT_EQ(Run(Desc(), 0.5f, a, b, 1.0f, c, c), CUBLAS_STATUS_SUCCESS);
  ExpectMatches(CUBLAS_OP_N, CUBLAS_OP_N, 0.5f, a, b, 1.0f, c, c, CUDA_R_16BF, /*exact=*/true);
}

TEST_F(CublasLtSim, HeuristicReturnsOneAlgoWithoutWorkspace) {
  Matrix a(CUDA_R_32F, 8, 8, 8), b(CUDA_R_32F, 8, 8, 8), c(CUDA_R_32F, 8, 8, 8);
  Desc desc;
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r[4] = {};
  int found = -1;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, desc.get(), a.layout(), b.layout(), c.layout(),
                                           c.layout(), pref, 4, r, &found),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 1);
  EXPECT_EQ(r[0].workspaceSize, 0u);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, desc.get(), a.layout(), b.layout(), c.layout(),
                                           c.layout(), pref, 0, r, &found),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

TEST_F(CublasLtSim, UnsupportedAttributesAreErrors) {
  Desc desc;
  const auto set = [&](cublasLtMatmulDescAttributes_t attr, auto value) {
    return cublasLtMatmulDescSetAttribute(desc.get(), attr, &value, sizeof(value));
  };
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_DEFAULT}),
            CUBLAS_STATUS_SUCCESS);
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_BIAS,
                               CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_BGRADB}) {
    EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(e)),
              CUBLAS_STATUS_NOT_SUPPORTED)
        << e;
  }
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(nullptr)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t{CUBLAS_OP_C}), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_TRANSC, int32_t{CUBLAS_OP_T}), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_POINTER_MODE, int32_t{CUBLASLT_POINTER_MODE_DEVICE}),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{1}), CUBLAS_STATUS_NOT_SUPPORTED);
  // The library's own checks: the attribute's size, an unknown attribute.
  EXPECT_EQ(set(CUBLASLT_MATMUL_DESC_TRANSA, int64_t{CUBLAS_OP_T}), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(set(static_cast<cublasLtMatmulDescAttributes_t>(999), int32_t{0}),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint32_t mode = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &mode,
                                                 sizeof(mode)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &mode, sizeof(mode)),
            CUBLAS_STATUS_INVALID_VALUE);  // uint64_t
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

TEST_F(CublasLtSim, UnsupportedProblemsAreErrors) {
  std::mt19937 rng(11);
  Matrix a(CUDA_R_32F, 8, 4, 8), b(CUDA_R_32F, 4, 6, 4), c(CUDA_R_32F, 8, 6, 8);
  Matrix bh(CUDA_R_16BF, 4, 6, 4), ch(CUDA_R_16BF, 8, 6, 8), c16f(CUDA_R_16F, 8, 6, 8);
  for (Matrix* x : {&a, &b, &c, &bh, &ch}) x->Fill(&rng, -1, 1);
  cublasLtMatmulAlgo_t algo;
  EXPECT_EQ(
      Heuristic(Desc(CUBLAS_OP_N, CUBLAS_OP_N, CUBLAS_COMPUTE_32F_FAST_TF32), a, b, c, c, &algo),
      CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(Run(Desc(CUBLAS_OP_N, CUBLAS_OP_N, CUBLAS_COMPUTE_16F), 1, a, b, 0, c, c),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(Run(Desc(), 1, a, bh, 0, c, c), CUBLAS_STATUS_NOT_SUPPORTED);   // A f32, B bf16
  EXPECT_EQ(Run(Desc(), 1, a, b, 0, ch, ch), CUBLAS_STATUS_NOT_SUPPORTED);  // f32 in, bf16 out
  EXPECT_EQ(Run(Desc(), 1, a, b, 0, c16f, c16f), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(Run(Desc(), 1, a, b, 0, c, ch), CUBLAS_STATUS_NOT_SUPPORTED);  // C type != D type
  EXPECT_EQ(Run(Desc(CUBLAS_OP_T, CUBLAS_OP_N), 1, a, b, 0, c, c),
            CUBLAS_STATUS_INVALID_VALUE);  // op(A) 4x8 times 4x6
  cublasLtMatrixLayout_t bad_ld = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&bad_ld, CUDA_R_32F, 8, 4, 7), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r = {};
  int found = 0;
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  Desc desc;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, desc.get(), bad_ld, b.layout(), c.layout(),
                                           c.layout(), pref, 1, &r, &found),
            CUBLAS_STATUS_INVALID_VALUE);  // ld 7 < rows 8
  EXPECT_EQ(found, 0);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(bad_ld);
}

TEST_F(CublasLtSim, PointersOutsideDeviceAllocationsAreErrors) {
  std::mt19937 rng(12);
  // A is the first 4 of abig's 12 columns.
  Matrix a(CUDA_R_32F, 8, 4, 8), b(CUDA_R_32F, 4, 6, 4), c(CUDA_R_32F, 8, 6, 8);
  Matrix abig(CUDA_R_32F, 8, 12, 8);
  for (Matrix* x : {&a, &b, &c, &abig}) x->Fill(&rng, -1, 1);
  Desc desc;
  cublasLtMatmulAlgo_t algo;
  ASSERT_EQ(Heuristic(desc, a, b, c, c, &algo, 4), CUBLAS_STATUS_SUCCESS);
  const float one = 1, zero = 0;
  std::vector<float> host(64, 1.0f);
  const auto run = [&](const void* pa, const void* pb, const float* beta, const void* pc, void* pd,
                       void* ws, size_t ws_bytes) {
    return cublasLtMatmul(lt_, desc.get(), &one, pa, a.layout(), pb, b.layout(), beta, pc,
                          c.layout(), pd, c.layout(), &algo, ws, ws_bytes, nullptr);
  };
  EXPECT_EQ(run(a.dev(), b.dev(), &one, c.dev(), c.dev(), workspace_, kWorkspace),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(run(host.data(), b.dev(), &one, c.dev(), c.dev(), nullptr, 0),
            CUBLAS_STATUS_INVALID_VALUE);  // A on the host
  const float* a_end = static_cast<const float*>(a.dev()) + 4;
  EXPECT_EQ(run(a_end, b.dev(), &one, c.dev(), c.dev(), nullptr, 0),
            CUBLAS_STATUS_INVALID_VALUE);  // A runs past its allocation
  EXPECT_EQ(run(a.dev(), b.dev(), &one, c.dev(), host.data(), nullptr, 0),
            CUBLAS_STATUS_INVALID_VALUE);  // D on the host
  EXPECT_EQ(run(a.dev(), b.dev(), &one, host.data(), c.dev(), nullptr, 0),
            CUBLAS_STATUS_INVALID_VALUE);  // C read (beta 1) on the host
  EXPECT_EQ(run(a.dev(), b.dev(), &one, c.dev(), c.dev(), host.data(), 64),
            CUBLAS_STATUS_INVALID_VALUE);  // workspace on the host
  float* abig_col1 = static_cast<float*>(abig.dev()) + 8;
  EXPECT_EQ(run(abig.dev(), b.dev(), &zero, c.dev(), abig_col1, nullptr, 0),
            CUBLAS_STATUS_INVALID_VALUE);  // D overlaps A
  EXPECT_EQ(
      run(abig.dev(), b.dev(), &zero, c.dev(), static_cast<float*>(abig.dev()) + 32, nullptr, 0),
      CUBLAS_STATUS_SUCCESS);  // D right after A in one allocation
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // beta 0: C is not read, so any C pointer will do.
  EXPECT_EQ(run(a.dev(), b.dev(), &zero, nullptr, c.dev(), nullptr, 0), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The algorithm keeps what the heuristic was promised: pointers aligned to the promised bytes,
// and the matrix types.
TEST_F(CublasLtSim, AlgoPromisesAreChecked) {
  std::mt19937 rng(13);
  Matrix a(CUDA_R_32F, 8, 4, 8), b(CUDA_R_32F, 4, 6, 4), c(CUDA_R_32F, 8, 6, 8);
  Matrix big(CUDA_R_32F, 8, 6, 9), ah(CUDA_R_16BF, 8, 4, 8), bh(CUDA_R_16BF, 4, 6, 4);
  for (Matrix* x : {&a, &b, &c, &big, &ah, &bh}) x->Fill(&rng, -1, 1);
  Desc desc;
  cublasLtMatmulAlgo_t algo;
  ASSERT_EQ(Heuristic(desc, a, b, c, c, &algo), CUBLAS_STATUS_SUCCESS);  // 256 promised
  const float one = 1;
  void* d_off = static_cast<float*>(big.dev()) + 1;  // 4-byte aligned, inside the allocation
  EXPECT_EQ(cublasLtMatmul(lt_, desc.get(), &one, a.dev(), a.layout(), b.dev(), b.layout(), &one,
                           d_off, c.layout(), d_off, c.layout(), &algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(
      cublasLtMatmul(lt_, desc.get(), &one, ah.dev(), ah.layout(), bh.dev(), bh.layout(), &one,
                     c.dev(), c.layout(), c.dev(), c.layout(), &algo, nullptr, 0, nullptr),
      CUBLAS_STATUS_NOT_SUPPORTED);  // algo of an f32 problem for a bf16 one
  cublasLtMatmulAlgo_t zeroed = {};
  EXPECT_EQ(cublasLtMatmul(lt_, desc.get(), &one, a.dev(), a.layout(), b.dev(), b.layout(), &one,
                           c.dev(), c.layout(), c.dev(), c.layout(), &zeroed, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  // algo nullptr: the library's implicit heuristic.
  EXPECT_EQ(cublasLtMatmul(lt_, desc.get(), &one, a.dev(), a.layout(), b.dev(), b.layout(), &one,
                           d_off, c.layout(), d_off, c.layout(), nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Not a check: the f32 throughput of a 512^3 GEMM, printed.
TEST_F(CublasLtSim, Gflops512) {
  std::mt19937 rng(14);
  const int s = 512;
  Matrix a(CUDA_R_32F, s, s, s), b(CUDA_R_32F, s, s, s), c(CUDA_R_32F, s, s, s);
  Matrix ah(CUDA_R_16BF, s, s, s), bh(CUDA_R_16BF, s, s, s), ch(CUDA_R_16BF, s, s, s);
  for (Matrix* x : {&a, &b, &c, &ah, &bh, &ch}) x->Fill(&rng, -1, 1);
  Desc desc(CUBLAS_OP_T, CUBLAS_OP_N);
  for (bool bf16 : {false, true}) {
    const Matrix &x = bf16 ? ah : a, &y = bf16 ? bh : b, &z = bf16 ? ch : c;
    ASSERT_EQ(Run(desc, 1.0f, x, y, 0.0f, z, z), CUBLAS_STATUS_SUCCESS);  // warm up
    const int iters = 10;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      ASSERT_EQ(Run(desc, 1.0f, x, y, 1.0f, z, z), CUBLAS_STATUS_SUCCESS);
    }
    const double sec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::printf("512x512x512 %s GEMM: %.1f GFLOP/s\n", bf16 ? "bf16" : "f32",
                2.0 * s * s * s / sec * 1e-9);
  }
}

}  // namespace
}  // namespace satdar::cuda_sim
