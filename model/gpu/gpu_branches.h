// model/gpu/gpu_branches.h: how the GPU topologies (gpu_depth, gpu_denseformer, gpu_hyper,
// gpu_muddformer) call the decoder's sublayer branches (gpu_model.cc): sublayer l = 2i+1 is
// layer i's attention, 2i+2 its FFN, as model/branches.h.
#ifndef SATDAR_MODEL_GPU_GPU_BRANCHES_H_
#define SATDAR_MODEL_GPU_GPU_BRANCHES_H_

#include <functional>

#include "absl/status/status.h"

namespace satdar::model::gpu {

// y = f_l(u), (B, T, C) device buffers.
template <typename T>
using GpuBranchForward = std::function<absl::Status(int l, const T* u, T* y)>;
// du += d/du <dy, f_l(u)>; dy may alias du (it is read before du is written).
template <typename T>
using GpuBranchBackward = std::function<absl::Status(int l, const T* u, const T* dy, T* du)>;

}  // namespace satdar::model::gpu

#endif  // SATDAR_MODEL_GPU_GPU_BRANCHES_H_
