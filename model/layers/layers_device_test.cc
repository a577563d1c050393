// The attention and MLP layers (attention.h, mlp.h) on Cuda<float> and Cuda<__nv_bfloat16>
// against the same functions on Cpu<float>: the same random inputs, weights, initial input
// gradients and RoPE tables; the outputs, the input gradients (accumulated into a non-zero
// buffer, so += is checked) and every weight gradient compared. Skips without a CUDA build or
// a GPU (tag gpu).
//
// The two sides differ on purpose in how they compute, not in what: the CPU projects q/k/v with
// one fused GEMM (one input) and keeps the softmax probabilities; CUDA runs three GEMMs, flash
// attention with lse, and the mixed-precision weight-gradient GEMMs.
//
// Tolerances (gpu_test::ExpectClose: |gpu - cpu| <= rtol * max(|cpu|, rms(cpu)) per element):
//   f32:  rtol 1e-3 for everything. Both sides compute in fp32 (cuBLASLt COMPUTE_32F, no TF32)
//         and only the order of additions differs: each kernel alone agrees to ~1e-5..1e-4
//         (gemm_cuda_test, attention_cuda_test, ops_cuda_test use 1e-4 / 1e-5), and a layer
//         chains up to nine of them (GEMM, RMSNorm, RoPE, online-softmax attention, GEMM
//         forward; and back), each stage feeding the previous one's rounding differences
//         into reductions over C, T or B*T*NH rows (the q/k norm weight gradients sum
//         B*T*NH products with cancellation). 1e-3 leaves that chain an order of magnitude.
//   bf16: rtol 1e-1 for everything. The CPU runs in f32 on the same bf16-rounded inputs and
//         weights, but CUDA stores every intermediate (projections, normed/rotated q and k,
//         attention output, datt, dq/dk/dv, gate_up, act, dact, dgate_up) in bf16: each store
//         is a relative rounding of up to 2^-9 (~2e-3), and up to ~10 of them are chained and
//         amplified by softmax and the norms' backward, so the outputs land within a few 1e-2;
//         0.1 is the per-tensor bound the GPU model test used for bf16 (ONE_MODEL_PLAN 2.6).
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/exec.h"
#include "core/ops/rope.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"
#include "model/backend.h"
#include "model/layers/attention.h"
#include "model/layers/mlp.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

#include <memory>

#include "core/cuda/allocator.h"
#include "core/cuda/device_vec.h"
#include "core/cuda/workspace.h"
#include "model/variants/ops_test_exec.h"
#include "core/ops/gemm_cuda.h"
#endif

namespace satdar::model {
namespace {

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::Bf16;
using core::gpu_test::DeviceArray;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

template <typename E>
double Tol() {
  return kIsBf16<E> ? 1e-1 : 1e-3;
}

// Offsets of one attention layer's weights in one parameter buffer, q/k/v back to back (as
// the CPU's fused GEMM requires).
struct AttnLayout {
  int64_t wq, wk, wv, wo, q_norm, k_norm, size;
  explicit AttnLayout(const AttentionDims& d) {
    const int64_t qd = int64_t{d.nh} * d.hs, kd = int64_t{d.nkv} * d.hs;
    wq = 0;
    wk = wq + qd * d.c;
    wv = wk + kd * d.c;
    wo = wv + kd * d.c;
    q_norm = wo + int64_t{d.c} * qd;
    k_norm = q_norm + d.hs;
    size = k_norm + d.hs;
  }
  template <typename U>
  AttentionWeights<U> At(U* base) const {
    return {base + wq, base + wk, base + wv, base + wo, base + q_norm, base + k_norm};
  }
};

template <typename E>
void CheckAttention(bool qk_norm) {
  const AttentionDims d{2, 19, 48, 4, 2, 16, qk_norm, 1e-6};
  const int64_t n = d.rows(), nc = n * d.c;
  const AttnLayout lay(d);
  // Weights around 1/sqrt(C) so the scores stay O(1); the norms' weights around 1.
  std::vector<float> params = RandomNormal(lay.size, 1, 0.15f);
  for (int i = 0; i < 2 * d.hs; ++i) params[lay.q_norm + i] += 1.0f;
  params = Quantize<E>(params);
  const auto x = Quantize<E>(RandomNormal(nc, 2));
  const auto dout = Quantize<E>(RandomNormal(nc, 3));
  const auto dx0 = Quantize<E>(RandomNormal(nc, 4, 0.1f));
  std::vector<float> cos, sin;
  core::cpu::RopeTables(&cos, &sin, d.t, d.hs, 10000.0);

  // CPU reference.
  core::ThreadPool pool(2);
  const core::CpuExec cpu{&pool};
  AttentionActs<Cpu<float>> acts;
  AttentionScratch<Cpu<float>> scratch;
  acts.Resize(d);
  scratch.Resize(d);
  std::vector<float> out(nc), dx = dx0, grads(lay.size, 0.0f);
  const AttentionWeights<float> w = lay.At(params.data());
  const AttentionWeights<float> g = lay.At(grads.data());
  ASSERT_TRUE(AttentionLayerForward(cpu, out.data(), &acts, x.data(), w, d, cos.data(),
                                    sin.data(), &scratch)
                  .ok());
  ASSERT_TRUE(AttentionLayerBackward(cpu, dx.data(), g, dout.data(), acts, x.data(), w, d,
                                     cos.data(), sin.data(), &scratch)
                  .ok());

  // The GPU.
  DeviceTestExec gpu;
  ASSERT_NE(gpu.gemm, nullptr);
  DeviceArray<E> dparams(params), dx_in(x), ddout(dout), ddx(dx0), dout_gpu(nc);
  DeviceArray<float> dgrads(std::vector<float>(lay.size, 0.0f)), dcos(cos), dsin(sin);
  {
    core::cuda::AllocScope scope(gpu.x);
    AttentionActs<Cuda<E>> gacts;
    AttentionScratch<Cuda<E>> gscratch;
    gacts.Resize(d);
    gscratch.Resize(d);
    ASSERT_TRUE(scope.status().ok()) << scope.status();
    EXPECT_TRUE(gacts.probs.empty());
    EXPECT_EQ(gacts.lse.size(), static_cast<size_t>(d.b) * d.nh * d.t);
    const AttentionWeights<E> gw = lay.At(dparams.get());
    const AttentionWeights<float> gg = lay.At(dgrads.get());
    const absl::Status fwd = AttentionLayerForward(gpu.x, dout_gpu.get(), &gacts, dx_in.get(), gw,
                                                   d, dcos.get(), dsin.get(), &gscratch);
    ASSERT_TRUE(fwd.ok()) << fwd;
    const absl::Status bwd =
        AttentionLayerBackward(gpu.x, ddx.get(), gg, ddout.get(), gacts, dx_in.get(), gw, d,
                               dcos.get(), dsin.get(), &gscratch);
    ASSERT_TRUE(bwd.ok()) << bwd;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const double tol = Tol<E>();
  ExpectClose(dout_gpu.Download(), out, tol, "attention out");
  ExpectClose(ddx.Download(), dx, tol, "attention dx");
  const std::vector<float> gg = dgrads.Download();
  auto slice = [](const std::vector<float>& v, int64_t o, int64_t len) {
    return std::vector<float>(v.begin() + o, v.begin() + o + len);
  };
  const int64_t qd = int64_t{d.nh} * d.hs, kd = int64_t{d.nkv} * d.hs;
  struct Part {
    const char* name;
    int64_t offset, size;
  };
  std::vector<Part> parts = {{"dWq", lay.wq, qd * d.c},
                             {"dWk", lay.wk, kd * d.c},
                             {"dWv", lay.wv, kd * d.c},
                             {"dWo", lay.wo, d.c * qd}};
  if (qk_norm) {
    parts.push_back({"dq_norm", lay.q_norm, d.hs});
    parts.push_back({"dk_norm", lay.k_norm, d.hs});
  }
  for (const Part& p : parts) {
    ExpectClose(slice(gg, p.offset, p.size), slice(grads, p.offset, p.size), tol,
                std::string("attention ") + p.name);
  }
  if (!qk_norm) {  // no norm weights: their gradients stay zero on both sides
    EXPECT_EQ(slice(gg, lay.q_norm, 2 * d.hs), std::vector<float>(2 * d.hs, 0.0f));
  }
}

template <typename E>
void CheckMlp() {
  const MlpDims d{2 * 19, 48, 80};
  const int64_t nc = int64_t{d.rows} * d.c, fc = int64_t{d.f} * d.c;
  // gate, up (stacked), down.
  const auto params = Quantize<E>(RandomNormal(3 * fc, 11, 0.15f));
  const auto z = Quantize<E>(RandomNormal(nc, 12));
  const auto dout = Quantize<E>(RandomNormal(nc, 13));
  const auto dz0 = Quantize<E>(RandomNormal(nc, 14, 0.1f));
  auto at = [&](auto* base) -> MlpWeights<std::remove_pointer_t<decltype(base)>> {
    return {base, base + fc, base + 2 * fc};
  };

  core::ThreadPool pool(2);
  const core::CpuExec cpu{&pool};
  MlpActs<Cpu<float>> acts;
  MlpScratch<Cpu<float>> scratch;
  acts.Resize(d);
  scratch.Resize(d);
  std::vector<float> p = params, out(nc), dz = dz0, grads(3 * fc, 0.0f);
  ASSERT_TRUE(MlpForward(cpu, out.data(), &acts, z.data(), at(p.data()), d).ok());
  ASSERT_TRUE(MlpBackward(cpu, dz.data(), at(grads.data()), dout.data(), acts, z.data(),
                          at(p.data()), d, &scratch)
                  .ok());

  DeviceTestExec gpu;
  ASSERT_NE(gpu.gemm, nullptr);
  DeviceArray<E> dparams(params), dzin(z), ddout(dout), ddz(dz0), dout_gpu(nc);
  DeviceArray<float> dgrads(std::vector<float>(3 * fc, 0.0f));
  {
    core::cuda::AllocScope scope(gpu.x);
    MlpActs<Cuda<E>> gacts;
    MlpScratch<Cuda<E>> gscratch;
    gacts.Resize(d);
    gscratch.Resize(d);
    ASSERT_TRUE(scope.status().ok()) << scope.status();
    const absl::Status fwd =
        MlpForward(gpu.x, dout_gpu.get(), &gacts, dzin.get(), at(dparams.get()), d);
    ASSERT_TRUE(fwd.ok()) << fwd;
    const absl::Status bwd = MlpBackward(gpu.x, ddz.get(), at(dgrads.get()), ddout.get(), gacts,
                                         dzin.get(), at(dparams.get()), d, &gscratch);
    ASSERT_TRUE(bwd.ok()) << bwd;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const double tol = Tol<E>();
  ExpectClose(dout_gpu.Download(), out, tol, "mlp out");
  ExpectClose(ddz.Download(), dz, tol, "mlp dz");
  const std::vector<float> gg = dgrads.Download();
  const char* names[] = {"dWgate", "dWup", "dWdown"};
  for (int part = 0; part < 3; ++part) {
    ExpectClose(std::vector<float>(gg.begin() + part * fc, gg.begin() + (part + 1) * fc),
                std::vector<float>(grads.begin() + part * fc, grads.begin() + (part + 1) * fc),
                tol, std::string("mlp ") + names[part]);
  }
}

template <typename E>
void CheckAttentionQkNorm() {
  CheckAttention<E>(true);
}
template <typename E>
void CheckAttentionPlain() {
  CheckAttention<E>(false);
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(AttentionLayerQkNorm, CheckAttentionQkNorm)
SATDAR_CUDA_MATCHES_CPU_TESTS(AttentionLayerNoQkNorm, CheckAttentionPlain)
SATDAR_CUDA_MATCHES_CPU_TESTS(MlpLayer, CheckMlp)

}  // namespace
}  // namespace satdar::model
