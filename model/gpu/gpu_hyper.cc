#include "model/gpu/gpu_hyper.h"

#ifdef SATDAR_WITH_CUDA

#include <cuda_bf16.h>

#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/ops/cuda_ops.h"
#include "core/ops/gemm_cuda.h"
#include "model/variants/hyper_ops.h"

namespace satdar::model::gpu {

namespace {

namespace kc = ::satdar::core::cuda;

constexpr int kSinkhornIterations = ::satdar::model::kMhcSinkhornIterations;  // as mhc.cc
constexpr int kSinkhornSteps = 2 * kSinkhornIterations;

#define GPU_CHECK(call) SATDAR_CUDA_RETURN_IF_ERROR(call)

}  // namespace

template <typename T>
GpuHyper<T>::GpuHyper(const ModelConfig& c, cudaStream_t stream, kc::GemmHandle* gemm,
                      kc::CachingAllocator* alloc, kc::Workspace* workspace)
    : mhc_(c.residual == Residual::kMhc),
      sublayers_(2 * c.num_hidden_layers),
      n_(c.hc_streams),
      d_(c.hidden_size),
      k_(mhc_ ? n_ * (n_ + 2) : n_ + 2),
      ld_((k_ + 7) / 8 * 8),
      eps_(static_cast<float>(c.rms_norm_eps)),
      stream_(stream),
      gemm_(gemm),
      exec_{stream, gemm, workspace},
      arena_(alloc, stream),
      off_(sublayers_) {}

template <typename T>
absl::StatusOr<std::unique_ptr<GpuHyper<T>>> GpuHyper<T>::Create(
    const ModelConfig& config, cudaStream_t stream, kc::GemmHandle* gemm,
    kc::CachingAllocator* alloc, const std::function<int64_t(const std::string&)>& offset_of,
    kc::Workspace* workspace) {
  std::unique_ptr<GpuHyper> m(new GpuHyper(config, stream, gemm, alloc, workspace));
  for (int l = 1; l <= m->sublayers_; ++l) {
    const std::string p =
        absl::StrCat("model.layers.", (l - 1) / 2, l % 2 == 1 ? ".attn_" : ".mlp_",
                     m->mhc_ ? "mhc" : "hc");
    Offsets& o = m->off_[l - 1];
    if (m->mhc_) {
      o.fn = offset_of(p + ".fn");
      o.scale = offset_of(p + ".scale");
      o.base = offset_of(p + ".base");
      continue;
    }
    o.norm = offset_of(p + ".norm.weight");
    o.static_alpha = offset_of(p + ".static_alpha");
    o.static_beta = offset_of(p + ".static_beta");
    o.dynamic = offset_of(p + ".dynamic_alpha");
    o.alpha_scale = offset_of(p + ".alpha_scale");
    o.beta_scale = offset_of(p + ".beta_scale");
    // dynamic_alpha (n+1, C) and dynamic_beta (1, C) run as one (n+2, C) projection.
    if (offset_of(p + ".dynamic_beta") != o.dynamic + static_cast<int64_t>(m->n_ + 1) * m->d_) {
      return absl::InternalError(
          absl::StrCat(p, ".dynamic_alpha and .dynamic_beta are not adjacent on the device"));
    }
  }
  return m;
}

template <typename T>
GpuHyper<T>::~GpuHyper() {
  cudaStreamSynchronize(stream_);
  arena_.FreeAll();
}

template <typename T>
absl::Status GpuHyper<T>::Resize(int b, int t) {
  GPU_CHECK(cudaStreamSynchronize(stream_));
  arena_.FreeAll();
  rows_ = b * t;
  const size_t n = rows_, nc = n * d_, hc = nc * n_, hr = n * n_;
  steps_.assign(sublayers_, Step());
  for (Step& s : steps_) {
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.h, hc));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.u, nc));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.y, nc));
    if (mhc_) {
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.proj, n * ld_));
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.coef, n * 2 * n_));
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.rms, n));
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.logits, n * n_ * n_));
    } else {
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.rstd, hr));
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.proj, hr * ld_));
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&s.coef, n * n_ * (n_ + 2)));
    }
  }
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&h_last_, hc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dnext_, hc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dh_, hc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dy_, nc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&du_, nc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dh0_, nc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dcoef_, n * n_ * (n_ + 2)));
  if (mhc_) {
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dproj_, n * ld_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&sinkhorn_, n * kSinkhornSteps * n_ * n_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dres_, n * n_ * n_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dlogits_, n * n_ * n_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dz_, n * k_));
  } else {
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dproj_, hr * ld_));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&hbar_, hc));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuHyper<T>::Coefficients(const T* w, const float* master, int l) {
  constexpr core::DType kDt =
      std::is_same<T, float>::value ? core::DType::kF32 : core::DType::kBF16;
  Step& s = steps_[l - 1];
  const Offsets& o = off_[l - 1];
  const int hr = rows_ * n_, nd = n_ * d_;
  if (mhc_) {
    SATDAR_RETURN_IF_ERROR(ops::MhcRms(exec_, s.rms, s.h, rows_, nd, eps_));
    SATDAR_RETURN_IF_ERROR(gemm_->GemmMixed(kDt, core::DType::kF32, false, true, rows_, k_, nd,
                                            1.0f, s.h, nd, w + o.fn, nd, 0.0f, s.proj, ld_));
    SATDAR_RETURN_IF_ERROR(ops::MhcCoefForward(exec_, s.coef, s.logits, s.proj, ld_, s.rms,
                                               master + o.scale, master + o.base, rows_, n_));
    return ops::SinkhornForward(exec_, sinkhorn_, s.logits, rows_, n_, kSinkhornIterations);
  }
  SATDAR_RETURN_IF_ERROR(
      kc::RmsNormForward(core::CudaExec{stream_}, hbar_, s.rstd, s.h, w + o.norm, hr, d_, eps_));
  SATDAR_RETURN_IF_ERROR(gemm_->GemmMixed(kDt, core::DType::kF32, false, true, hr, k_, d_, 1.0f,
                                          hbar_, d_, w + o.dynamic, d_, 0.0f, s.proj, ld_));
  // proj holds dynamic_alpha's n+1 columns, then dynamic_beta's one: ta = proj, tb = proj + n+1.
  return ops::HcCoefForward(exec_, s.coef, s.proj, ld_, s.proj + n_ + 1, ld_,
                            master + o.static_alpha, master + o.static_beta, master + o.alpha_scale,
                            master + o.beta_scale, rows_, n_);
}

