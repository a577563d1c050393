// CheckGpuSupport of gpu_model.h: plain host code, built with or without CUDA.
#include <string>

#include "absl/strings/str_cat.h"
#include "model/gpu/gpu_model.h"
#include "model/variants/hyper_ops.h"
#include "model/variants/moe_ops.h"

namespace satdar::model::gpu {

absl::Status CheckGpuSupport(const ModelConfig& c) {
  // Every residual, value residual and FFN of MODELS.md is on the GPU path; what is refused
  // here is what its kernels cannot take.
  if (c.residual == Residual::kHc || c.residual == Residual::kMhc) {
    if (c.hc_streams > cuda::kMaxHyperStreams) {
      return absl::InvalidArgumentError(absl::StrCat("device cuda: hc_streams ", c.hc_streams,
                                                     " exceeds the GPU kernels' limit of ",
                                                     cuda::kMaxHyperStreams));
    }
    // HC's dynamic_alpha (n+1, C) and dynamic_beta (1, C) run as one projection: adjacent in
    // the device table (align kDeviceAlign).
    const int64_t alpha = static_cast<int64_t>(c.hc_streams + 1) * c.hidden_size;
    if (c.residual == Residual::kHc && alpha % kDeviceAlign != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device cuda: (hc_streams + 1) x hidden_size = ", c.hc_streams + 1, " x ",
          c.hidden_size, " must be a multiple of ", kDeviceAlign));
    }
  }
  // gate_proj and up_proj run as one (2F, D) weight: adjacent in the device table, whose tensors
  // start at multiples of kDeviceAlign elements.
  const int64_t ffn = static_cast<int64_t>(c.intermediate_size) * c.hidden_size;
  if (!c.moe.has_value() && ffn % kDeviceAlign != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device cuda: intermediate_size x hidden_size = ", c.intermediate_size, " x ",
        c.hidden_size, " must be a multiple of ", kDeviceAlign));
  }
  if (c.moe.has_value()) {
    const int64_t expert = static_cast<int64_t>(c.moe->expert_intermediate_size) * c.hidden_size;
    if (expert % kDeviceAlign != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device cuda: moe.expert_intermediate_size x hidden_size = ",
          c.moe->expert_intermediate_size, " x ", c.hidden_size, " must be a multiple of ",
          kDeviceAlign));
    }
    if (c.moe->num_experts > kMoeMaxExperts) {
      return absl::InvalidArgumentError(
          absl::StrCat("device cuda: moe.num_experts ", c.moe->num_experts,
                       " exceeds the GPU router's limit of ", kMoeMaxExperts));
    }
    if (c.moe->top_k > kMoeMaxTopK) {
      return absl::InvalidArgumentError(absl::StrCat("device cuda: moe.top_k ", c.moe->top_k,
                                                     " exceeds the GPU router's limit of ",
                                                     kMoeMaxTopK));
    }
  }
  if (c.head_size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device cuda: head size hidden_size / num_attention_heads = ", c.head_size(),
        " exceeds the attention kernel's limit of 128"));
  }
  return absl::OkStatus();
}

}  // namespace satdar::model::gpu
