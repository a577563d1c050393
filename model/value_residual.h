// model/value_residual.h: how layer n >= 2 mixes its values V_n with layer 1's values V_1
// before attention (MODELS.md section 3). Implementations: variants/satformer (a per-token,
// per-KV-head ReLU gate) and variants/resformer (fixed or learnable scalars). Layer 1 only
// produces V_1; every later layer reads it, and the gradients of V_1 from all of them are
// summed before layer 1's backward runs.
//
// Templated on the backend B (model/backend.h), as topology.h.
#ifndef SATDAR_MODEL_VALUE_RESIDUAL_H_
#define SATDAR_MODEL_VALUE_RESIDUAL_H_

#include <vector>

#include "absl/status/status.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/param_table.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

// SATFormer's analysis intervention: replace every gate by 0, or by its mean.
enum class GateAblation { kNone, kZero, kMean };

template <class B>
class ValueResidualT {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;

  virtual ~ValueResidualT() = default;
  // Finds its parameters' offsets once the table is complete; the design's AddParamsFn
  // (param_layout.h) added its global ones and layer i's right after that layer's attention
  // weights.
  virtual void Bind(const ParamTable& table) = 0;
  virtual absl::Status Resize(int rows) {
    (void)rows;
    return absl::OkStatus();
  }

  // Layer i >= 1: vmix (N, NKV*HS) from v (layer i's V), v1 (layer 0's V) and x (N, C), the
  // normed input the projections read.
  virtual absl::Status Forward(int i, const Weights<B>& w, const T* x, const T* v, const T* v1,
                               T* vmix) = 0;
  // dvmix -> dx +=, dv = (overwritten), dv1 +=, parameter gradients +=.
  virtual absl::Status Backward(int i, const Weights<B>& w, Acc* grads, const T* x, const T* v,
                                const T* v1, const T* dvmix, T* dx, T* dv, T* dv1) = 0;
  // Called once per Backward, after the last layer's (layer 1's) Backward.
  virtual absl::Status FinishBackward(const Weights<B>& w, Acc* grads) {
    (void)w, (void)grads;
    return absl::OkStatus();
  }

  // While on, Forward is a recomputation (Sharding::recompute): it adds nothing to the stats.
  virtual void SetRecomputing(bool on) { (void)on; }
  // Statistics gathered since the last ResetStats (for --log-jsonl).
  virtual void AppendStats(nlohmann::json* stats) const { (void)stats; }
  virtual void ResetStats() {}
  // Model::SetStatsEnabled.
  virtual void SetStatsEnabled(bool on) { (void)on; }
  // Layer i's gates of the last Forward (B*T, NKV, a B buffer of Acc: fp32 on CUDA), or null
  // when this design has none.
  virtual const Acc* gate_values(int i) const { (void)i; return nullptr; }
  // Only SATFormer has gates; others report false and ignore the call.
  virtual bool SetGateAblation(GateAblation mode) { return mode == GateAblation::kNone; }
};

template <typename T>
using ValueResidual = ValueResidualT<Cpu<T>>;

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VALUE_RESIDUAL_H_
