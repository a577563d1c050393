// model/branches.h: the 2L sublayer branches f_l of a decoder (MODELS.md section 2 and 4):
// sublayer l = 2n-1 is block n's attention, l = 2n its FFN, each with its own pre-norm:
//   f_l(u) = Attention(RMSNorm(u; input_layernorm))        (with the value residual, if any)
//   f_l(u) = FFN(RMSNorm(u; post_attention_layernorm))     (dense SwiGLU or MoE)
// Residual topologies (topology.h) decide what u is and where y = f_l(u) goes; the branches
// are the same for all of them. Forward must visit l = 1..2L in order and Backward in
// reverse, because layer 1's values V1 feed every later attention layer.
//
// Templated on the backend B (model/backend.h), as topology.h: every pass returns the first
// failure of an op; collectives report theirs in Sharding::errors.
#ifndef SATDAR_MODEL_BRANCHES_H_
#define SATDAR_MODEL_BRANCHES_H_

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/ffn.h"
#include "model/layers/attention.h"
#include "model/param_layout.h"
#include "model/param_table.h"
#include "model/sharding.h"
#include "model/value_residual.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

// Block i's branch parameters (param_layout.h): input_layernorm, q/k/v stacked, o, the q/k
// norms, the value residual's, post_attention_layernorm, the FFN's.
void AddBranchParams(const ModelConfig& config, const Sharding& shard, int i,
                     const DesignParams& design, ParamTable* table);

template <class B>
class BranchesT {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // value_residual may be null ("none").
  BranchesT(const ModelConfig& config, const Sharding& shard, const typename B::Exec& x,
            std::unique_ptr<ValueResidualT<B>> value_residual, std::unique_ptr<FfnT<B>> ffn);

  void Bind(const ParamTable& table);
  // inference: for decode steps alone (no attention probabilities kept for a backward).
  absl::Status Resize(int b, int t, bool inference = false);
  // The weights and the gradient buffer of the current pass.
  void SetWeights(const Weights<B>& w, Acc* grads);

  int sublayers() const { return 2 * config_.num_hidden_layers; }
  // y (B*T, C) = f_l(u), l in 1..2L.
  absl::Status Forward(int l, const T* u, T* y);
  // du += d/du of <dy, f_l(u)>; u is the input given to Forward.
  absl::Status Backward(int l, const T* u, const T* dy, T* du);

  // Attention of block i from three already-normed inputs (MUDDFormer); y = attention (summed
  // over the TP group). Backward adds the inputs' gradients into dxq, dxk, dxv (which may be
  // one buffer); under TP each distinct buffer is summed over the group, so it must hold
  // zeros on entry.
  absl::Status AttentionNormedForward(int i, const T* xq, const T* xk, const T* xv, T* y);
  absl::Status AttentionNormedBackward(int i, const T* xq, const T* xk, const T* xv,
                                       const T* dy, T* dxq, T* dxk, T* dxv);
  int64_t input_layernorm_offset(int i) const { return layers_[i].ln_attn; }

  // See Model::SetLayerGradientsReadyHook. Every topology visits the sublayers in reverse and
  // finishes all of layer k+1's parameters (branches and its own) before it enters the MLP
  // branch of layer k, so that is where the hook fires.
  void SetLayerGradientsReadyHook(std::function<void(int layer)> hook) { hook_ = std::move(hook); }

  // Start of a backward pass: clears dV1 and records the loss scale for auxiliary losses.
  absl::Status BeginBackward(double loss_scale);

  // Pipeline stages without layer 0 are given V1 (B*T, NKV*HS of this TP rank) before
  // Forward; it is read in place until Backward returns. After Backward, dv1() holds the
  // gradient of V1 from this stage's layers plus what was put there after BeginBackward (the
  // later stages' sum). On the whole model SetV1 overrides layer 0's own V1 until
  // SetV1(nullptr) (Model::ForwardFromState).
  bool has_value_residual() const { return value_residual_ != nullptr; }
  void SetV1(const T* v1) { v1_in_ = v1; }
  const T* v1() const;
  Vec<T>* dv1() { return &dv1_; }
  // Sum of the FFNs' auxiliary losses in the last forward.
  double aux_loss() const;

  // Incremental decoding (Model::BeginDecode). The cache holds, per layer and position, the
  // rotated K and the values attention reads (V' after a value residual's mixing): all a later
  // position reads of an earlier one. Everything else of a position (SATFormer's V1 and
  // gates, DAR/AttnRes depth histories, hyper-connection streams, MoE routing) is computed
  // and read within that position's row, never across positions, so a step runs the
  // unchanged forward on the new rows alone.
  // BeginDecode: caches for b sequences of up to `capacity` positions (any earlier dropped);
  // FailedPrecondition on a tensor, expert or pipeline-parallel shard.
  absl::Status BeginDecode(int b, int capacity);
  // Drops the caches (a later step is FailedPrecondition until the next BeginDecode).
  void EndDecode();
  // Between StartDecodeStep(tn) and FinishDecodeStep, Forward (sized by Resize(b, tn)) takes
  // the tn positions after decode_position() of every sequence, attending to the cache.
  // FailedPrecondition without BeginDecode, OutOfRange past the capacity.
  absl::Status StartDecodeStep(int tn);
  // advance: the step succeeded, its positions join the cache.
  void FinishDecodeStep(bool advance);
  int decode_batch() const { return decode_b_; }  // 0: not decoding
  int decode_capacity() const { return cap_; }
  int decode_position() const { return past_; }  // positions cached per sequence