template <typename T>
absl::Status GpuHyper<T>::Forward(const T* w, const float* master, const T* h0, T* x_final,
                                  const BranchForward& branch) {
  SATDAR_RETURN_IF_ERROR(ops::StreamsBroadcast(exec_, steps_[0].h, h0, rows_, n_, d_));
  for (int l = 1; l <= sublayers_; ++l) {
    Step& s = steps_[l - 1];
    SATDAR_RETURN_IF_ERROR(Coefficients(w, master, l));
    const HyperCoefs<float> c = Coefs(s.coef);
    SATDAR_RETURN_IF_ERROR(ops::HyperWidthForward(exec_, s.u, s.h, c, rows_, n_, d_));
    SATDAR_RETURN_IF_ERROR(branch(l, s.u, s.y));
    T* next = l < sublayers_ ? steps_[l].h : h_last_;
    SATDAR_RETURN_IF_ERROR(ops::HyperDepthForward(exec_, next, s.h, s.y, c, rows_, n_, d_));
  }
  return ops::StreamsSum(exec_, x_final, h_last_, rows_, n_, d_);
}

// mHC's res is the last Sinkhorn iterate in the one shared sinkhorn_ buffer: valid from the
// step's Coefficients (forward) or its recomputation (backward) until the next sublayer's;
// the branch in between never touches it.
template <typename T>
HyperCoefs<float> GpuHyper<T>::Coefs(float* coef) const {
  if (!mhc_) return HcCoefs(coef, n_);
  HyperCoefs<float> c;
  c.pre = coef;
  c.pre_token = 2 * n_;
  c.post = coef + n_;
  c.post_token = 2 * n_;
  c.res = sinkhorn_ + (kSinkhornSteps - 1) * n_ * n_;  // the last iterate
  c.res_token = kSinkhornSteps * n_ * n_;
  c.res_row = n_;
  return c;
}

template <typename T>
HyperCoefs<float> GpuHyper<T>::GradCoefs() const {
  if (!mhc_) return HcCoefs(dcoef_, n_);
  HyperCoefs<float> c;  // [dpre | dpost | unused] per token; dres (N, n, n) for the Sinkhorn
  c.pre = dcoef_;
  c.pre_token = k_;
  c.post = dcoef_ + n_;
  c.post_token = k_;
  c.res = dres_;
  c.res_token = n_ * n_;
  c.res_row = n_;
  return c;
}

