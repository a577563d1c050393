// The CUDA kernels of core/ops/cuda_ops.h against their CPU references (core/ops/*_cpu.cc), on
// random inputs, forward and backward, in f32 and bf16. Skips without a CUDA build or a GPU.
//
// Tolerances. An element passes when |gpu - cpu| <= rtol * max(|cpu|, rms(cpu)), where rms is
// over the whole compared array (so elements that are sums with cancellation are judged on the
// array's scale, not on their own tiny value).
//   f32:  rtol 1e-5 for everything (both sides compute in fp32; only the order of additions and
//         contractions differ). The embedding gradient adds in token order on both sides and
//         is expected bit-identical; it is checked with rtol 1e-6.
//   bf16: the CPU reference runs in f32 on the same bf16-rounded inputs (and, for outputs that
//         accumulate, the same bf16-rounded initial values). Outputs stored in bf16 (RMSNorm
//         out and dinp, RoPE, SwiGLU, cross-entropy dlogits) get rtol 1e-2: one rounding to
//         bf16 is at most 2^-9 ~ 2e-3 relative, plus fp32 noise. fp32 outputs computed from
//         bf16 inputs (rstd, dweight, losses, dtable) get rtol 1e-4. The embedding lookup is a
//         copy and is checked exactly (rtol 0).
//   Vocabulary-parallel ops (vocab_parallel.h), same rules: the slice lookup, the masked
//   logits, the row max and the target logit are copies or exact maxima of the same values
//   and are checked exactly; the slice's table gradient adds in token order on both sides
//   (rtol 1e-6, expected bit-identical); sum_exp, lse and losses are fp32 outputs (rtol 1e-5
//   in f32, 1e-4 from bf16 inputs; the CPU sums in double, the GPU in fp32 in a fixed tree);
//   dlogits are stored in T (1e-5 f32, 1e-2 bf16).
//   Elementwise (elementwise.h): copies and fills are exact; a sum of two values of T is one
//   rounding on both sides (the CPU reference adds the same bf16-rounded values in f32 and
//   rounds once through Quantize), so it is checked exactly too. CastFromF32 is one rounding
//   of an fp32 value and must equal __float2bfloat16's (exact). The fp64 sums (AccumulateSum,
//   AccumulateColumns, SumSquares) add the same fp32 values in another order than the CPU's
//   index order: rtol
//   1e-12 of the result; AccumulateValue adds exactly representable values and is exact.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/cuda/allocator.h"
#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/cuda/workspace.h"
#include "core/dtype.h"
#include "core/exec.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/cuda_ops.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/ops.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/rope.h"
#include "core/ops/swiglu.h"
#include "core/ops/vocab_parallel.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace satdar::core {
namespace {

#ifdef SATDAR_WITH_CUDA

using gpu_test::Bf16;
using gpu_test::DeviceArray;
using gpu_test::DeviceVector;
using gpu_test::ExpectClose;
using gpu_test::kIsBf16;
using gpu_test::Quantize;
using gpu_test::RandomNormal;
using gpu_test::RandomTokens;

constexpr double kF32Tol = 1e-5;

template <typename T>
double StoredTol(double bf16_tol) {
  return kIsBf16<T> ? bf16_tol : kF32Tol;
}

template <typename T>
void CheckRmsNorm() {
  const int n = 37, c = 300;
  const double eps = 1e-5;
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  const auto x = Quantize<T>(RandomNormal(n * c, 1));
  const auto w = Quantize<T>(RandomNormal(c, 2, 0.5f));
  const auto dy = Quantize<T>(RandomNormal(n * c, 3));
  const auto dx0 = Quantize<T>(RandomNormal(n * c, 4, 0.1f));
  const auto dw0 = RandomNormal(c, 5, 0.1f);
  std::vector<float> out(n * c), rstd(n), dx = dx0, dw = dw0;
  ASSERT_TRUE(
      ops::RmsNormForward(on_cpu, out.data(), rstd.data(), x.data(), w.data(), n, c, eps).ok());
  ASSERT_TRUE(ops::RmsNormBackward(on_cpu, dx.data(), dw.data(), dy.data(), x.data(), w.data(),
                                   rstd.data(), n, c)
                  .ok());
  DeviceArray<T> gx(x), gw(w), gdy(dy), gdx(dx0), gout(n * c);
  DeviceArray<float> grstd(n), gdw(dw0);
  ASSERT_TRUE(ops::RmsNormForward(on_gpu, gout.get(), grstd.get(), gx.get(), gw.get(), n, c,
                                  static_cast<float>(eps))
                  .ok());
  ASSERT_TRUE(ops::RmsNormBackward(on_gpu, gdx.get(), gdw.get(), gdy.get(), gx.get(), gw.get(),
                                   grstd.get(), n, c)
                  .ok());
  ExpectClose(gout.Download(), out, StoredTol<T>(1e-2), "rmsnorm out");
  ExpectClose(grstd.Download(), rstd, StoredTol<T>(1e-4), "rmsnorm rstd");
  ExpectClose(gdx.Download(), dx, StoredTol<T>(1e-2), "rmsnorm dinp");
  ExpectClose(gdw.Download(), dw, StoredTol<T>(1e-4), "rmsnorm dweight");
  // In place (out aliases inp), as the header allows.
  ASSERT_TRUE(ops::RmsNormForward(on_gpu, gx.get(), grstd.get(), gx.get(), gw.get(), n, c,
                                  static_cast<float>(eps))
                  .ok());
  ExpectClose(gx.Download(), out, StoredTol<T>(1e-2), "rmsnorm out (in place)");
}

template <typename T>
void CheckRope() {
  const int b = 2, t = 7, nh = 3, hs = 16;
  const size_t size = static_cast<size_t>(b) * t * nh * hs;
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  std::vector<float> cos, sin;
  cpu::RopeTables(&cos, &sin, t, hs, 10000.0);
  const auto x0 = Quantize<T>(RandomNormal(size, 11));
  const auto dx0 = Quantize<T>(RandomNormal(size, 12));
  std::vector<float> x = x0, dx = dx0;
  ASSERT_TRUE(ops::RopeForward(on_cpu, x.data(), cos.data(), sin.data(), b, t, nh, hs).ok());
  ASSERT_TRUE(ops::RopeBackward(on_cpu, dx.data(), cos.data(), sin.data(), b, t, nh, hs).ok());
  DeviceArray<float> gcos(cos), gsin(sin);
  DeviceArray<T> gx(x0), gdx(dx0);
  ASSERT_TRUE(ops::RopeForward(on_gpu, gx.get(), gcos.get(), gsin.get(), b, t, nh, hs).ok());
  ASSERT_TRUE(ops::RopeBackward(on_gpu, gdx.get(), gcos.get(), gsin.get(), b, t, nh, hs).ok());
  ExpectClose(gx.Download(), x, StoredTol<T>(1e-2), "rope forward");
  ExpectClose(gdx.Download(), dx, StoredTol<T>(1e-2), "rope backward");
}

template <typename T>
void CheckSwiglu() {
  const int n = 33, f = 129;
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  const auto gu = Quantize<T>(RandomNormal(static_cast<size_t>(n) * 2 * f, 21, 2.0f));
  const auto dout = Quantize<T>(RandomNormal(static_cast<size_t>(n) * f, 22));
  // One call text for both devices (ops.h): the same lambdas run the CPU reference and the
  // kernels, the exec and the element type choosing the overload.
  const auto forward = [&](const auto& x, auto* y, const auto* gate_up) {
    return ops::SwigluForward(x, y, gate_up, n, f);
  };
  const auto backward = [&](const auto& x, auto* dgate_up, const auto* dy, const auto* gate_up) {
    return ops::SwigluBackward(x, dgate_up, dy, gate_up, n, f);
  };
  std::vector<float> out(static_cast<size_t>(n) * f), dgu(gu.size());
  ASSERT_TRUE(forward(on_cpu, out.data(), gu.data()).ok());
  ASSERT_TRUE(backward(on_cpu, dgu.data(), dout.data(), gu.data()).ok());
  DeviceArray<T> ggu(gu), gdout(dout), gout(out.size()), gdgu(dgu.size());
  ASSERT_TRUE(forward(on_gpu, gout.get(), ggu.get()).ok());
  ASSERT_TRUE(backward(on_gpu, gdgu.get(), gdout.get(), ggu.get()).ok());
  ExpectClose(gout.Download(), out, StoredTol<T>(1e-2), "swiglu forward");
  ExpectClose(gdgu.Download(), dgu, StoredTol<T>(1e-2), "swiglu backward");
}

template <typename T>
void CheckEmbedding() {
  const int v = 150, n = 300, c = 70;  // v > the kernel's 64 token classes; tokens repeat
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  const auto table = Quantize<T>(RandomNormal(static_cast<size_t>(v) * c, 31));
  const auto dout = Quantize<T>(RandomNormal(static_cast<size_t>(n) * c, 32));
  const auto dtable0 = RandomNormal(table.size(), 33, 0.1f);
  const auto tokens = RandomTokens(n, v, 34);
  std::vector<float> out(static_cast<size_t>(n) * c), dtable = dtable0;
  ASSERT_TRUE(ops::EmbeddingForward(on_cpu, out.data(), tokens.data(), table.data(), n, c).ok());
  ASSERT_TRUE(ops::EmbeddingBackward(on_cpu, dtable.data(), dout.data(), tokens.data(), n, c).ok());
  DeviceVector<int32_t> gtok(tokens);
  DeviceArray<T> gtable(table), gdout(dout), gout(out.size());
  DeviceArray<float> gdtable(dtable0);
  ASSERT_TRUE(ops::EmbeddingForward(on_gpu, gout.get(), gtok.get(), gtable.get(), n, c).ok());
  ASSERT_TRUE(ops::EmbeddingBackward(on_gpu, gdtable.get(), gdout.get(), gtok.get(), n, c).ok());
  ExpectClose(gout.Download(), out, 0.0, "embedding forward");
  ExpectClose(gdtable.Download(), dtable, 1e-6, "embedding backward");
}

template <typename T>
void CheckCrossEntropy() {
  const int n = 9, v = 1000;
  const float dloss = 1.0f / n;
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  const auto logits = Quantize<T>(RandomNormal(static_cast<size_t>(n) * v, 41, 3.0f));
  const auto targets = RandomTokens(n, v, 42);
  std::vector<float> losses(n), dlogits(logits.size());
  ASSERT_TRUE(
      ops::CrossEntropyForward(on_cpu, losses.data(), logits.data(), targets.data(), n, v).ok());
  ASSERT_TRUE(
      ops::CrossEntropyBackward(on_cpu, dlogits.data(), logits.data(), targets.data(), dloss, n, v)
          .ok());
  DeviceVector<int32_t> gt(targets);
  DeviceArray<T> glogits(logits), gd(logits.size());
  DeviceArray<float> glosses(n), glosses2(n);
  ASSERT_TRUE(ops::CrossEntropyForward(on_gpu, glosses.get(), glogits.get(), gt.get(), n, v).ok());
  ASSERT_TRUE(
      ops::CrossEntropyBackward(on_gpu, gd.get(), glogits.get(), gt.get(), dloss, n, v).ok());
  ExpectClose(glosses.Download(), losses, StoredTol<T>(1e-4), "cross-entropy losses");
  ExpectClose(gd.Download(), dlogits, StoredTol<T>(1e-2), "cross-entropy dlogits");
  // Fused, in place: the logits buffer becomes its own gradient.
  ASSERT_TRUE(ops::CrossEntropyForwardBackward(on_gpu, glosses2.get(), glogits.get(), glogits.get(),
                                               gt.get(), dloss, n, v)
                  .ok());
  ExpectClose(glosses2.Download(), losses, StoredTol<T>(1e-4), "fused cross-entropy losses");
  ExpectClose(glogits.Download(), dlogits, StoredTol<T>(1e-2), "fused cross-entropy dlogits");
}

// Exact comparison that also accepts equal infinities (ExpectClose would see inf - inf = NaN).
void ExpectSame(const std::vector<float>& got, const std::vector<float>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

template <typename T>
void CheckVocabSliceEmbedding() {
  // The slice [40, 110) of a 150-token vocabulary: about half the tokens fall outside it.
  const int v = 150, v0 = 40, vl = 70, n = 300, c = 70;
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  const auto table = Quantize<T>(RandomNormal(static_cast<size_t>(vl) * c, 61));
  const auto dout = Quantize<T>(RandomNormal(static_cast<size_t>(n) * c, 62));
  const auto dtable0 = RandomNormal(table.size(), 63, 0.1f);
  auto tokens = RandomTokens(n, v, 64);
  tokens[0] = v0 - 1;  // the edges of the slice
  tokens[1] = v0;
  tokens[2] = v0 + vl - 1;
  tokens[3] = v0 + vl;
  std::vector<float> out(static_cast<size_t>(n) * c), dtable = dtable0;
  ASSERT_TRUE(
      ops::VocabSliceEmbeddingForward(on_cpu, out.data(), tokens.data(), table.data(), v0, vl, n, c)
          .ok());
  ASSERT_TRUE(ops::VocabSliceEmbeddingBackward(on_cpu, dtable.data(), dout.data(), tokens.data(),
                                               v0, vl, n, c)
                  .ok());
  DeviceVector<int32_t> gtok(tokens);
  DeviceArray<T> gtable(table), gdout(dout), gout(out.size());
  DeviceArray<float> gdtable(dtable0);
  ASSERT_TRUE(
      ops::VocabSliceEmbeddingForward(on_gpu, gout.get(), gtok.get(), gtable.get(), v0, vl, n, c)
          .ok());
  ASSERT_TRUE(
      ops::VocabSliceEmbeddingBackward(on_gpu, gdtable.get(), gdout.get(), gtok.get(), v0, vl, n, c)
          .ok());
  ExpectSame(gout.Download(), out, "vocab-slice embedding forward");
  ExpectClose(gdtable.Download(), dtable, 1e-6, "vocab-slice embedding backward");
}

template <typename T>
void CheckVocabParallelCrossEntropy() {
  // One rank's slice [300, 1000) of the padded vocabulary, its last 50 columns padding; the TP
  // reductions are identities here (one rank). Each side chains its own steps; every step's
  // outputs are compared.
  const int n = 9, vocab = 1000, v0 = 300, vl = 700, vtrue = 650;
  const float scale = 1.0f / n;
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  const auto logits0 = Quantize<T>(RandomNormal(static_cast<size_t>(n) * vl, 51, 3.0f));
  auto targets = RandomTokens(n, vocab, 52);
  targets[0] = v0 - 1;  // outside the slice, then its first and last true columns
  targets[1] = v0;
  targets[2] = v0 + vtrue - 1;
  std::vector<float> logits = logits0, row_max(n), sum_exp(n), target(n), lse(n), losses(n),
                     dlogits(logits.size());
  ASSERT_TRUE(ops::MaskPaddedVocab(on_cpu, logits.data(), n, vl, vtrue).ok());
  ASSERT_TRUE(ops::VocabParallelRowMax(on_cpu, row_max.data(), logits.data(), n, vl).ok());
  ASSERT_TRUE(ops::VocabParallelSumExp(on_cpu, sum_exp.data(), target.data(), logits.data(),
                                       row_max.data(), targets.data(), v0, n, vl)
                  .ok());
  ASSERT_TRUE(ops::VocabParallelLoss(on_cpu, losses.data(), lse.data(), row_max.data(),
                                     sum_exp.data(), target.data(), n)
                  .ok());
  ASSERT_TRUE(ops::VocabParallelCrossEntropyBackward(on_cpu, dlogits.data(), logits.data(),
                                                     lse.data(), targets.data(), scale, v0, n, vl)
                  .ok());
  DeviceVector<int32_t> gt(targets);
  DeviceArray<T> glogits(logits0);
  DeviceArray<float> grow_max(n), gsum(n), gtarget(n), glse(n), glosses(n);
  ASSERT_TRUE(ops::MaskPaddedVocab(on_gpu, glogits.get(), n, vl, vtrue).ok());
  ExpectSame(glogits.Download(), logits, "masked logits");
  ASSERT_TRUE(ops::VocabParallelRowMax(on_gpu, grow_max.get(), glogits.get(), n, vl).ok());
  ASSERT_TRUE(ops::VocabParallelSumExp(on_gpu, gsum.get(), gtarget.get(), glogits.get(),
                                       grow_max.get(), gt.get(), v0, n, vl)
                  .ok());
  ASSERT_TRUE(ops::VocabParallelLoss(on_gpu, glosses.get(), glse.get(), grow_max.get(), gsum.get(),
                                     gtarget.get(), n)
                  .ok());
  // In place: the logits buffer becomes its own gradient.
  ASSERT_TRUE(ops::VocabParallelCrossEntropyBackward(on_gpu, glogits.get(), glogits.get(),
                                                     glse.get(), gt.get(), scale, v0, n, vl)
                  .ok());
  ExpectSame(grow_max.Download(), row_max, "vocab-parallel row max");
  ExpectSame(gtarget.Download(), target, "vocab-parallel target logit");
  ExpectClose(gsum.Download(), sum_exp, StoredTol<T>(1e-4), "vocab-parallel sum_exp");
  ExpectClose(glse.Download(), lse, StoredTol<T>(1e-4), "vocab-parallel lse");
  ExpectClose(glosses.Download(), losses, StoredTol<T>(1e-4), "vocab-parallel losses");
  ExpectClose(glogits.Download(), dlogits, StoredTol<T>(1e-2), "vocab-parallel dlogits");
}

template <typename T>
void CheckElementwise() {
  const int64_t n = 5000;  // more than one chunk of the CPU's pool, not a multiple of a block
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  const auto a = Quantize<T>(RandomNormal(n, 21));
  const auto b = Quantize<T>(RandomNormal(n, 22));
  std::vector<float> sum(n), acc = a, copy(n), zero = b;
  ASSERT_TRUE(ops::Add(on_cpu, sum.data(), a.data(), b.data(), n).ok());
  ASSERT_TRUE(ops::AddTo(on_cpu, acc.data(), b.data(), n).ok());
  ASSERT_TRUE(ops::Copy(on_cpu, copy.data(), a.data(), n).ok());
  ASSERT_TRUE(ops::Zero(on_cpu, zero.data(), n).ok());
  EXPECT_EQ(acc, sum);  // out += b is out = out + b
  EXPECT_EQ(copy, a);
  EXPECT_EQ(zero, std::vector<float>(n, 0.0f));
  DeviceArray<T> ga(a), gb(b), gsum(n), gacc(a), gcopy(n), gzero(b);
  ASSERT_TRUE(ops::Add(on_gpu, gsum.get(), ga.get(), gb.get(), n).ok());
  ASSERT_TRUE(ops::AddTo(on_gpu, gacc.get(), gb.get(), n).ok());
  ASSERT_TRUE(ops::Copy(on_gpu, gcopy.get(), ga.get(), n).ok());
  ASSERT_TRUE(ops::Zero(on_gpu, gzero.get(), n).ok());
  ExpectClose(gsum.Download(), Quantize<T>(sum), 0.0, "add");
  ExpectClose(gacc.Download(), Quantize<T>(sum), 0.0, "add to");
  ExpectClose(gcopy.Download(), a, 0.0, "copy");
  ExpectClose(gzero.Download(), zero, 0.0, "zero");
  // In place: out aliases a.
  ASSERT_TRUE(ops::Add(on_gpu, ga.get(), ga.get(), gb.get(), n).ok());
  ExpectClose(ga.Download(), Quantize<T>(sum), 0.0, "add (in place)");
}

template <typename T>
void CheckCastFromF32() {
  // Not a multiple of a block; ties of bf16's rounding (1 + 2^-8 rounds down to even, 1 + 3 *
  // 2^-8 up), a subnormal and large values besides random ones.
  std::vector<float> in = RandomNormal(5000, 31, 3.0f);
  for (float v : {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f, 0x1p-130f, 3.0e38f,
                  -0.0f, 0.0f}) {
    in.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(in.size());
  std::vector<float> want(n);
  if constexpr (kIsBf16<T>) {
    for (int64_t i = 0; i < n; ++i) want[i] = __bfloat162float(__float2bfloat16(in[i]));
  } else {
    const CpuExec on_cpu{};
    ASSERT_TRUE(ops::CastFromF32(on_cpu, want.data(), in.data(), n).ok());
    EXPECT_EQ(want, in);
  }
  const CudaExec on_gpu{};
  DeviceArray<float> gin(in);
  DeviceArray<T> gout(n);
  ASSERT_TRUE(ops::CastFromF32(on_gpu, gout.get(), gin.get(), n).ok());
  EXPECT_EQ(gout.Download(), want);
}

// |got - want| <= rtol * |want|.
void ExpectRel(double got, double want, double rtol, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), rtol * std::fabs(want))
      << what << ": got " << got << ", want " << want;
}

void CheckAccumulate() {
  const int64_t n = 10000;  // many elements per thread of the one block
  const auto v1 = RandomNormal(n, 41), v2 = RandomNormal(n, 42, 2.0f);
  const CpuExec on_cpu{};
  const CudaExec on_gpu{};
  double want = 0.75;
  ASSERT_TRUE(ops::AccumulateSum(on_cpu, &want, v1.data(), n, 0.5).ok());
  ASSERT_TRUE(ops::AccumulateSum(on_cpu, &want, v2.data(), n, -1.0 / 3.0).ok());
  DeviceArray<float> g1(v1), g2(v2);
  DeviceVector<double> gacc(std::vector<double>{0.75});
  ASSERT_TRUE(ops::AccumulateSum(on_gpu, gacc.get(), g1.get(), n, 0.5).ok());
  ASSERT_TRUE(ops::AccumulateSum(on_gpu, gacc.get(), g2.get(), n, -1.0 / 3.0).ok());
  double got = 0;
  ASSERT_TRUE(ops::Download(on_gpu, &got, gacc.get(), 1).ok());
  ExpectRel(got, want, 1e-12, "accumulate sum");

  double cpu_value = 1.25;
  ASSERT_TRUE(ops::AccumulateValue(on_cpu, &cpu_value, 0.5).ok());
  ASSERT_TRUE(ops::AccumulateValue(on_cpu, &cpu_value, -3.0).ok());
  EXPECT_EQ(cpu_value, -1.25);
  DeviceVector<double> gvalue(std::vector<double>{1.25});
  ASSERT_TRUE(ops::AccumulateValue(on_gpu, gvalue.get(), 0.5).ok());
  ASSERT_TRUE(ops::AccumulateValue(on_gpu, gvalue.get(), -3.0).ok());
  ASSERT_TRUE(ops::Download(on_gpu, &got, gvalue.get(), 1).ok());
  EXPECT_EQ(got, -1.25);
}

// Per-column sums and zero counts (the designs' statistics): two calls accumulate; a third
// without zeros leaves them; the same call twice gives the same bits.
void CheckAccumulateColumns() {
  const int64_t rows = 3001;  // many rows per thread of a column's block
  const int cols = 5;
  auto a = RandomNormal(rows * cols, 61);
  for (int64_t j = 0; j < rows * cols; j += 7) a[j] = 0.0f;  // ReLU gates' exact zeros
  const CpuExec on_cpu{};
  const CudaExec on_gpu{};
  std::vector<double> sums(cols, 0.5), zeros(cols, 2.0);
  ASSERT_TRUE(ops::AccumulateColumns(on_cpu, sums.data(), zeros.data(), a.data(), rows, cols).ok());
  ASSERT_TRUE(ops::AccumulateColumns(on_cpu, sums.data(), zeros.data(), a.data(), rows, cols).ok());
  ASSERT_TRUE(ops::AccumulateColumns(on_cpu, sums.data(), nullptr, a.data(), rows, cols).ok());
  DeviceArray<float> ga(a);
  DeviceVector<double> gsums(std::vector<double>(cols, 0.5));
  DeviceVector<double> gzeros(std::vector<double>(cols, 2.0));
  ASSERT_TRUE(ops::AccumulateColumns(on_gpu, gsums.get(), gzeros.get(), ga.get(), rows, cols).ok());
  ASSERT_TRUE(ops::AccumulateColumns(on_gpu, gsums.get(), gzeros.get(), ga.get(), rows, cols).ok());
  ASSERT_TRUE(ops::AccumulateColumns(on_gpu, gsums.get(), nullptr, ga.get(), rows, cols).ok());
  std::vector<double> got_sums(cols), got_zeros(cols);
  ASSERT_TRUE(ops::Download(on_gpu, got_sums.data(), gsums.get(), cols).ok());
  ASSERT_TRUE(ops::Download(on_gpu, got_zeros.data(), gzeros.get(), cols).ok());
  for (int c = 0; c < cols; ++c) {
    ExpectRel(got_sums[c], sums[c], 1e-12, "column sum " + std::to_string(c));
    EXPECT_EQ(got_zeros[c], zeros[c]) << "zero count of column " << c;
    EXPECT_GT(zeros[c], 2.0 + 2 * 400) << "the planted zeros of column " << c;
  }
  // Nothing to add: no launch, the accumulators unchanged.
  ASSERT_TRUE(ops::AccumulateColumns(on_gpu, gsums.get(), gzeros.get(), ga.get(), 0, cols).ok());
  std::vector<double> again(cols);
  ASSERT_TRUE(ops::Download(on_gpu, again.data(), gsums.get(), cols).ok());
  EXPECT_EQ(again, got_sums);
}

void CheckSumSquares() {
  const int64_t n = 100000;  // the full reduction grid, many elements per thread
  const auto v = RandomNormal(n, 51);
  const CpuExec on_cpu{};
  double want = 0;
  ASSERT_TRUE(ops::SumSquares(on_cpu, &want, v.data(), n).ok());
  cuda::CachingAllocator alloc;
  cuda::Workspace workspace(&alloc, nullptr);
  const CudaExec on_gpu{nullptr, nullptr, &workspace};
  DeviceArray<float> gv(v);
  DeviceVector<double> gout(std::vector<double>{-1.0, -1.0});
  ASSERT_TRUE(ops::SumSquares(on_gpu, gout.get(), gv.get(), n).ok());
  ASSERT_TRUE(ops::SumSquares(on_gpu, gout.get() + 1, gv.get(), n).ok());
  std::vector<double> got(2);
  ASSERT_TRUE(ops::Download(on_gpu, got.data(), gout.get(), 2).ok());
  ExpectRel(got[0], want, 1e-12, "sum of squares");
  EXPECT_EQ(got[0], got[1]);  // bit-identical run to run
  // n = 0 writes 0.
  ASSERT_TRUE(ops::SumSquares(on_gpu, gout.get(), gv.get(), 0).ok());
  ASSERT_TRUE(ops::Download(on_gpu, got.data(), gout.get(), 1).ok());
  EXPECT_EQ(got[0], 0.0);
  // Its scratch comes from the workspace: none, no launch.
  const absl::Status no_workspace = ops::SumSquares(CudaExec{}, gout.get(), gv.get(), n);
  EXPECT_EQ(no_workspace.code(), absl::StatusCode::kFailedPrecondition) << no_workspace;
}

// Scale and Divide in f32: the CPU's v * T(s) and v / T(d), exactly (one fp32 operation).
void CheckScaleDivide() {
  const int64_t n = 3001;
  const auto v = RandomNormal(n, 53);
  std::vector<float> scaled = v, divided = v;
  const CpuExec on_cpu{};
  ASSERT_TRUE(ops::Scale(on_cpu, scaled.data(), n, 0.375).ok());
  ASSERT_TRUE(ops::Divide(on_cpu, divided.data(), n, 3.0).ok());
  const CudaExec on_gpu{};
  DeviceArray<float> gs(v), gd(v);
  ASSERT_TRUE(ops::Scale(on_gpu, gs.get(), n, 0.375).ok());
  ASSERT_TRUE(ops::Divide(on_gpu, gd.get(), n, 3.0).ok());
  EXPECT_EQ(gs.Download(), scaled);
  EXPECT_EQ(gd.Download(), divided);
  EXPECT_NE(divided, v);
}

#endif  // SATDAR_WITH_CUDA

TEST(OpsCuda, ScaleAndDivide) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckScaleDivide());
}
TEST(OpsCuda, CastFromF32F32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckCastFromF32<float>());
}
TEST(OpsCuda, CastFromF32Bf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckCastFromF32<Bf16>());
}
TEST(OpsCuda, AccumulateSumAndValue) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckAccumulate());
}
TEST(OpsCuda, AccumulateColumns) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckAccumulateColumns());
}
TEST(OpsCuda, SumSquares) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckSumSquares());
}
TEST(OpsCuda, ElementwiseF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckElementwise<float>());
}
TEST(OpsCuda, ElementwiseBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckElementwise<Bf16>());
}
TEST(OpsCuda, RmsNormF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckRmsNorm<float>());
}
TEST(OpsCuda, RmsNormBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckRmsNorm<Bf16>());
}
TEST(OpsCuda, RopeF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckRope<float>());
}
TEST(OpsCuda, RopeBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckRope<Bf16>());
}
TEST(OpsCuda, SwigluF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckSwiglu<float>());
}
TEST(OpsCuda, SwigluBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckSwiglu<Bf16>());
}
TEST(OpsCuda, EmbeddingF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckEmbedding<float>());
}
TEST(OpsCuda, EmbeddingBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckEmbedding<Bf16>());
}
TEST(OpsCuda, CrossEntropyF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckCrossEntropy<float>());
}
TEST(OpsCuda, CrossEntropyBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckCrossEntropy<Bf16>());
}
TEST(OpsCuda, VocabSliceEmbeddingF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckVocabSliceEmbedding<float>());
}
TEST(OpsCuda, VocabSliceEmbeddingBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckVocabSliceEmbedding<Bf16>());
}
TEST(OpsCuda, VocabParallelCrossEntropyF32) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckVocabParallelCrossEntropy<float>());
}
TEST(OpsCuda, VocabParallelCrossEntropyBf16) {
  SATDAR_SKIP_WITHOUT_GPU();
  SATDAR_IF_CUDA(CheckVocabParallelCrossEntropy<Bf16>());
}

}  // namespace
}  // namespace satdar::core
