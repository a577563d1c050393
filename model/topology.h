// model/topology.h: a residual topology (MODELS.md section 4) decides what each sublayer
// branch reads and where its output goes, from the embedding h0 to the hidden state that the
// final RMSNorm and head read. Implementations: variants/standard (the baseline residual),
// variants/attnres, variants/transparent, variants/dar, variants/hyper_connections (hc),
// variants/mhc, variants/denseformer, variants/muddformer.
//
// Templated on the backend B (model/backend.h): every pointer below is a B buffer (host
// memory on the CPU, device memory on CUDA); parameters are read from Weights<B>, gradients
// accumulated into B::Acc. Each pass returns the first failure of an op (a launch on CUDA;
// always OK on the CPU); collectives report theirs in Sharding::errors.
#ifndef SATDAR_MODEL_TOPOLOGY_H_
#define SATDAR_MODEL_TOPOLOGY_H_

#include <vector>

#include "absl/status/status.h"
#include "model/backend.h"
#include "model/branches.h"
#include "model/param_table.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

template <class B>
class TopologyT {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;

  virtual ~TopologyT() = default;
  // Finds its parameters' offsets in this rank's table; the design's AddParamsFn
  // (param_layout.h) added them, after each block's branch parameters and at the end.
  virtual void Bind(const ParamTable& table) { (void)table; }
  // Sizes its buffers for `rows` token rows (an allocation failure on a device).
  virtual absl::Status Resize(int rows) = 0;
  // h0 (B*T, C) -> x_final (B*T, C); calls branches->Forward for l = 1..2L in order.
  absl::Status Forward(const Weights<B>& w, const T* h0, BranchesT<B>* branches, T* x_final) {
    return ForwardRange(w, 1, branches->sublayers(), h0, {}, branches, x_final, {});
  }
  // dx_final -> dh0 (overwritten); calls branches->Backward for l = 2L..1.
  absl::Status Backward(const Weights<B>& w, Acc* grads, const T* dx_final,
                        BranchesT<B>* branches, T* dh0) {
    return BackwardRange(w, grads, 1, branches->sublayers(), dx_final, {}, branches, dh0, {});
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
  virtual absl::Status ForwardRange(const Weights<B>& w, int first, int last, const T* h0,
                                    const std::vector<const T*>& in, BranchesT<B>* branches,
                                    T* x_final, const std::vector<T*>& out) = 0;
  // Backward of ForwardRange: from dx_final (last == 2L) or the output state's gradients
  // dout, to dh0 (first == 1, overwritten) or the input state's gradients din (overwritten).
  virtual absl::Status BackwardRange(const Weights<B>& w, Acc* grads, int first, int last,
                                     const T* dx_final, const std::vector<const T*>& dout,
                                     BranchesT<B>* branches, T* dh0,
                                     const std::vector<T*>& din) = 0;

  // Statistics, gathered in B's memory (ops::AccumulateColumns) and read on the host by
  // AppendStats (model/ops.h, ReadStatistics).
  virtual void AppendStats(nlohmann::json* stats) const { (void)stats; }
  virtual void ResetStats() {}
  // Model::SetStatsEnabled.
  virtual void SetStatsEnabled(bool on) { (void)on; }

  // Analyses (Model::ResidualStreams, DepthStates, ForwardToState). streams(): how many
  // residual streams the state carries. BoundaryStream: the stream tensor i of the state after
  // sublayer l belongs to, or -1 for one every stream reads.
  virtual int streams() const { return 1; }
  virtual int BoundaryStream(int l, int i) const { (void)l, (void)i; return 0; }
  // After a whole Forward: one stream's state at one depth, row r at data + r * row_stride
  // (HC's streams are interleaved); `whole` elements from `base` hold all of it.
  struct DepthStateRef {
    int stream, depth, sublayer;
    const T* base;
    int64_t whole, offset, row_stride;
  };
  virtual void DepthStates(std::vector<DepthStateRef>* refs) const { (void)refs; }
};

template <typename T>
using Topology = TopologyT<Cpu<T>>;

}  // namespace satdar::model

#endif  // SATDAR_MODEL_TOPOLOGY_H_