template <typename T>
absl::Status GpuHyper<T>::Backward(const T* w, const float* master, float* grads,
                                   const T* dx_final, const BranchBackward& branch,
                                   const T** dh0) {
  const size_t nc = static_cast<size_t>(rows_) * d_;
  SATDAR_RETURN_IF_ERROR(ops::StreamsBroadcast(exec_, dnext_, dx_final, rows_, n_, d_));
  for (int l = sublayers_; l >= 1; --l) {
    const Step& s = steps_[l - 1];
    if (mhc_) {  // the Sinkhorn iterates of this sublayer (the same bits as in the forward)
      SATDAR_RETURN_IF_ERROR(
          ops::SinkhornForward(exec_, sinkhorn_, s.logits, rows_, n_, kSinkhornIterations));
    }
    const HyperCoefs<float> c = Coefs(s.coef), dc = GradCoefs();
    SATDAR_RETURN_IF_ERROR(
        ops::HyperDepthBackward(exec_, dy_, dh_, dc, dnext_, s.y, s.h, c, rows_, n_, d_));
    GPU_CHECK(cudaMemsetAsync(du_, 0, nc * sizeof(T), stream_));
    SATDAR_RETURN_IF_ERROR(branch(l, s.u, dy_, du_));
    SATDAR_RETURN_IF_ERROR(ops::HyperWidthBackward(exec_, dh_, dc, du_, s.h, c, rows_, n_, d_));
    SATDAR_RETURN_IF_ERROR(CoefficientsBackward(w, master, grads, l, dh_));
    std::swap(dnext_, dh_);  // dnext_ = d loss / d H before sublayer l
  }
  // Every stream began as h0.
  SATDAR_RETURN_IF_ERROR(ops::StreamsSum(exec_, dh0_, dnext_, rows_, n_, d_));
  *dh0 = dh0_;
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuHyper<T>::CoefficientsBackward(const T* w, const float* master, float* grads,
                                               int l, T* dh) {
  constexpr core::DType kDt =
      std::is_same<T, float>::value ? core::DType::kF32 : core::DType::kBF16;
  const Step& s = steps_[l - 1];
  const Offsets& o = off_[l - 1];
  const int hr = rows_ * n_, nd = n_ * d_;
  if (mhc_) {
    SATDAR_RETURN_IF_ERROR(
        ops::SinkhornBackward(exec_, dlogits_, dres_, sinkhorn_, rows_, n_, kSinkhornIterations));
    SATDAR_RETURN_IF_ERROR(ops::MhcCoefBackward(exec_, dproj_, dz_, grads + o.scale, grads + o.base,
                                                dh, dcoef_, dlogits_, s.coef, s.proj, ld_, s.rms,
                                                master + o.scale, s.h, rows_, n_, nd));
    SATDAR_RETURN_IF_ERROR(gemm_->Gemm(kDt, false, false, rows_, nd, k_, 1.0f, dproj_, ld_,
                                       w + o.fn, nd, 1.0f, dh, nd));
    return gemm_->GemmMixed(kDt, core::DType::kF32, true, false, k_, nd, rows_, 1.0f, dproj_, ld_,
                            s.h, nd, 1.0f, grads + o.fn, nd);
  }
  // dproj_ (N*n, ld_): d/d the projections (ta's n+1 columns, then tb's); the four
  // parameters' gradients, summed over the tokens in a fixed order.
  SATDAR_RETURN_IF_ERROR(ops::HcCoefBackward(
      exec_, dproj_, dproj_ + n_ + 1, grads + o.static_alpha, grads + o.static_beta,
      grads + o.alpha_scale, grads + o.beta_scale, dcoef_, s.proj, ld_, s.proj + n_ + 1, ld_,
      master + o.alpha_scale, master + o.beta_scale, rows_, n_));
  // RMSNorm(H_j) again (the same bits as the forward's), then back through the projection.
  float* rstd = s.rstd;
  SATDAR_RETURN_IF_ERROR(
      kc::RmsNormForward(core::CudaExec{stream_}, hbar_, rstd, s.h, w + o.norm, hr, d_, eps_));
  SATDAR_RETURN_IF_ERROR(gemm_->GemmMixed(kDt, core::DType::kF32, true, false, k_, d_, hr, 1.0f,
                                          dproj_, ld_, hbar_, d_, 1.0f, grads + o.dynamic, d_));
  // hbar_ becomes its own gradient (the GEMM above is ordered before on the stream).
  SATDAR_RETURN_IF_ERROR(gemm_->Gemm(kDt, false, false, hr, d_, k_, 1.0f, dproj_, ld_,
                                     w + o.dynamic, d_, 0.0f, hbar_, d_));
  SATDAR_RETURN_IF_ERROR(kc::RmsNormBackward(core::CudaExec{stream_}, dh, grads + o.norm, hbar_,
                                             s.h, w + o.norm, rstd, hr, d_));
  return absl::OkStatus();
}

template class GpuHyper<float>;
template class GpuHyper<__nv_bfloat16>;

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA
