#include "model/gpu/gpu_denseformer.h"

#ifdef SATDAR_WITH_CUDA

#include <cuda_bf16.h>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "model/gpu/train_kernels.h"
#include "model/variants/denseformer_ops.h"

namespace satdar::model::gpu {

template <typename T>
GpuDenseFormer<T>::GpuDenseFormer(const ModelConfig& c, cudaStream_t stream,
                                  core::cuda::CachingAllocator* alloc,
                                  const std::function<int64_t(const std::string&)>& offset_of,
                                  core::cuda::Workspace* workspace)
    : layers_(c.num_hidden_layers),
      d_(c.hidden_size),
      stream_(stream),
      exec_{stream, nullptr, workspace},
      arena_(alloc, stream) {
  for (int i = 0; i < layers_; ++i) {
    dwa_off_.push_back(offset_of(absl::StrCat("model.layers.", i, ".dwa.weight")));
  }
}

template <typename T>
GpuDenseFormer<T>::~GpuDenseFormer() {
  cudaStreamSynchronize(stream_);
  arena_.FreeAll();
}

template <typename T>
absl::Status GpuDenseFormer<T>::Resize(int b, int t, const std::vector<T*>& h, T* y) {
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  arena_.FreeAll();
  SATDAR_CHECK(static_cast<int>(h.size()) == 2 * layers_ + 1) << "DenseFormer: states";
  h_ = h;
  y_ = y;
  const size_t nc = static_cast<size_t>(b) * t * d_;
  nc_ = static_cast<int64_t>(nc);
  x_.assign(layers_ + 1, h[0]);
  dx_.assign(layers_ + 1, nullptr);
  for (int j = 0; j <= layers_; ++j) {
    if (j > 0) SATDAR_RETURN_IF_ERROR(arena_.Alloc(&x_[j], nc));
    SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dx_[j], nc));
  }
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dmid_, nc));
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&dh0_, nc));
  std::vector<T*> host(x_);
  host.insert(host.end(), dx_.begin(), dx_.end());
  SATDAR_RETURN_IF_ERROR(arena_.Alloc(&ptrs_, host.size()));
  SATDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ptrs_, host.data(), host.size() * sizeof(T*),
                                              cudaMemcpyHostToDevice, stream_));
  SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // `host` goes out of scope
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuDenseFormer<T>::Forward(const float* master, const BranchForward& branch) {
  for (int i = 0; i < layers_; ++i) {
    SATDAR_RETURN_IF_ERROR(branch(2 * i + 1, h_[2 * i], y_));
    SATDAR_RETURN_IF_ERROR(Add(core::CudaExec{stream_}, h_[2 * i + 1], h_[2 * i], y_, nc_));
    SATDAR_RETURN_IF_ERROR(branch(2 * i + 2, h_[2 * i + 1], y_));
    SATDAR_RETURN_IF_ERROR(Add(core::CudaExec{stream_}, x_[i + 1], h_[2 * i + 1], y_, nc_));
    SATDAR_RETURN_IF_ERROR(
        ops::DwaForward(exec_, h_[2 * i + 2], ptrs_, i + 2, master + dwa_off_[i], nc_));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GpuDenseFormer<T>::Backward(const float* master, float* grads, const T* dx_final,
                                         const BranchBackward& branch, const T** dh0) {
  for (T* p : dx_) SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, nc_ * sizeof(T), stream_));
  const T* dy = dx_final;  // d loss / d (layer i's DWA output)
  for (int i = layers_ - 1; i >= 0; --i) {
    SATDAR_RETURN_IF_ERROR(ops::DwaBackward(exec_, ptrs_ + layers_ + 1, grads + dwa_off_[i], dy,
                                            ptrs_, i + 2, master + dwa_off_[i], nc_));
    // X_{i+1} = mid + mlp(mid), mid = in + attn(in): both branches add their paths in place.
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dmid_, dx_[i + 1], nc_ * sizeof(T),
                                                cudaMemcpyDeviceToDevice, stream_));
    SATDAR_RETURN_IF_ERROR(branch(2 * i + 2, h_[2 * i + 1], dmid_, dmid_));
    SATDAR_RETURN_IF_ERROR(branch(2 * i + 1, h_[2 * i], dmid_, dmid_));
    dy = dmid_;
  }
  SATDAR_RETURN_IF_ERROR(Add(core::CudaExec{stream_}, dh0_, dmid_, dx_[0], nc_));
  *dh0 = dh0_;
  return absl::OkStatus();
}

template class GpuDenseFormer<float>;
template class GpuDenseFormer<__nv_bfloat16>;

}  // namespace satdar::model::gpu

#endif  // SATDAR_WITH_CUDA
