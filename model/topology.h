// model/topology.h: a residual topology (MODELS.md section 4) decides what each sublayer
// branch reads and where its output goes, from the embedding h0 to the hidden state that the
// final RMSNorm and head read. Implementations: variants/standard (the baseline residual),
// variants/attnres, variants/dar, variants/hyper_connections (hc), variants/mhc,
// variants/denseformer, variants/muddformer.
#ifndef SATDAR_MODEL_TOPOLOGY_H_
#define SATDAR_MODEL_TOPOLOGY_H_

#include <vector>

#include "model/branches.h"
#include "model/param_table.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

template <typename T>
class Topology {
 public:
  virtual ~Topology() = default;
  // Finds its parameters' offsets in this rank's table; the design's AddParamsFn
  // (param_layout.h) added them, after each block's branch parameters and at the end.
  virtual void Bind(const ParamTable& table) { (void)table; }
  virtual void Resize(int rows) = 0;
  // h0 (B*T, C) -> x_final (B*T, C); calls branches->Forward for l = 1..2L in order.
  void Forward(const T* params, const T* h0, Branches<T>* branches, T* x_final) {
    ForwardRange(params, 1, branches->sublayers(), h0, {}, branches, x_final, {});
  }
  // dx_final -> dh0 (overwritten); calls branches->Backward for l = 2L..1.
  void Backward(const T* params, T* grads, const T* dx_final, Branches<T>* branches, T* dh0) {
    BackwardRange(params, grads, 1, branches->sublayers(), dx_final, {}, branches, dh0, {});
  }

  // Pipeline parallelism. A topology describes the state after sublayer l (1 <= l < 2L, at a
  // block boundary for the designs whose state is per block) as BoundaryTensors(l) tensors
  // of (B*T, C) each (the running stream, the n streams, or a depth history's completed
  // entries and partial sums), and runs a range of sublayers [first, last] from such a state
  // (h0 when first == 1) to the next one (x_final when last == 2L). The tensors of `in` are
  // read in place and must stay unchanged until BackwardRange returns. Every design of the
  // registry can; one that could not would return false here (layout_check.cc's table).
  virtual bool SupportsStages() const { return true; }
  virtual int BoundaryTensors(int l) const = 0;
  virtual void ForwardRange(const T* params, int first, int last, const T* h0,
                            const std::vector<const T*>& in, Branches<T>* branches, T* x_final,
                            const std::vector<T*>& out) = 0;
  // Backward of ForwardRange: from dx_final (last == 2L) or the output state's gradients
  // dout, to dh0 (first == 1, overwritten) or the input state's gradients din (overwritten).
  virtual void BackwardRange(const T* params, T* grads, int first, int last, const T* dx_final,
                             const std::vector<const T*>& dout, Branches<T>* branches, T* dh0,
                             const std::vector<T*>& din) = 0;

  virtual void AppendStats(nlohmann::json* stats) const { (void)stats; }
  virtual void ResetStats() {}
};

}  // namespace satdar::model

#endif  // SATDAR_MODEL_TOPOLOGY_H_
