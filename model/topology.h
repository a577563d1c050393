// model/topology.h: a residual topology (MODELS.md section 4) decides what each sublayer
// branch reads and where its output goes, from the embedding h0 to the hidden state that the
// final RMSNorm and head read. Implementations: variants/standard (the baseline residual),
// variants/attnres, variants/dar, variants/hyper_connections (hc), variants/mhc,
// variants/denseformer, variants/muddformer.
#ifndef SATDAR_MODEL_TOPOLOGY_H_
#define SATDAR_MODEL_TOPOLOGY_H_

#include "model/branches.h"
#include "model/param_table.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

template <typename T>
class Topology {
 public:
  virtual ~Topology() = default;
  // Block i's parameters (added after the block's branch parameters), and the final readout's.
  virtual void AddLayerParams(int i, ParamTable* table) { (void)i, (void)table; }
  virtual void AddFinalParams(ParamTable* table) { (void)table; }
  virtual void Bind(const ParamTable& table) { (void)table; }
  virtual void Resize(int rows) = 0;
  // h0 (B*T, C) -> x_final (B*T, C); calls branches->Forward for l = 1..2L in order.
  virtual void Forward(const T* params, const T* h0, Branches<T>* branches, T* x_final) = 0;
  // dx_final -> dh0 (overwritten); calls branches->Backward for l = 2L..1.
  virtual void Backward(const T* params, T* grads, const T* dx_final, Branches<T>* branches,
                        T* dh0) = 0;
  virtual void AppendStats(nlohmann::json* stats) const { (void)stats; }
  virtual void ResetStats() {}
};

}  // namespace satdar::model

#endif  // SATDAR_MODEL_TOPOLOGY_H_
