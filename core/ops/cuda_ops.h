// core/ops/cuda_ops.h: CUDA forward and backward kernels of the elementwise and row ops, each
// with the semantics of its CPU reference in core/ops/<op>.h (same shapes, same eps, same
// accumulate-or-overwrite convention). Every entry point takes device pointers, is enqueued on
// `stream` and returns the launch's cudaError_t (cudaSuccess = 0); nothing synchronises.
//
// Types: T is float or __nv_bfloat16 (activations and the weights they are combined with; the
// templates are instantiated for those two only). Arithmetic is fp32 throughout (bf16 values
// are widened on load and rounded to nearest even on store). Saved statistics (rstd, losses)
// and parameter gradients (dweight, dtable) are fp32 whatever T is. Reductions run in a fixed
// order, so every kernel here gives bit-identical results run to run (no atomics).
//
// Declared only in CUDA builds (SATDAR_WITH_CUDA, or when nvcc compiles the kernels); the
// kernels live in rmsnorm_cuda.cu, rope_cuda.cu, swiglu_cuda.cu, embedding_cuda.cu and
// cross_entropy_cuda.cu. Tested against the CPU path by //core/ops:ops_cuda_test (tag gpu).
#ifndef SATDAR_CORE_OPS_CUDA_OPS_H_
#define SATDAR_CORE_OPS_CUDA_OPS_H_

#if defined(SATDAR_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace satdar::core::cuda {

// ---- RMSNorm (rmsnorm.h): y = g * x / sqrt(mean(x^2) + eps) over the last dimension C.
// out (N,C), rstd (N) fp32, inp (N,C), weight (C). out may alias inp.
template <typename T>
cudaError_t RmsNormForward(T* out, float* rstd, const T* inp, const T* weight, int n, int c,
                           float eps, cudaStream_t stream);
// dinp (N,C) += ...; dweight (C) fp32 += ... (may be null). rstd from the forward.
template <typename T>
cudaError_t RmsNormBackward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                            const float* rstd, int n, int c, cudaStream_t stream);

// ---- RoPE (rope.h), Hugging Face half-split convention. cos, sin: fp32 tables (T, HS/2) as
// written by cpu::RopeTables<float>. x (B,T,NH,HS) rotated in place; backward applies the
// transpose rotation to dx in place.
template <typename T>
cudaError_t RopeForward(T* x, const float* cos, const float* sin, int b, int t, int nh, int hs,
                        cudaStream_t stream);
template <typename T>
cudaError_t RopeBackward(T* dx, const float* cos, const float* sin, int b, int t, int nh, int hs,
                         cudaStream_t stream);

// ---- SwiGLU (swiglu.h) over fused rows: gate_up (N,2F) = [gate | up], out (N,F) =
// silu(gate) * up. Backward overwrites dgate_up (N,2F) (not accumulated); dout (N,F).
template <typename T>
cudaError_t SwigluForward(T* out, const T* gate_up, int n, int f, cudaStream_t stream);
template <typename T>
cudaError_t SwigluBackward(T* dgate_up, const T* dout, const T* gate_up, int n, int f,
                           cudaStream_t stream);

// ---- Embedding (embedding.h): out (N,C) = table[tokens] with table (V,C), tokens in [0,V).
template <typename T>
cudaError_t EmbeddingForward(T* out, const int32_t* tokens, const T* table, int n, int c,
                             cudaStream_t stream);
// dtable (V,C) fp32 += scatter of dout (N,C). Sort-free and deterministic: each thread owns
// one column of the rows whose token falls in its residue class (token mod P) and adds the
// gradients of those tokens in token order, so every element of dtable receives its additions
// in the same order as the CPU reference (bit-identical in f32).
template <typename T>
cudaError_t EmbeddingBackward(float* dtable, const T* dout, const int32_t* tokens, int n, int c,
                              cudaStream_t stream);

// ---- Softmax cross-entropy (cross_entropy.h), one row of logits (N,V) per block.
// losses (N) fp32 = logsumexp(logits[i]) - logits[i][targets[i]].
template <typename T>
cudaError_t CrossEntropyForward(float* losses, const T* logits, const int32_t* targets, int n,
                                int v, cudaStream_t stream);
// dlogits (N,V) = dloss * (softmax(logits) - onehot(targets)); overwrites, may alias logits.
template <typename T>
cudaError_t CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, float dloss,
                                 int n, int v, cudaStream_t stream);
// Both in one pass over the logits: losses as the forward, dlogits as the backward (may alias
// logits, so the logits buffer can be turned into its own gradient).
template <typename T>
cudaError_t CrossEntropyForwardBackward(float* losses, T* dlogits, const T* logits,
                                        const int32_t* targets, float dloss, int n, int v,
                                        cudaStream_t stream);

}  // namespace satdar::core::cuda

#endif  // SATDAR_WITH_CUDA || __CUDACC__

#endif  // SATDAR_CORE_OPS_CUDA_OPS_H_
