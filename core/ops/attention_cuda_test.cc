// Flash-style causal GQA attention on the GPU against the CPU path (attention.h). Skips
// without a CUDA build or without a GPU.
//
// Shapes cover T not a multiple of the tile (1, 37, 130, 200), every head-size bucket
// (HS 16, 32, 48, 64, 128), MHA (NKV = NH), GQA (NH/NKV = 2, 4) and MQA (NKV = 1).
// Tolerances (max |gpu - cpu| / max |cpu| per output; dq/dk/dv start non-zero to check +=):
//   f32:  1e-4  (fp32 throughout; online softmax and summation order differ)
//   bf16: 2e-2  (inputs rounded to bf16 before both paths; outputs and gradients stored bf16)
// Also checked: the saved log-sum-exp against log(sum(exp(scores))) from the CPU's
// probabilities (f32: 1e-4 absolute); the KV-cache forward against the CPU's, with the
// same tolerances, and against the training kernel (past 0) bit for bit.
#include "core/ops/attention_cuda.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/cuda/workspace.h"
#include "core/dtype.h"
#include "core/exec.h"
#include "core/ops/attention.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"

namespace satdar::core {
namespace {

#ifdef SATDAR_WITH_CUDA

using gpu_test::DeviceBuffer;
using gpu_test::Quantize;
using gpu_test::RelErr;

std::vector<float> Random(size_t n, uint32_t seed, float amp) {
  return gpu_test::RandomUniform(n, seed, /*offset=*/7, amp);
}

struct Shape {
  int b, t, nh, nkv, hs;
};

std::string Name(const Shape& s, DType dt) {
  return std::string(DTypeName(dt)) + " b" + std::to_string(s.b) + " t" + std::to_string(s.t) +
         " nh" + std::to_string(s.nh) + " nkv" + std::to_string(s.nkv) + " hs" +
         std::to_string(s.hs);
}

void CheckShape(const Shape& s, DType dt) {
  SCOPED_TRACE(Name(s, dt));
  const double tol = dt == DType::kBF16 ? 2e-2 : 1e-4;
  const size_t nq = size_t{1} * s.b * s.t * s.nh * s.hs, nk = size_t{1} * s.b * s.t * s.nkv * s.hs;
  // Amplitude 4 makes the softmax peaked enough that the max-subtraction matters.
  std::vector<float> q = Random(nq, 1, 4.f), k = Random(nk, 2, 4.f), v = Random(nk, 3, 2.f);
  std::vector<float> dout = Random(nq, 4, 2.f);
  std::vector<float> dq = Random(nq, 5, 0.5f), dk = Random(nk, 6, 0.5f), dv = Random(nk, 7, 0.5f);
  for (auto* x : {&q, &k, &v, &dout, &dq, &dk, &dv}) Quantize(x, dt);
  DeviceBuffer gq(q, dt), gk(k, dt), gv(v, dt), gdout(dout, dt), gdq(dq, dt), gdk(dk, dt), gdv(dv, dt);
  DeviceBuffer gout(std::vector<float>(nq, 0.f), dt);
  const size_t rows = size_t{1} * s.b * s.nh * s.t;
  DeviceBuffer glse(std::vector<float>(rows, 0.f), DType::kF32);

  ThreadPool pool(4);
  const CpuExec on_cpu{&pool};
  cuda::CachingAllocator alloc;
  cuda::Workspace workspace(&alloc, nullptr);  // the backward's delta scratch
  const CudaExec on_gpu{nullptr, nullptr, &workspace};
  std::vector<float> out(nq), probs(rows * s.t);
  // The CPU keeps probs, CUDA lse (ops.h): the argument lists differ there.
  ASSERT_TRUE(ops::AttentionForward(on_cpu, out.data(), probs.data(), q.data(), k.data(), v.data(),
                                    s.b, s.t, s.nh, s.nkv, s.hs)
                  .ok());
  ASSERT_TRUE(ops::AttentionBackward(on_cpu, dq.data(), dk.data(), dv.data(), dout.data(),
                                     probs.data(), q.data(), k.data(), v.data(), s.b, s.t, s.nh,
                                     s.nkv, s.hs)
                  .ok());

  ASSERT_TRUE(ops::AttentionForward(on_gpu, dt, gout.get(), glse.f32(), gq.get(), gk.get(),
                                    gv.get(), s.b, s.t, s.nh, s.nkv, s.hs)
                  .ok());
  ASSERT_TRUE(ops::AttentionBackward(on_gpu, dt, gdq.get(), gdk.get(), gdv.get(), gdout.get(),
                                     gout.get(), glse.f32(), gq.get(), gk.get(), gv.get(), s.b, s.t,
                                     s.nh, s.nkv, s.hs)
                  .ok());
  EXPECT_LT(RelErr(gout.Download(), out), tol) << "out";
  EXPECT_LT(RelErr(gdq.Download(), dq), tol) << "dq";
  EXPECT_LT(RelErr(gdk.Download(), dk), tol) << "dk";
  EXPECT_LT(RelErr(gdv.Download(), dv), tol) << "dv";
  if (dt == DType::kF32) {
    // lse_i = s_i0 - log p_i0 for the first key (always causal-visible).
    const std::vector<float> lse = glse.Download();
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
    double worst = 0;
    for (int bi = 0; bi < s.b; ++bi) {
      for (int h = 0; h < s.nh; ++h) {
        const int g = h / (s.nh / s.nkv);
        for (int i = 0; i < s.t; ++i) {
          double dot = 0;
          for (int d = 0; d < s.hs; ++d) {
            dot += static_cast<double>(q[((size_t{1} * bi * s.t + i) * s.nh + h) * s.hs + d]) *
                   k[((size_t{1} * bi * s.t) * s.nkv + g) * s.hs + d];
          }
          const size_t row = (size_t{1} * bi * s.nh + h) * s.t + i;
          const double want = scale * dot - std::log(static_cast<double>(probs[row * s.t]));
          worst = std::max(worst, std::fabs(want - lse[row]));
        }
      }
    }
    EXPECT_LT(worst, 1e-4) << "lse";
  }
}

// The KV-cache forward (AttentionCachedForward): against the CPU's on a cache with room left
// (cap > past + tn), and with past = 0, tn = cap = t against the training kernel bit for bit.
void CheckCached(const Shape& s, DType dt) {
  SCOPED_TRACE(Name(s, dt));
  const double tol = dt == DType::kBF16 ? 2e-2 : 1e-4;
  const int qd = s.nh * s.hs, kd = s.nkv * s.hs, cap = s.t + 3;
  const size_t nq = size_t{1} * s.b * s.t * qd, nk = size_t{1} * s.b * cap * kd;
  std::vector<float> q = Random(nq, 11, 4.f), k = Random(nk, 12, 4.f), v = Random(nk, 13, 2.f);
  for (auto* x : {&q, &k, &v}) Quantize(x, dt);
  ThreadPool pool(4);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};
  DeviceBuffer gk(k, dt), gv(v, dt);
  for (int past : {0, 1, s.t / 2, s.t - 1}) {
    for (int tn : {1, s.t - past}) {
      if (tn < 1 || past + tn > s.t) continue;
      SCOPED_TRACE(::testing::Message() << "past " << past << " tn " << tn);
      const std::vector<float> qn(q.begin(), q.begin() + size_t{1} * s.b * tn * qd);
      std::vector<float> want(qn.size());
      ASSERT_TRUE(ops::AttentionCachedForward(on_cpu, want.data(), qn.data(), k.data(), v.data(),
                                              s.b, tn, past, cap, s.nh, s.nkv, s.hs)
                      .ok());
      DeviceBuffer gq(qn, dt), gout(std::vector<float>(qn.size(), 0.f), dt);
      DeviceBuffer glse(std::vector<float>(size_t{1} * s.b * s.nh * tn, 0.f), DType::kF32);
      ASSERT_TRUE(ops::AttentionCachedForward(on_gpu, dt, gout.get(), glse.f32(), gq.get(),
                                              gk.get(), gv.get(), s.b, tn, past, cap, s.nh,
                                              s.nkv, s.hs)
                      .ok());
      EXPECT_LT(RelErr(gout.Download(), want), tol);
      // lse may be null.
      DeviceBuffer gout2(std::vector<float>(qn.size(), 0.f), dt);
      ASSERT_TRUE(ops::AttentionCachedForward(on_gpu, dt, gout2.get(), nullptr, gq.get(),
                                              gk.get(), gv.get(), s.b, tn, past, cap, s.nh,
                                              s.nkv, s.hs)
                      .ok());
      EXPECT_EQ(gout2.Download(), gout.Download());
    }
  }
  // past = 0, tn = cap = t: the training kernel's output and lse, bit for bit.
  const size_t nt = size_t{1} * s.b * s.t * kd;
  const std::vector<float> kt = Random(nt, 14, 4.f), vt = Random(nt, 15, 2.f);
  DeviceBuffer gq(q, dt), gkt(kt, dt), gvt(vt, dt);
  DeviceBuffer a(std::vector<float>(nq, 0.f), dt), b(std::vector<float>(nq, 0.f), dt);
  const size_t rows = size_t{1} * s.b * s.nh * s.t;
  DeviceBuffer la(std::vector<float>(rows, 0.f), DType::kF32);
  DeviceBuffer lb(std::vector<float>(rows, 0.f), DType::kF32);
  ASSERT_TRUE(ops::AttentionForward(on_gpu, dt, a.get(), la.f32(), gq.get(), gkt.get(), gvt.get(),
                                    s.b, s.t, s.nh, s.nkv, s.hs)
                  .ok());
  ASSERT_TRUE(ops::AttentionCachedForward(on_gpu, dt, b.get(), lb.f32(), gq.get(), gkt.get(),
                                          gvt.get(), s.b, s.t, 0, s.t, s.nh, s.nkv, s.hs)
                  .ok());
  EXPECT_EQ(a.Download(), b.Download());
  EXPECT_EQ(la.Download(), lb.Download());
}

class AttentionCuda : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionCuda, CachedForwardMatchesCpu) {
  SATDAR_SKIP_WITHOUT_GPU();
  for (const Shape& s : {Shape{2, 1, 4, 2, 16}, Shape{2, 37, 4, 2, 32}, Shape{1, 130, 8, 2, 64},
                         Shape{2, 65, 4, 4, 128}, Shape{1, 70, 4, 1, 48}}) {
    CheckCached(s, GetParam());
  }
  // Positions past the cache.
  EXPECT_EQ(cuda::AttentionCachedForward(CudaExec{}, GetParam(), nullptr, nullptr, nullptr,
                                         nullptr, nullptr, 1, 3, 2, 4, 4, 4, 64)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(AttentionCuda, ForwardBackwardMatchCpu) {
  SATDAR_SKIP_WITHOUT_GPU();
  for (const Shape& s : {Shape{2, 1, 4, 2, 16}, Shape{2, 37, 4, 2, 32}, Shape{1, 130, 8, 2, 64},
                         Shape{2, 65, 4, 4, 128}, Shape{1, 200, 4, 1, 48},
                         Shape{3, 64, 8, 2, 32}}) {
    CheckShape(s, GetParam());
  }
}

TEST_P(AttentionCuda, RejectsBadShapes) {
  SATDAR_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda::AttentionForward(CudaExec{}, GetParam(), nullptr, nullptr, nullptr, nullptr,
                                      nullptr, 1, 8, 6, 4, 64)
                   .ok());  // NH not a multiple of NKV
  EXPECT_FALSE(cuda::AttentionForward(CudaExec{}, GetParam(), nullptr, nullptr, nullptr, nullptr,
                                      nullptr, 1, 8, 4, 4, 256)
                   .ok());  // HS > 128
  // The backward's scratch comes from the context's workspace.
  EXPECT_EQ(cuda::AttentionBackward(CudaExec{}, GetParam(), nullptr, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 4, 4, 64)
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(DTypes, AttentionCuda, ::testing::Values(DType::kF32, DType::kBF16),
                         gpu_test::DTypeParamName);

#else  // !SATDAR_WITH_CUDA

TEST(AttentionCuda, Skipped) { SATDAR_SKIP_WITHOUT_GPU(); }

#endif  // SATDAR_WITH_CUDA

}  // namespace
}  // namespace satdar::core