  ValueResidualT<B>* value_residual() { return value_residual_.get(); }
  void AppendStats(nlohmann::json* stats) const;
  void ResetStats();

 private:
  // What a layer's branches save for their backward. With Recompute::kFull one set exists,
  // moved into the layer that runs (Enter) and out again (Leave); with kSelective the
  // attention probabilities alone move that way.
  struct Acts {
    Vec<T> x_attn;             // normed attention input (B*T, C)
    Vec<Acc> rstd_attn;        // (B*T) (fp32 on a device)
    AttentionActs<B> attn;
    Vec<T> vmix;               // V' when a value residual mixes this layer
    Vec<T> z_mlp;              // normed FFN input
    Vec<Acc> rstd_mlp;
  };
  // Decoding: (B, capacity, NKV*HS) each; outside Acts, which Resize resets.
  struct KvCache {
    Vec<T> k, v;
  };
  struct Layer {
    int64_t ln_attn, wq, wk, wv, wo, q_norm, k_norm, ln_mlp;
    Acts acts;
    KvCache cache;
    double aux = 0;
  };
  // Enter(i) for its lifetime, Leave(i) when it ends (also on an early error return).
  class Entered {
   public:
    Entered(BranchesT* b, int i) : b_(b), i_(i) { b_->Enter(i_); }
    ~Entered() { b_->Leave(i_); }
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;

   private:
    BranchesT* b_;
    int i_;
  };
  template <typename U>
  AttentionWeights<U> AttnWeights(U* base, const Layer& layer) const;
  const T* ValuesRead(int i) const;
  void Enter(int i);
  void Leave(int i);
  // The attention of block i without Enter/Leave; reduce: all-reduce y over TP (not when
  // recomputing, which needs only the saved tensors).
  absl::Status AttentionForwardIn(int i, const T* xq, const T* xk, const T* xv, T* y,
                                  bool reduce);
  absl::Status AttentionBackwardIn(int i, const T* xq, const T* xk, const T* xv, const T* dy,
                                   T* dxq, T* dxk, T* dxv);
  // Re-runs sublayer l's forward from u into the entered buffers (kFull), or block i's
  // attention core (kSelective), adding nothing to the statistics.
  absl::Status Recompute(int l, const T* u);
  // Sequence parallelism: every row of the distinct inputs (themselves without SP).
  std::array<const T*, 3> GatherInputs(const T* xq, const T* xk, const T* xv);
  // The FFN of block i from this rank's normed rows z to its output rows y (null: a
  // recomputation, output discarded), with the TP reductions; and its backward (dz +=).
  absl::StatusOr<double> FfnForward(int i, const T* z, T* y);
  absl::Status FfnBackward(int i, const T* z, const T* dy, T* dz);
  absl::Status RecomputeAttention(int i, const T* xq, const T* xk, const T* xv);

  bool Owned(int i) const { return shard_.OwnsLayer(config_, i); }

  ModelConfig config_;
  Sharding shard_;
  const typename B::Exec x_;
  std::unique_ptr<ValueResidualT<B>> value_residual_;
  std::unique_ptr<FfnT<B>> ffn_;
  std::vector<Layer> layers_;
  AttentionDims dims_;
  Vec<Acc> cos_, sin_;  // the RoPE tables (fp32 on a device), uploaded from the host's
  AttentionScratch<B> scratch_;
  Vec<T> dx_, dv_raw_, dv1_;
  bool sp_ = false;        // sequence parallelism (Sharding::sequence_parallel, tp > 1)
  int rows_ = 0;           // token rows of the branches' inputs and outputs on this rank
  size_t local_nc_ = 0;    // rows_ x C
  // SP: gathered inputs, a branch's full output, dy and the inputs' gradients of every row,
  // and one reduce-scattered slice.
  Vec<T> gq_, gk_, gv_, out_full_, dy_full_, dq_full_, dk_full_, dv_full_, scatter_;
  Acts shared_;              // the one set of activations under kFull (probs under kSelective)
  Vec<T> v1_keep_;           // kFull: layer 0's V, read by every later layer
  Vec<T> y_scratch_;         // a recomputed forward's output (discarded)
  const T* v1_in_ = nullptr;  // V1 from an earlier pipeline stage
  Weights<B> w_;             // the weights of the current pass (SetWeights)
  Acc* grads_ = nullptr;
  double loss_scale_ = 1.0;
  std::function<void(int layer)> hook_;
  // Decoding (BeginDecode): the batch, each sequence's room and cached positions, the RoPE
  // tables of every position of the capacity, and whether a step is under way.
  int decode_b_ = 0, cap_ = 0, past_ = 0;
  Vec<Acc> dcos_, dsin_;
  bool stepping_ = false;
};

template <typename T>
using Branches = BranchesT<Cpu<T>>;

}  // namespace satdar::model

#endif  // SATDAR_MODEL_BRANCHES_H_
