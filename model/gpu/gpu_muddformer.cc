#include "model/gpu/gpu_muddformer.h"

#ifdef SATDAR_WITH_CUDA

#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/ops/cuda_ops.h"
#include "core/ops/gemm_cuda.h"
#include "model/gpu/train_kernels.h"
#include "model/variants/muddformer_ops.h"

namespace satdar::model::gpu {

namespace {

namespace kc = ::satdar::core::cuda;

#define GPU_CHECK(call) SATDAR_CUDA_RETURN_IF_ERROR(call)

template <typename T>
constexpr core::DType DtypeOf() {
  return std::is_same<T, float>::value ? core::DType::kF32 : core::DType::kBF16;
}

}  // namespace

template <typename T>
GpuMuddFormer<T>::GpuMuddFormer(const ModelConfig& c, cudaStream_t stream, kc::GemmHandle* gemm,
                                kc::CachingAllocator* alloc,
                                const std::function<int64_t(const std::string&)>& offset_of)
    : layers_(c.num_hidden_layers),
      d_(c.hidden_size),
      eps_(static_cast<float>(c.rms_norm_eps)),
      stream_(stream),
      gemm_(gemm),
      exec_{stream, gemm, nullptr},
      arena_(alloc, stream),
      blocks_(layers_) {
  for (int i = 0; i < layers_; ++i) {
    Block& b = blocks_[i];
    const std::string p = absl::StrCat("model.layers.", i, ".mudd");
    b.w1 = offset_of(p + ".w1");
    b.w2 = offset_of(p + ".w2");
    b.stat = offset_of(p + ".static");
    b.norm[kQ] = offset_of(absl::StrCat("model.layers.", i, ".input_layernorm.weight"));
    b.norm[kK] = offset_of(p + ".k_norm.weight");
    b.norm[kV] = offset_of(p + ".v_norm.weight");
    // As muddformer.cc: four ways (one after the last block) over X_0..X_{i+1}, a hidden
    // width of ways * sources rounded up to 64.
    b.ways = i + 1 < layers_ ? 4 : 1;
    b.sources = i + 2;
    b.hidden = (b.ways * b.sources + 63) / 64 * 64;
    b.ld = (b.ways * b.sources + 7) / 8 * 8;
  }
}

template <typename T>
GpuMuddFormer<T>::~GpuMuddFormer() {
  cudaStreamSynchronize(stream_);
  arena_.FreeAll();
}

template <typename T>
absl::Status GpuMuddFormer<T>::Resize(int b, int t, const T* h0, T* x_final, const T* dx_final) {
  GPU_CHECK(cudaStreamSynchronize(stream_));
  arena_.FreeAll();
  rows_ = b * t;
  const size_t n = rows_, nc = n * d_;
  x_.assign(layers_ + 1, const_cast<T*>(h0));
  dx_.assign(layers_ + 1, nullptr);
  for (int j = 0; j <= layers_; ++j) {
    if (j > 0) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&x_[j], nc));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dx_[j], nc));
  }
  int max_hidden = 0, max_ld = 0;
  for (int i = 0; i < layers_; ++i) {
    Block& blk = blocks_[i];
    for (int w = 0; w < 4; ++w) {
      if (i == 0) {
        blk.in[w] = h0;
      } else {
        T* p = nullptr;
        SATDAR_RETURN_IF_ERROR(arena_.Alloc(&p, nc));
        blk.in[w] = p;
      }
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.din[w], nc));
    }
    for (int w = 0; w < 3; ++w) {
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.normed[w], nc));
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.rstd[w], n));
    }
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.xa, nc));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.r, nc));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.r_rstd, n));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.h, n * blk.hidden));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.g, n * blk.hidden));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&blk.a, n * blk.ld));
    max_hidden = std::max(max_hidden, blk.hidden);
    max_ld = std::max(max_ld, blk.ld);
  }
  // The connections' pointer lists.
  std::vector<T*> host;
  for (int i = 0; i < layers_; ++i) {
    const Block& blk = blocks_[i];
    for (int w = 0; w < blk.ways; ++w) {
      host.push_back(i + 1 < layers_ ? const_cast<T*>(blocks_[i + 1].in[w]) : x_final);
    }
    for (int j = 0; j < blk.sources; ++j) host.push_back(x_[j]);
    for (int j = 0; j < blk.sources; ++j) host.push_back(dx_[j]);
    for (int w = 0; w < blk.ways; ++w) {
      host.push_back(i + 1 < layers_ ? blocks_[i + 1].din[w] : const_cast<T*>(dx_final));
    }
  }
  T** lists = nullptr;
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&lists, host.size()));
  for (int i = 0; i < layers_; ++i) {
    blocks_[i].lists = lists;
    lists += 2 * (blocks_[i].ways + blocks_[i].sources);
  }
  GPU_CHECK(cudaMemcpyAsync(blocks_[0].lists, host.data(), host.size() * sizeof(T*),
                            cudaMemcpyHostToDevice, stream_));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&y_, nc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dr_, nc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dh0_, nc));
  for (T*& p : dnormed_) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&p, nc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dg_, n * max_hidden));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&da_, n * max_ld));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&da_t_, n * max_ld));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&ones_, d_));
  const std::vector<T> ones(d_, static_cast<T>(1.0f));
  GPU_CHECK(cudaMemcpyAsync(ones_, ones.data(), d_ * sizeof(T), cudaMemcpyHostToDevice, stream_));
  GPU_CHECK(cudaStreamSynchronize(stream_));  // `host` and `ones` go out of scope
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuMuddFormer<T>::Forward(const T* w, const float* master, const Branches& br) {
  const int64_t nc = static_cast<int64_t>(rows_) * d_;
  for (int i = 0; i < layers_; ++i) {
    Block& b = blocks_[i];
    for (int k = 0; k < 3; ++k) {
      SATDAR_RETURN_IF_ERROR(kc::RmsNormForward(core::CudaExec{stream_, gemm_}, b.normed[k],
                                                b.rstd[k], b.in[k], w + b.norm[k], rows_, d_,
                                                eps_));
    }
    SATDAR_RETURN_IF_ERROR(br.attention(i, b.normed[kQ], b.normed[kK], b.normed[kV], y_));
    SATDAR_RETURN_IF_ERROR(Add(core::CudaExec{stream_, gemm_}, b.xa, b.in[kR], y_, nc));
    SATDAR_RETURN_IF_ERROR(br.forward(2 * i + 2, b.xa, y_));
    SATDAR_RETURN_IF_ERROR(Add(core::CudaExec{stream_, gemm_}, x_[i + 1], b.xa, y_, nc));
    SATDAR_RETURN_IF_ERROR(ConnectionForward(w, master, i));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuMuddFormer<T>::ConnectionForward(const T* w, const float* master, int i) {
  constexpr core::DType kDt = DtypeOf<T>();
  Block& b = blocks_[i];
  const int cs = b.ways * b.sources;
  SATDAR_RETURN_IF_ERROR(kc::RmsNormForward(core::CudaExec{stream_, gemm_}, b.r, b.r_rstd,
                                            x_[i + 1], ones_, rows_, d_, eps_));
  SATDAR_RETURN_IF_ERROR(kc::MatmulForward(core::CudaExec{stream_, gemm_}, kDt, b.h, b.r, w + b.w1,
                                           rows_, b.hidden, d_));
  SATDAR_RETURN_IF_ERROR(ops::GeluForward(exec_, b.g, b.h, static_cast<int64_t>(rows_) * b.hidden));
  SATDAR_RETURN_IF_ERROR(gemm_->GemmMixed(kDt, core::DType::kF32, false, true, rows_, cs,
                                          b.hidden, 1.0f, b.g, b.hidden, w + b.w2, b.hidden,
                                          0.0f, b.a, b.ld));
  T* const* outs = b.lists;
  const T* const* xs = b.lists + b.ways;
  SATDAR_RETURN_IF_ERROR(ops::DenseCombineForward(exec_, outs, b.ways, xs, b.sources, b.a, b.ld,
                                                  master + b.stat, rows_, d_));
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuMuddFormer<T>::ConnectionBackward(const T* w, const float* master, float* grads,
                                                  int i) {
  constexpr core::DType kDt = DtypeOf<T>();
  Block& b = blocks_[i];
  const int cs = b.ways * b.sources;
  const T* const* xs = b.lists + b.ways;
  T* const* dxs = b.lists + b.ways + b.sources;
  const T* const* douts = b.lists + b.ways + 2 * b.sources;
  SATDAR_RETURN_IF_ERROR(ops::DenseCombineBackward(exec_, da_, da_t_, grads + b.stat, dxs, douts,
                                                   b.ways, xs, b.sources, b.a, b.ld,
                                                   master + b.stat, rows_, d_));
  // a = g w2^T: dw2 (cs, hidden) += da^T g; dg = da w2.
  SATDAR_RETURN_IF_ERROR(gemm_->GemmMixed(kDt, core::DType::kF32, true, false, cs, b.hidden,
                                          rows_, 1.0f, da_t_, b.ld, b.g, b.hidden, 1.0f,
                                          grads + b.w2, b.hidden));
  SATDAR_RETURN_IF_ERROR(gemm_->Gemm(kDt, false, false, rows_, b.hidden, cs, 1.0f, da_t_, b.ld,
                                     w + b.w2, b.hidden, 0.0f, dg_, b.hidden));
  SATDAR_RETURN_IF_ERROR(
      ops::GeluBackward(exec_, dg_, dg_, b.h, static_cast<int64_t>(rows_) * b.hidden));
  SATDAR_RETURN_IF_ERROR(kc::MatmulBackwardInput(core::CudaExec{stream_, gemm_}, kDt, dr_, dg_,
                                                 w + b.w1, rows_, b.hidden, d_, 0.0f));
  SATDAR_RETURN_IF_ERROR(kc::MatmulBackwardWeightF32(core::CudaExec{stream_, gemm_}, kDt,
                                                     grads + b.w1, dg_, b.r, rows_, b.hidden, d_));
  // The RMS has no gain: no weight gradient (null).
  SATDAR_RETURN_IF_ERROR(kc::RmsNormBackward(core::CudaExec{stream_, gemm_}, dx_[i + 1], nullptr,
                                             dr_, x_[i + 1], ones_, b.r_rstd, rows_, d_));
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuMuddFormer<T>::Backward(const T* w, const float* master, float* grads,
                                        const Branches& br, const T** dh0) {
  const size_t nc = static_cast<size_t>(rows_) * d_;
  for (T* p : dx_) GPU_CHECK(cudaMemsetAsync(p, 0, nc * sizeof(T), stream_));
  for (int i = layers_ - 1; i >= 0; --i) {
    Block& b = blocks_[i];
    SATDAR_RETURN_IF_ERROR(ConnectionBackward(w, master, grads, i));
    // X_{i+1} = X_A + mlp(X_A): X_A's gradient (X^R's too) collects in din[R].
    GPU_CHECK(cudaMemcpyAsync(b.din[kR], dx_[i + 1], nc * sizeof(T), cudaMemcpyDeviceToDevice,
                              stream_));
    SATDAR_RETURN_IF_ERROR(br.backward(2 * i + 2, b.xa, dx_[i + 1], b.din[kR]));
    for (T* p : dnormed_) GPU_CHECK(cudaMemsetAsync(p, 0, nc * sizeof(T), stream_));
    SATDAR_RETURN_IF_ERROR(br.attention_backward(i, b.normed[kQ], b.normed[kK], b.normed[kV],
                                                 b.din[kR], dnormed_[kQ], dnormed_[kK],
                                                 dnormed_[kV]));
    for (int k = 0; k < 3; ++k) {
      GPU_CHECK(cudaMemsetAsync(b.din[k], 0, nc * sizeof(T), stream_));
      SATDAR_RETURN_IF_ERROR(kc::RmsNormBackward(core::CudaExec{stream_, gemm_}, b.din[k],
                                                 grads + b.norm[k], dnormed_[k], b.in[k],
                                                 w + b.norm[k], b.rstd[k], rows_, d_));
    }
  }
  // Block 0 read h0 four times, and X_0 = h0 fed every connection.
  const Block& b0 = blocks_[0];
  const int64_t n = static_cast<int64_t>(nc);
  SATDAR_RETURN_IF_ERROR(Add(core::CudaExec{stream_, gemm_}, dh0_, dx_[0], b0.din[0], n));
  for (int k = 1; k < 4; ++k)
    SATDAR_RETURN_IF_ERROR(Add(core::CudaExec{stream_, gemm_}, dh0_, dh0_, b0.din[k], n));
  *dh0 = dh0_;
  return absl::OkStatus();
}

template class GpuMuddFormer<float>;
template class GpuMuddFormer<__nv_bfloat16>;

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA
