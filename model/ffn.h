// model/ffn.h: the feed-forward branch of each block, from the normed input z to its output:
// the dense SwiGLU MLP (dense_ffn.cc) or the sparse MoE (variants/moe.cc).
//
// Templated on the backend B (model/backend.h), as topology.h.
#ifndef SATDAR_MODEL_FFN_H_
#define SATDAR_MODEL_FFN_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/param_table.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

template <class B>
class FfnT {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;

  virtual ~FfnT() = default;
  // Finds its parameters' offsets; the design's AddParamsFn (param_layout.h) added layer i's
  // after its post_attention_layernorm.
  virtual void Bind(const ParamTable& table) = 0;
  virtual absl::Status Resize(int b, int t) = 0;
  // out (B*T, C) = FFN_i(z), z (B*T, C). Returns layer i's auxiliary loss (0 when none).
  virtual absl::StatusOr<double> Forward(int i, const Weights<B>& w, const T* z, T* out) = 0;
  // dz +=, parameter gradients +=. loss_scale multiplies the auxiliary losses' gradients.
  virtual absl::Status Backward(int i, const Weights<B>& w, Acc* grads, const T* z,
                                const T* dout, T* dz, double loss_scale) = 0;
  // True when each tensor-parallel rank's output is a partial sum (its slice of the
  // intermediate dimension) that the caller all-reduces, and so is its input gradient.
  virtual bool tp_partial() const { return false; }
  // While on, Forward is a recomputation (Sharding::recompute): it adds nothing to the stats.
  virtual void SetRecomputing(bool on) { (void)on; }
  virtual void AppendStats(nlohmann::json* stats) const { (void)stats; }
  virtual void ResetStats() {}
};

template <typename T>
using Ffn = FfnT<Cpu<T>>;

}  // namespace satdar::model

#endif  // SATDAR_MODEL_FFN_H_
