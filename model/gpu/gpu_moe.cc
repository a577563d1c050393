#include "model/gpu/gpu_moe.h"

#ifdef SATDAR_WITH_CUDA

#include <cuda_bf16.h>

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/ops/cuda_ops.h"
#include "core/ops/gemm_cuda.h"
#include "model/gpu/train_kernels.h"
#include "model/variants/moe_ops.h"

namespace satdar::model::gpu {

namespace kc = ::satdar::core::cuda;

namespace {

template <typename T>
constexpr core::DType DtOf() {
  return std::is_same<T, float>::value ? core::DType::kF32 : core::DType::kBF16;
}

std::string ExpertName(int i, const char* group, int e) {
  return absl::StrCat("model.layers.", i, ".mlp.", group, ".", e, ".gate_proj.weight");
}

}  // namespace

template <typename T>
GpuMoe<T>::GpuMoe(const ModelConfig& c, cudaStream_t stream, kc::GemmHandle* gemm,
                  kc::CachingAllocator* alloc, kc::Workspace* workspace)
    : c_(c),
      d_(c.hidden_size),
      e_(c.moe->num_experts),
      k_(c.moe->top_k),
      f_(c.moe->expert_intermediate_size),
      shared_(c.moe->num_shared_experts),
      norm_topk_(c.moe->norm_topk_prob),
      stream_(stream),
      gemm_(gemm),
      exec_{stream, gemm, workspace},
      arena_(alloc, stream) {}

template <typename T>
GpuMoe<T>::~GpuMoe() {
  cudaStreamSynchronize(stream_);
  arena_.FreeAll();
  if (pinned_counts_ != nullptr) cudaFreeHost(pinned_counts_);
}

template <typename T>
absl::StatusOr<std::unique_ptr<GpuMoe<T>>> GpuMoe<T>::Create(
    const ModelConfig& c, cudaStream_t stream, kc::GemmHandle* gemm, kc::CachingAllocator* alloc,
    const std::function<int64_t(const std::string&)>& offset_of, kc::Workspace* workspace) {
  if (!c.moe.has_value()) return absl::InvalidArgumentError("GpuMoe: the config has no moe");
  std::unique_ptr<GpuMoe> m(new GpuMoe(c, stream, gemm, alloc, workspace));
  const int64_t fd = static_cast<int64_t>(m->f_) * m->d_;
  m->off_.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerOffsets& o = m->off_[i];
    o.router = offset_of(absl::StrCat("model.layers.", i, ".mlp.router.weight"));
    for (const char* group : {"experts", "shared_experts"}) {
      const bool routed = group[0] == 'e';
      for (int e = 0; e < (routed ? m->e_ : m->shared_); ++e) {
        const int64_t gate = offset_of(ExpertName(i, group, e));
        const std::string prefix = absl::StrCat("model.layers.", i, ".mlp.", group, ".", e, ".");
        // One (2F, D) GEMM for gate and up; down follows.
        if (offset_of(prefix + "up_proj.weight") != gate + fd ||
            offset_of(prefix + "down_proj.weight") != gate + 2 * fd) {
          return absl::InternalError(
              absl::StrCat(prefix, "{gate,up,down}_proj are not adjacent in the device buffers"));
        }
        (routed ? o.experts : o.shared).push_back(gate);
      }
    }
  }
  SATDAR_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&m->pinned_counts_), m->e_ * sizeof(int)));
  return m;
}

