// model/gpu/gpu_muddformer.h: MUDDFormer's topology (model/variants/muddformer.cc) for
// model/gpu/gpu_model.cc, over the cuda:: ops of model/variants/muddformer_ops.h. Block i reads
// four inputs X^Q, X^K, X^V, X^R (block 0: h0 four times):
//   X_A = X^R + Attn(RMSNorm(X^Q; input_layernorm), RMSNorm(X^K; mudd.k_norm),
//                    RMSNorm(X^V; mudd.v_norm));   X_{i+1} = X_A + f_mlp(X_A)
// and the dynamic dense connection after it mixes X_0..X_{i+1} per token into the next
// block's four inputs (after the last block: one, x_final) with coefficients
// w2 gelu(w1 RMS(X_{i+1})) + static. The decoder's attention (on normed q/k/v inputs) and MLP
// branches are callbacks. The coefficient MLP runs as cuBLASLt GEMMs (w2's fp32 output is
// padded to a multiple of 8 columns). CUDA builds only.
#ifndef SATDAR_MODEL_GPU_GPU_MUDDFORMER_H_
#define SATDAR_MODEL_GPU_GPU_MUDDFORMER_H_

#ifdef SATDAR_WITH_CUDA

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/exec.h"
#include "model/config.h"
#include "model/gpu/device_arena.h"
#include "model/gpu/gpu_branches.h"

namespace satdar::core::cuda {
class CachingAllocator;
class GemmHandle;
}  // namespace satdar::core::cuda

namespace satdar::model::gpu {

template <typename T>  // float or __nv_bfloat16
class GpuMuddFormer {
 public:
  struct Branches {
    // y = Attn_i(xq, xk, xv) of the already normed inputs.
    std::function<absl::Status(int i, const T* xq, const T* xk, const T* xv, T* y)> attention;
    // dxq, dxk, dxv += the input gradients of <dy, Attn_i> (they may alias).
    std::function<absl::Status(int i, const T* xq, const T* xk, const T* xv, const T* dy, T* dxq,
                               T* dxk, T* dxv)>
        attention_backward;
    GpuBranchForward<T> forward;  // sublayer l's branch
    GpuBranchBackward<T> backward;
  };

  // offset_of(name): where parameter `name` starts in the device buffers.
  GpuMuddFormer(const ModelConfig& config, cudaStream_t stream, core::cuda::GemmHandle* gemm,
                core::cuda::CachingAllocator* alloc,
                const std::function<int64_t(const std::string&)>& offset_of);
  ~GpuMuddFormer();

  // h0, x_final, dx_final: the decoder's (B, T) buffers (the embedding, the final state and
  // its gradient); they are baked into device pointer lists, so they must stay in place
  // until the next Resize (the decoder reallocates them only in its own Resize, which calls
  // this one).
  absl::Status Resize(int b, int t, const T* h0, T* x_final, const T* dx_final);
  int64_t activation_bytes() const { return arena_.bytes(); }

  // w: compute weights, master: fp32 master weights (device buffers).
  absl::Status Forward(const T* w, const float* master, const Branches& br);
  // From d loss / d x_final (Resize's dx_final); grads (fp32) +=; *dh0 = d loss / d h0
  // (valid until the next call).
  absl::Status Backward(const T* w, const float* master, float* grads, const Branches& br,
                        const T** dh0);

 private:
  enum { kQ = 0, kK = 1, kV = 2, kR = 3 };
  struct Block {
    int64_t w1 = -1, w2 = -1, stat = -1, norm[3] = {-1, -1, -1};  // q: input_layernorm
    int ways = 4, sources = 2, hidden = 64, ld = 8;  // the connection after this block
    std::array<const T*, 4> in{};  // X^Q, X^K, X^V, X^R
    std::array<T*, 4> din{};
    T* normed[3] = {nullptr, nullptr, nullptr};
    float* rstd[3] = {nullptr, nullptr, nullptr};
    T *xa = nullptr, *r = nullptr, *h = nullptr, *g = nullptr;
    float *r_rstd = nullptr, *a = nullptr;
    T** lists = nullptr;  // device: outs (ways), xs (sources), dxs (sources), douts (ways)
  };

  absl::Status ConnectionForward(const T* w, const float* master, int i);
  absl::Status ConnectionBackward(const T* w, const float* master, float* grads, int i);

  const int layers_, d_;
  const float eps_;
  cudaStream_t stream_;
  core::cuda::GemmHandle* gemm_;
  core::CudaExec exec_;  // stream_ and gemm_; no workspace (GELU and DenseCombine take no scratch)
  DeviceArena arena_;
  std::vector<Block> blocks_;
  int rows_ = 0;
  std::vector<T*> x_, dx_;  // X_0 (h0) .. X_L and their gradients
  T *y_ = nullptr, *dr_ = nullptr, *dg_ = nullptr, *ones_ = nullptr, *dh0_ = nullptr;
  T* dnormed_[3] = {nullptr, nullptr, nullptr};
  T* da_t_ = nullptr;
  float* da_ = nullptr;
};

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA

#endif  // SATDAR_MODEL_GPU_GPU_MUDDFORMER_H_
