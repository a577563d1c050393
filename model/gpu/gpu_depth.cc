#include "model/gpu/gpu_depth.h"

#ifdef SATDAR_WITH_CUDA

#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "model/gpu/train_kernels.h"
#include "model/variants/dar_ops.h"
#include "model/variants/depth_retrieval_ops.h"

namespace satdar::model::gpu {

namespace {
#define GPU_CHECK(call) SATDAR_CUDA_RETURN_IF_ERROR(call)
}  // namespace

template <typename T>
GpuDepthResidual<T>::GpuDepthResidual(const ModelConfig& c, cudaStream_t stream,
                                      core::cuda::CachingAllocator* alloc,
                                      const std::function<int64_t(const std::string&)>& offset_of,
                                      core::cuda::Workspace* workspace)
    : dar_(c.residual == Residual::kDar),
      attnres_(c.residual == Residual::kAttnRes),
      streams_(dar_ ? 2 : 1),
      sublayers_(2 * c.num_hidden_layers),
      block_(c.block_size > 0 ? c.block_size : (dar_ ? 2 : 1)),
      d_(c.hidden_size),
      eps_(static_cast<float>(c.rms_norm_eps)),
      stream_(stream),
      exec_{stream, nullptr, workspace},
      arena_(alloc, stream) {
  SATDAR_CHECK(dar_ || attnres_) << "GpuDepthResidual: residual " << Name(c.residual);
  dar_off_.resize(sublayers_ + 1);
  const char* kind = dar_ ? "dar" : "res";
  for (int l = 1; l <= sublayers_ + 1; ++l) {
    const std::string p = l == sublayers_ + 1
                              ? absl::StrCat("model.final_", kind)
                              : absl::StrCat("model.layers.", (l - 1) / 2,
                                             l % 2 == 1 ? ".attn_" : ".mlp_", kind);
    DarOffsets& o = dar_off_[l - 1];
    o.query = offset_of(p + ".query");
    o.norm = offset_of(p + ".norm.weight");
    if (attnres_) continue;  // one stream: no mix, transport or write gates
    o.mix = offset_of(p + ".mix");
    if (l <= sublayers_) {
      o.transport = offset_of(p + ".transport");
      o.write = offset_of(p + ".write");
    }
  }
  // route_[s] = {key stream, value stream}: the CPU model's DarRoute (one stream for AttnRes).
  if (attnres_) route_ = {{{0, 0}, {0, 0}}};
  if (dar_) route_ = DarRoute(c.dar_variant);
}

template <typename T>
GpuDepthResidual<T>::~GpuDepthResidual() {
  cudaStreamSynchronize(stream_);
  arena_.FreeAll();
}

template <typename T>
absl::Status GpuDepthResidual<T>::Resize(int b, int t, const T* h0, T* x_final) {
  GPU_CHECK(cudaStreamSynchronize(stream_));
  arena_.FreeAll();
  rows_ = b * t;
  h0_ = h0;
  x_final_ = x_final;
  return ResizeSteps(static_cast<size_t>(rows_));
}

template <typename T>
absl::Status GpuDepthResidual<T>::Forward(const T* w, const float* master,
                                          const BranchForward& branch) {
  w_ = w;
  master_ = master;
  fwd_ = &branch;
  absl::Status s = RunForward();
  fwd_ = nullptr;
  return s;
}

template <typename T>
absl::Status GpuDepthResidual<T>::Backward(const T* w, const float* master, float* grads,
                                           const T* dx_final, const BranchBackward& branch,
                                           const T** dh0) {
  w_ = w;
  master_ = master;
  g_ = grads;
  bwd_ = &branch;
  absl::Status s = RunBackward(dx_final, dh0);
  bwd_ = nullptr;
  return s;
}

template <typename T>
absl::Status GpuDepthResidual<T>::ResizeSteps(size_t n) {
  const size_t nc = n * d_;
  const int smax = MaxSources();
  steps_.assign(sublayers_ + 1, DarStep());
  for (int k = 0; k <= sublayers_; ++k) {
    DarStep& st = steps_[k];
    if (k < sublayers_) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&st.u, nc));
    if (k < sublayers_) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&st.y, nc));
    for (int s = 0; s < streams_; ++s) {
      if (dar_) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&st.r[s], nc));  // AttnRes retrieves into u
      SATDAR_RETURN_IF_ERROR(arena_.Alloc(&st.alpha[s], n * smax));
      if (k >= 1) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&st.partial[s], nc));
    }
  }
  for (int s = 0; s < streams_; ++s) {
    dsources_[s].assign(smax, nullptr);
    for (int j = 0; j < smax; ++j) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dsources_[s][j], nc));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dpartial_[s], nc));
    if (dar_) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dr_[s], nc));
  }
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&du_, nc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dy_, nc));
  if (dar_) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dh0_buf_, nc));
  // Pointer lists, fixed for this (B, T).
  std::vector<T*> host(static_cast<size_t>(sublayers_ + 1) * 2 * 4 * smax, nullptr);
  auto source = [&](int stream, int j) -> T* {
    return j == 0 ? const_cast<T*>(h0_) : steps_[j * block_].partial[stream];
  };
  for (int l = 1; l <= sublayers_ + 1; ++l) {
    const int m = Entries(l);
    for (int s = 0; s < streams_; ++s) {
      const int streams[2] = {route_[s][0], route_[s][1]};  // key, value
      for (int which = 0; which < 4; ++which) {
        const int stream = streams[which % 2];
        T** list = host.data() + ((static_cast<size_t>(l - 1) * 2 + s) * 4 + which) * smax;
        for (int j = 0; j < m; ++j) list[j] = which < 2 ? source(stream, j) : dsources_[stream][j];
        if (HasPartial(l)) {
          list[m] = which < 2 ? steps_[l - 1].partial[stream] : dpartial_[stream];
        }
      }
    }
  }
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dar_ptrs_, host.size()));
  GPU_CHECK(cudaMemcpyAsync(dar_ptrs_, host.data(), host.size() * sizeof(T*),
                            cudaMemcpyHostToDevice, stream_));
  // The upload reads `host`, which goes out of scope.
  GPU_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuDepthResidual<T>::RunForward() {
  const int n = rows_;
  const int64_t nc = static_cast<int64_t>(n) * d_;
  for (int l = 1; l <= sublayers_ + 1; ++l) {
    DarStep& st = steps_[l - 1];
    const DarOffsets& o = dar_off_[l - 1];
    T* u = l <= sublayers_ ? st.u : x_final_;
    for (int s = 0; s < streams_; ++s) {
      SATDAR_RETURN_IF_ERROR(ops::DepthRetrievalForward(
          exec_, attnres_ ? u : st.r[s], st.alpha[s], PtrList(l, s, 0), PtrList(l, s, 1),
          Sources(l), W(o.query + s * d_), W(o.norm), n, d_, eps_));
    }
    if (dar_) {
      SATDAR_RETURN_IF_ERROR(ops::DarMixForward(exec_, u, st.r[0], st.r[1], master_ + o.mix, nc));
    }
    if (l > sublayers_) break;
    SATDAR_RETURN_IF_ERROR((*fwd_)(l, u, st.y));
    const bool p = HasPartial(l);
    if (attnres_) {  // P = P + y, or y when P is empty
      if (p) {
        SATDAR_RETURN_IF_ERROR(
            Add(core::CudaExec{stream_}, steps_[l].partial[0], st.partial[0], st.y, nc));
      } else {
        GPU_CHECK(cudaMemcpyAsync(steps_[l].partial[0], st.y, nc * sizeof(T),
                                  cudaMemcpyDeviceToDevice, stream_));
      }
      continue;
    }
    SATDAR_RETURN_IF_ERROR(ops::DarWriteForward(
        exec_, steps_[l].partial[0], steps_[l].partial[1], p ? st.partial[0] : nullptr,
        p ? st.partial[1] : nullptr, st.y, master_ + o.transport, master_ + o.write, nc));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuDepthResidual<T>::DarRetrievalBackward(int l, const T* du) {
  const int n = rows_;
  const DarStep& st = steps_[l - 1];
  const DarOffsets& o = dar_off_[l - 1];
  if (dar_) {
    SATDAR_RETURN_IF_ERROR(ops::DarMixBackward(exec_, dr_[0], dr_[1], du, st.r[0], st.r[1],
                                               master_ + o.mix, g_ + o.mix,
                                               static_cast<int64_t>(n) * d_));
  }
  for (int s = 0; s < streams_; ++s) {
    SATDAR_RETURN_IF_ERROR(ops::DepthRetrievalBackward(
        exec_, PtrList(l, s, 2), PtrList(l, s, 3), g_ + o.query + s * d_, g_ + o.norm,
        attnres_ ? du : dr_[s], st.alpha[s], PtrList(l, s, 0), PtrList(l, s, 1), Sources(l),
        W(o.query + s * d_), W(o.norm), n, d_, eps_));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuDepthResidual<T>::RunBackward(const T* dx_final, const T** dh0) {
  const int n = rows_;
  const size_t nc = static_cast<size_t>(n) * d_;
  for (int s = 0; s < streams_; ++s) {
    for (T* p : dsources_[s]) GPU_CHECK(cudaMemsetAsync(p, 0, nc * sizeof(T), stream_));
    GPU_CHECK(cudaMemsetAsync(dpartial_[s], 0, nc * sizeof(T), stream_));
  }
  SATDAR_RETURN_IF_ERROR(DarRetrievalBackward(sublayers_ + 1, dx_final));
  for (int l = sublayers_; l >= 1; --l) {
    const DarStep& st = steps_[l - 1];
    const DarOffsets& o = dar_off_[l - 1];
    const bool closes = l % block_ == 0;  // the write completed an entry
    const T* g0 = closes ? dsources_[0][Entries(l)] : dpartial_[0];
    const bool p = HasPartial(l);
    GPU_CHECK(cudaMemsetAsync(du_, 0, nc * sizeof(T), stream_));
    if (attnres_) {
      // P_after = P_before + y: y gets P_after's gradient (read in place, before dpartial_
      // changes), and so does P_before.
      SATDAR_RETURN_IF_ERROR((*bwd_)(l, st.u, g0, du_));
      if (!p) {
        GPU_CHECK(cudaMemsetAsync(dpartial_[0], 0, nc * sizeof(T), stream_));
      } else if (closes) {
        GPU_CHECK(cudaMemcpyAsync(dpartial_[0], g0, nc * sizeof(T), cudaMemcpyDeviceToDevice,
                                  stream_));
      }
    } else {
      const T* g1 = closes ? dsources_[1][Entries(l)] : dpartial_[1];
      SATDAR_RETURN_IF_ERROR(ops::DarWriteBackward(
          exec_, dy_, dpartial_[0], dpartial_[1], g0, g1, st.y, p ? st.partial[0] : nullptr,
          p ? st.partial[1] : nullptr, master_ + o.transport, master_ + o.write, g_ + o.transport,
          g_ + o.write, static_cast<int64_t>(nc)));
      SATDAR_RETURN_IF_ERROR((*bwd_)(l, st.u, dy_, du_));
    }
    SATDAR_RETURN_IF_ERROR(DarRetrievalBackward(l, du_));
  }
  if (attnres_) {
    *dh0 = dsources_[0][0];
    return absl::OkStatus();
  }
  // Both streams start from h0.
  SATDAR_RETURN_IF_ERROR(Add(core::CudaExec{stream_}, dh0_buf_, dsources_[0][0], dsources_[1][0],
                             static_cast<int64_t>(nc)));
  *dh0 = dh0_buf_;
  return absl::OkStatus();
}

template class GpuDepthResidual<float>;
template class GpuDepthResidual<__nv_bfloat16>;

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA
