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
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/dtype.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/cuda_ops.h"
#include "core/ops/embedding.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/rope.h"
#include "core/ops/swiglu.h"
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
  const auto x = Quantize<T>(RandomNormal(n * c, 1));
  const auto w = Quantize<T>(RandomNormal(c, 2, 0.5f));
  const auto dy = Quantize<T>(RandomNormal(n * c, 3));
  const auto dx0 = Quantize<T>(RandomNormal(n * c, 4, 0.1f));
  const auto dw0 = RandomNormal(c, 5, 0.1f);
  std::vector<float> out(n * c), rstd(n), dx = dx0, dw = dw0;
  cpu::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), n, c, eps, &pool);
  cpu::RmsNormBackward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), n, c,
                       &pool);
  DeviceArray<T> gx(x), gw(w), gdy(dy), gdx(dx0), gout(n * c);
  DeviceArray<float> grstd(n), gdw(dw0);
  ASSERT_EQ(cuda::RmsNormForward(gout.get(), grstd.get(), gx.get(), gw.get(), n, c,
                                 static_cast<float>(eps), nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::RmsNormBackward(gdx.get(), gdw.get(), gdy.get(), gx.get(), gw.get(), grstd.get(),
                                  n, c, nullptr),
            cudaSuccess);
  ExpectClose(gout.Download(), out, StoredTol<T>(1e-2), "rmsnorm out");
  ExpectClose(grstd.Download(), rstd, StoredTol<T>(1e-4), "rmsnorm rstd");
  ExpectClose(gdx.Download(), dx, StoredTol<T>(1e-2), "rmsnorm dinp");
  ExpectClose(gdw.Download(), dw, StoredTol<T>(1e-4), "rmsnorm dweight");
  // In place (out aliases inp), as the header allows.
  ASSERT_EQ(cuda::RmsNormForward(gx.get(), grstd.get(), gx.get(), gw.get(), n, c,
                                 static_cast<float>(eps), nullptr),
            cudaSuccess);
  ExpectClose(gx.Download(), out, StoredTol<T>(1e-2), "rmsnorm out (in place)");
}

template <typename T>
void CheckRope() {
  const int b = 2, t = 7, nh = 3, hs = 16;
  const size_t size = static_cast<size_t>(b) * t * nh * hs;
  ThreadPool pool(2);
  std::vector<float> cos, sin;
  cpu::RopeTables(&cos, &sin, t, hs, 10000.0);
  const auto x0 = Quantize<T>(RandomNormal(size, 11));
  const auto dx0 = Quantize<T>(RandomNormal(size, 12));
  std::vector<float> x = x0, dx = dx0;
  cpu::RopeForward(x.data(), cos.data(), sin.data(), b, t, nh, hs, &pool);
  cpu::RopeBackward(dx.data(), cos.data(), sin.data(), b, t, nh, hs, &pool);
  DeviceArray<float> gcos(cos), gsin(sin);
  DeviceArray<T> gx(x0), gdx(dx0);
  ASSERT_EQ(cuda::RopeForward(gx.get(), gcos.get(), gsin.get(), b, t, nh, hs, nullptr), cudaSuccess);
  ASSERT_EQ(cuda::RopeBackward(gdx.get(), gcos.get(), gsin.get(), b, t, nh, hs, nullptr),
            cudaSuccess);
  ExpectClose(gx.Download(), x, StoredTol<T>(1e-2), "rope forward");
  ExpectClose(gdx.Download(), dx, StoredTol<T>(1e-2), "rope backward");
}

template <typename T>
void CheckSwiglu() {
  const int n = 33, f = 129;
  ThreadPool pool(2);
  const auto gu = Quantize<T>(RandomNormal(static_cast<size_t>(n) * 2 * f, 21, 2.0f));
  const auto dout = Quantize<T>(RandomNormal(static_cast<size_t>(n) * f, 22));
  std::vector<float> out(static_cast<size_t>(n) * f), dgu(gu.size());
  cpu::SwigluForward(out.data(), gu.data(), n, f, &pool);
  cpu::SwigluBackward(dgu.data(), dout.data(), gu.data(), n, f, &pool);
  DeviceArray<T> ggu(gu), gdout(dout), gout(out.size()), gdgu(dgu.size());
  ASSERT_EQ(cuda::SwigluForward(gout.get(), ggu.get(), n, f, nullptr), cudaSuccess);
  ASSERT_EQ(cuda::SwigluBackward(gdgu.get(), gdout.get(), ggu.get(), n, f, nullptr), cudaSuccess);
  ExpectClose(gout.Download(), out, StoredTol<T>(1e-2), "swiglu forward");
  ExpectClose(gdgu.Download(), dgu, StoredTol<T>(1e-2), "swiglu backward");
}

template <typename T>
void CheckEmbedding() {
  const int v = 150, n = 300, c = 70;  // v > the kernel's 64 token classes; tokens repeat
  ThreadPool pool(2);
  const auto table = Quantize<T>(RandomNormal(static_cast<size_t>(v) * c, 31));
  const auto dout = Quantize<T>(RandomNormal(static_cast<size_t>(n) * c, 32));
  const auto dtable0 = RandomNormal(table.size(), 33, 0.1f);
  const auto tokens = RandomTokens(n, v, 34);
  std::vector<float> out(static_cast<size_t>(n) * c), dtable = dtable0;
  cpu::EmbeddingForward(out.data(), tokens.data(), table.data(), n, c, &pool);
  cpu::EmbeddingBackward(dtable.data(), dout.data(), tokens.data(), n, c, &pool);
  DeviceVector<int32_t> gtok(tokens);
  DeviceArray<T> gtable(table), gdout(dout), gout(out.size());
  DeviceArray<float> gdtable(dtable0);
  ASSERT_EQ(cuda::EmbeddingForward(gout.get(), gtok.get(), gtable.get(), n, c, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::EmbeddingBackward(gdtable.get(), gdout.get(), gtok.get(), n, c, nullptr),
            cudaSuccess);
  ExpectClose(gout.Download(), out, 0.0, "embedding forward");
  ExpectClose(gdtable.Download(), dtable, 1e-6, "embedding backward");
}

template <typename T>
void CheckCrossEntropy() {
  const int n = 9, v = 1000;
  const float dloss = 1.0f / n;
  ThreadPool pool(2);
  const auto logits = Quantize<T>(RandomNormal(static_cast<size_t>(n) * v, 41, 3.0f));
  const auto targets = RandomTokens(n, v, 42);
  std::vector<float> losses(n), dlogits(logits.size());
  cpu::CrossEntropyForward(losses.data(), logits.data(), targets.data(), n, v, &pool);
  cpu::CrossEntropyBackward(dlogits.data(), logits.data(), targets.data(), dloss, n, v, &pool);
  DeviceVector<int32_t> gt(targets);
  DeviceArray<T> glogits(logits), gd(logits.size());
  DeviceArray<float> glosses(n), glosses2(n);
  ASSERT_EQ(cuda::CrossEntropyForward(glosses.get(), glogits.get(), gt.get(), n, v, nullptr),
            cudaSuccess);
  ASSERT_EQ(cuda::CrossEntropyBackward(gd.get(), glogits.get(), gt.get(), dloss, n, v, nullptr),
            cudaSuccess);
  ExpectClose(glosses.Download(), losses, StoredTol<T>(1e-4), "cross-entropy losses");
  ExpectClose(gd.Download(), dlogits, StoredTol<T>(1e-2), "cross-entropy dlogits");
  // Fused, in place: the logits buffer becomes its own gradient.
  ASSERT_EQ(cuda::CrossEntropyForwardBackward(glosses2.get(), glogits.get(), glogits.get(),
                                              gt.get(), dloss, n, v, nullptr),
            cudaSuccess);
  ExpectClose(glosses2.Download(), losses, StoredTol<T>(1e-4), "fused cross-entropy losses");
  ExpectClose(glogits.Download(), dlogits, StoredTol<T>(1e-2), "fused cross-entropy dlogits");
}

#endif  // SATDAR_WITH_CUDA

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

}  // namespace
}  // namespace satdar::core