template <typename T>
absl::Status GpuMoe<T>::Resize(int b, int t, bool shared_sets) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  arena_.FreeAll();
  b_ = t_ = 0;
  const size_t n = static_cast<size_t>(b) * t, nk = n * k_;  // nk = R rows (dropless)
  const int layers = c_.num_hidden_layers;
  saved_.assign(layers, Saved());
  for (int i = 0; i < (shared_sets ? 1 : layers); ++i) {
    Saved& s = saved_[i];
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.probs, n * e_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.lse, n));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.weight, nk));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.fraction, static_cast<size_t>(b) * e_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.sel, nk));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.counts, e_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.slots, nk));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.row_of_slot, nk));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.xp, nk * d_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.gate_up, nk * 2 * f_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.act, nk * f_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.y, nk * d_));
    s.shared_gate_up.assign(shared_, nullptr);
    s.shared_act.assign(shared_, nullptr);
    for (int j = 0; j < shared_; ++j) {
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.shared_gate_up[j], n * 2 * f_));
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.shared_act[j], n * f_));
    }
  }
  for (int i = 1; shared_sets && i < layers; ++i) saved_[i] = saved_[0];
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&logits_, n * e_));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dweight_, nk));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dlogits_, n * e_));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dy_, nk * d_));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dact_, nk * f_));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dgate_up_, nk * 2 * f_));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dxp_, nk * d_));
  if (shared_ > 0) {
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&shared_out_, n * d_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dsact_, n * f_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dsgate_up_, n * 2 * f_));
  }
  b_ = b;
  t_ = t;
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuMoe<T>::Forward(int layer, const T* w, const T* z, T* out, double* loss_acc,
                                double scale) {
  constexpr core::DType kDt = DtOf<T>();
  const LayerOffsets& o = off_[layer];
  Saved& s = saved_[layer];
  const int n = b_ * t_;
  const int64_t fd = static_cast<int64_t>(f_) * d_;
  // Router logits in fp32: (N, E) = z (N, D) W_router^T.
  SATDAR_RETURN_IF_ERROR(gemm_->GemmMixed(kDt, core::DType::kF32, false, true, n, e_, d_, 1.0f, z,
                                          d_, w + o.router, d_, 0.0f, logits_, e_));
  SATDAR_RETURN_IF_ERROR(
      ops::MoeRoute(exec_, s.probs, s.lse, s.sel, s.weight, logits_, n, e_, k_, norm_topk_));
  SATDAR_RETURN_IF_ERROR(ops::MoePlan(exec_, s.counts, s.slots, s.row_of_slot, s.sel, n, e_, k_));
  // With loss_acc null (recomputation: the loss was counted already) only the fraction the
  // backward needs is computed.
  SATDAR_RETURN_IF_ERROR(ops::MoeRouterLoss(exec_, loss_acc, s.fraction, s.probs, s.lse, s.sel, b_,
                                            t_, e_, k_, c_.moe->router_aux_loss_coef,
                                            c_.moe->router_z_loss_coef, scale));
  // Each expert's GEMMs need its row count on the host.
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pinned_counts_, s.counts, e_ * sizeof(int),
                                              cudaMemcpyDeviceToHost, stream_));
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  s.host_counts.assign(pinned_counts_, pinned_counts_ + e_);
  const int rows = n * k_;
  SATDAR_RETURN_IF_ERROR(ops::MoePermute<T>(exec_, s.xp, z, s.slots, rows, k_, d_));
  const std::vector<const void*> gate_w = ExpertWeights(o, w, 0), down_w = ExpertWeights(o, w, 2);
  SATDAR_RETURN_IF_ERROR(kc::GroupedMatmulForward(core::CudaExec{stream_, gemm_}, kDt, s.gate_up,
                                                  s.xp, gate_w.data(), s.host_counts.data(), e_,
                                                  2 * f_, d_));
  SATDAR_RETURN_IF_ERROR(
      kc::SwigluForward(core::CudaExec{stream_, gemm_}, s.act, s.gate_up, rows, f_));
  SATDAR_RETURN_IF_ERROR(kc::GroupedMatmulForward(core::CudaExec{stream_, gemm_}, kDt, s.y, s.act,
                                                  down_w.data(), s.host_counts.data(), e_, d_, f_));
  SATDAR_RETURN_IF_ERROR(ops::MoeCombine<T>(exec_, out, s.y, s.weight, s.row_of_slot, n, k_, d_));
  for (int j = 0; j < shared_; ++j) {
    SATDAR_RETURN_IF_ERROR(kc::MatmulForward(core::CudaExec{stream_, gemm_}, kDt,
                                             s.shared_gate_up[j], z, w + o.shared[j], n, 2 * f_,
                                             d_));
    SATDAR_RETURN_IF_ERROR(kc::SwigluForward(core::CudaExec{stream_, gemm_}, s.shared_act[j],
                                             s.shared_gate_up[j], n, f_));
    SATDAR_RETURN_IF_ERROR(kc::MatmulForward(core::CudaExec{stream_, gemm_}, kDt, shared_out_,
                                             s.shared_act[j], w + o.shared[j] + 2 * fd, n, d_, f_));
    SATDAR_RETURN_IF_ERROR(
        Add(core::CudaExec{stream_, gemm_}, out, out, shared_out_, static_cast<int64_t>(n) * d_));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuMoe<T>::Backward(int layer, const T* w, float* grads, const T* z, const T* dout,
                                 T* dz, double loss_scale) {
  constexpr core::DType kDt = DtOf<T>();
  const LayerOffsets& o = off_[layer];
  const Saved& s = saved_[layer];
  if (static_cast<int>(s.host_counts.size()) != e_) {
    return absl::FailedPreconditionError("GpuMoe::Backward without a Forward of the layer");
  }
  const int n = b_ * t_, rows = n * k_;
  const int64_t fd = static_cast<int64_t>(f_) * d_;
  SATDAR_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(dz, 0, static_cast<size_t>(n) * d_ * sizeof(T), stream_));
  for (int j = 0; j < shared_; ++j) {
    const int64_t gate = o.shared[j], down = gate + 2 * fd;
    SATDAR_RETURN_IF_ERROR(kc::MatmulBackwardInput(core::CudaExec{stream_, gemm_}, kDt, dsact_,
                                                   dout, w + down, n, d_, f_, 0.0f));
    SATDAR_RETURN_IF_ERROR(kc::MatmulBackwardWeightF32(
        core::CudaExec{stream_, gemm_}, kDt, grads + down, dout, s.shared_act[j], n, d_, f_));
    SATDAR_RETURN_IF_ERROR(kc::SwigluBackward(core::CudaExec{stream_, gemm_}, dsgate_up_, dsact_,
                                              s.shared_gate_up[j], n, f_));
    SATDAR_RETURN_IF_ERROR(kc::MatmulBackwardInput(core::CudaExec{stream_, gemm_}, kDt, dz,
                                                   dsgate_up_, w + gate, n, 2 * f_, d_, 1.0f));
    SATDAR_RETURN_IF_ERROR(kc::MatmulBackwardWeightF32(core::CudaExec{stream_, gemm_}, kDt,
                                                       grads + gate, dsgate_up_, z, n, 2 * f_, d_));
  }
  // Combine: each row's output gradient and each slot's weight gradient.
  SATDAR_RETURN_IF_ERROR(
      ops::MoeCombineBackward<T>(exec_, dy_, dweight_, dout, s.y, s.weight, s.slots, rows, k_, d_));
  const std::vector<const void*> gate_w = ExpertWeights(o, w, 0), down_w = ExpertWeights(o, w, 2);
  std::vector<float*> gate_g(e_), down_g(e_);
  for (int e = 0; e < e_; ++e) {
    gate_g[e] = grads + o.experts[e];
    down_g[e] = grads + o.experts[e] + 2 * fd;
  }
  SATDAR_RETURN_IF_ERROR(kc::GroupedMatmulBackwardF32(core::CudaExec{stream_, gemm_}, kDt, dact_,
                                                      down_g.data(), dy_, s.act, down_w.data(),
                                                      s.host_counts.data(), e_, d_, f_));
  SATDAR_RETURN_IF_ERROR(
      kc::SwigluBackward(core::CudaExec{stream_, gemm_}, dgate_up_, dact_, s.gate_up, rows, f_));
  SATDAR_RETURN_IF_ERROR(kc::GroupedMatmulBackwardF32(core::CudaExec{stream_, gemm_}, kDt, dxp_,
                                                      gate_g.data(), dgate_up_, s.xp, gate_w.data(),
                                                      s.host_counts.data(), e_, 2 * f_, d_));
  SATDAR_RETURN_IF_ERROR(ops::MoePermuteBackward<T>(exec_, dz, dxp_, s.row_of_slot, n, k_, d_));
  // The router: the routing weights' gradient plus the aux and z losses, through the softmax.
  const double aux_grad =
      loss_scale * c_.moe->router_aux_loss_coef * e_ / (static_cast<double>(b_) * t_);
  const double z_grad = loss_scale * c_.moe->router_z_loss_coef * 2.0 / n;
  SATDAR_RETURN_IF_ERROR(ops::MoeRouteBackward<T>(exec_, dlogits_, s.probs, s.lse, s.sel, s.weight,
                                                  dweight_, s.fraction, b_, t_, e_, k_, norm_topk_,
                                                  aux_grad, z_grad));
  SATDAR_RETURN_IF_ERROR(kc::MatmulBackwardInput(core::CudaExec{stream_, gemm_}, kDt, dz, dlogits_,
                                                 w + o.router, n, e_, d_, 1.0f));
  return kc::MatmulBackwardWeightF32(core::CudaExec{stream_, gemm_}, kDt, grads + o.router,
                                     dlogits_, z, n, e_, d_);
}

template <typename T>
std::vector<const void*> GpuMoe<T>::ExpertWeights(const LayerOffsets& o, const T* w,
                                                  int part) const {
  std::vector<const void*> out;
  for (int64_t gate : o.experts) out.push_back(w + gate + part * static_cast<int64_t>(f_) * d_);
  return out;
}

template class GpuMoe<float>;
template class GpuMoe<__nv_bfloat16>;

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA
