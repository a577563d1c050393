#include "model/branches.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/ops/rope.h"
#include "model/ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {
std::string LayerName(int i, const char* suffix) {
  return absl::StrCat("model.layers.", i, ".", suffix);
}
}  // namespace

template <class B>
BranchesT<B>::BranchesT(const ModelConfig& config, const Sharding& shard,
                        const typename B::Exec& x,
                        std::unique_ptr<ValueResidualT<B>> value_residual,
                        std::unique_ptr<FfnT<B>> ffn)
    : config_(config), shard_(shard), x_(x), value_residual_(std::move(value_residual)),
      ffn_(std::move(ffn)), layers_(config.num_hidden_layers) {}

void AddBranchParams(const ModelConfig& c, const Sharding& shard, int i,
                     const DesignParams& design, ParamTable* table) {
  const int64_t d = c.hidden_size, hs = c.head_size();
  const int64_t qd = c.num_attention_heads * hs, kd = c.num_key_value_heads * hs;
  const ParamInit normal = ParamInit::Normal(c.initializer_range);
  const ParamInit ones = ParamInit::Constant(1.0);
  const int r = shard.tp_rank, tp = shard.tp_size;
  // Under sequence parallelism the pre-norms see this rank's token rows only.
  const bool rows_split = shard.sequence_parallel && tp > 1;
  table->Add(LayerName(i, "input_layernorm.weight"), {d}, ones).tp_partial_grad = rows_split;
  // q, k and v back to back: the attention layer runs them as one GEMM. Under tensor
  // parallelism each rank holds its heads' rows (column-parallel) and Wo's matching columns
  // (row-parallel).
  table->AddShard(LayerName(i, "self_attn.q_proj.weight"), {qd, d}, normal, 0, r, tp);
  table->AddShard(LayerName(i, "self_attn.k_proj.weight"), {kd, d}, normal, 0, r, tp);
  table->AddShard(LayerName(i, "self_attn.v_proj.weight"), {kd, d}, normal, 0, r, tp);
  table->AddShard(LayerName(i, "self_attn.o_proj.weight"), {d, qd}, normal, 1, r, tp);
  if (c.qk_norm) {
    // Shared by all heads: each rank's gradient covers its heads only.
    table->Add(LayerName(i, "self_attn.q_norm.weight"), {hs}, ones).tp_partial_grad = tp > 1;
    table->Add(LayerName(i, "self_attn.k_norm.weight"), {hs}, ones).tp_partial_grad = tp > 1;
  }
  if (design.value_residual != nullptr) {
    design.value_residual(c, shard, ParamPlace::kLayer, i, table);
  }
  table->Add(LayerName(i, "post_attention_layernorm.weight"), {d}, ones).tp_partial_grad =
      rows_split;
  if (design.ffn != nullptr) design.ffn(c, shard, ParamPlace::kLayer, i, table);
}

template <class B>
void BranchesT<B>::Bind(const ParamTable& table) {
  for (int i = 0; i < config_.num_hidden_layers; ++i) {
    if (!Owned(i)) continue;
    Layer& l = layers_[i];
    l.ln_attn = table.Offset(LayerName(i, "input_layernorm.weight"));
    l.wq = table.Offset(LayerName(i, "self_attn.q_proj.weight"));
    l.wk = table.Offset(LayerName(i, "self_attn.k_proj.weight"));
    l.wv = table.Offset(LayerName(i, "self_attn.v_proj.weight"));
    l.wo = table.Offset(LayerName(i, "self_attn.o_proj.weight"));
    l.q_norm = config_.qk_norm ? table.Offset(LayerName(i, "self_attn.q_norm.weight")) : -1;
    l.k_norm = config_.qk_norm ? table.Offset(LayerName(i, "self_attn.k_norm.weight")) : -1;
    l.ln_mlp = table.Offset(LayerName(i, "post_attention_layernorm.weight"));
  }
  if (value_residual_) value_residual_->Bind(table);
  ffn_->Bind(table);
}

template <class B>
absl::Status BranchesT<B>::Resize(int b, int t, bool inference) {
  const ModelConfig& c = config_;
  // This tensor-parallel rank's heads.
  dims_ = AttentionDims{b,
                        t,
                        c.hidden_size,
                        shard_.TpCount(c.num_attention_heads),
                        shard_.TpCount(c.num_key_value_heads),
                        c.head_size(),
                        c.qk_norm,
                        c.rms_norm_eps};
  // Computed on the host, then uploaded (copied on the CPU).
  {
    std::vector<Acc> cos, sin;
    core::cpu::RopeTables(&cos, &sin, t, c.head_size(), c.rope_theta);
    cos_.resize(cos.size());
    sin_.resize(sin.size());
    SATDAR_RETURN_IF_ERROR(
        ops::Upload(x_, cos_.data(), cos.data(), static_cast<int64_t>(cos.size())));
    SATDAR_RETURN_IF_ERROR(
        ops::Upload(x_, sin_.data(), sin.data(), static_cast<int64_t>(sin.size())));
  }
  const size_t n = static_cast<size_t>(b) * t, nc = n * c.hidden_size;
  const size_t nkv = n * dims_.nkv * c.head_size();
  // Sequence parallelism: the branches' inputs and outputs are this rank's rows; attention
  // and the FFN run on every row, gathered.
  sp_ = shard_.sequence_parallel && shard_.tp_size > 1;
  rows_ = shard_.StreamRows(static_cast<int>(n));
  local_nc_ = static_cast<size_t>(rows_) * c.hidden_size;
  const size_t ln = rows_, lnc = local_nc_;
  const bool full = shard_.recompute == Recompute::kFull;
  const bool selective = shard_.recompute == Recompute::kSelective;
  auto allocate = [&](Acts* a, bool vmix) {
    a->x_attn.resize(lnc);
    a->rstd_attn.resize(ln);
    a->attn.Resize(dims_, /*for_backward=*/!inference);  // the cached attention keeps none
    if (vmix) a->vmix.resize(nkv);
    a->z_mlp.resize(lnc);
    a->rstd_mlp.resize(ln);
  };
  shared_ = Acts();
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!Owned(static_cast<int>(i))) continue;
    Layer& l = layers_[i];
    l.acts = Acts();
    if (full) continue;  // the one shared set below
    allocate(&l.acts, value_residual_ && i >= 1);
    if (selective && !inference) {  // one (B, NH, T, T) buffer for every layer
      shared_.attn.probs.resize(l.acts.attn.probs.size());
      l.acts.attn.probs = Vec<T>();
    }
  }
  if (full) allocate(&shared_, value_residual_ != nullptr);
  v1_keep_.resize(full && value_residual_ ? nkv : 0);
  y_scratch_.resize(full || selective ? nc : 0);
  for (Vec<T>* v : {&gq_, &gk_, &gv_, &out_full_, &dy_full_, &dq_full_, &dk_full_, &dv_full_}) {
    v->resize(0);  // zeros, as assign(n, 0)
    v->resize(sp_ ? nc : 0);
  }
  scatter_.resize(sp_ ? lnc : 0);
  scratch_.Resize(dims_);
  dx_.resize(lnc);
  dv_raw_.resize(nkv);
  if (value_residual_) {
    dv1_.resize(nkv);
    SATDAR_RETURN_IF_ERROR(value_residual_->Resize(static_cast<int>(n)));
  }
  SATDAR_RETURN_IF_ERROR(ffn_->Resize(b, t));
  return absl::OkStatus();
}

template <class B>
absl::Status BranchesT<B>::BeginDecode(int b, int capacity) {
  if (shard_.tp_size > 1 || shard_.ep_size > 1 || shard_.pp_size > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "decoding needs the whole model in one process; this is a shard (tp ", shard_.tp_size,
        ", ep ", shard_.ep_size, ", pp ", shard_.pp_size, ")"));
  }
  if (b < 1 || capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("decoding ", b, " sequences of ", capacity,
                                                   " positions: both must be positive"));
  }
  EndDecode();
  const size_t size = static_cast<size_t>(b) * capacity * config_.num_key_value_heads *
                      config_.head_size();
  for (Layer& l : layers_) {
    l.cache.k.resize(size);
    l.cache.v.resize(size);
  }
  std::vector<Acc> cos, sin;
  core::cpu::RopeTables(&cos, &sin, capacity, config_.head_size(), config_.rope_theta);
  dcos_.resize(cos.size());
  dsin_.resize(sin.size());
  SATDAR_RETURN_IF_ERROR(
      ops::Upload(x_, dcos_.data(), cos.data(), static_cast<int64_t>(cos.size())));
  SATDAR_RETURN_IF_ERROR(
      ops::Upload(x_, dsin_.data(), sin.data(), static_cast<int64_t>(sin.size())));
  decode_b_ = b;
  cap_ = capacity;
  return absl::OkStatus();
}

template <class B>
void BranchesT<B>::EndDecode() {
  decode_b_ = cap_ = past_ = 0;
  stepping_ = false;
  for (Layer& l : layers_) l.cache = KvCache();
  dcos_ = Vec<Acc>();
  dsin_ = Vec<Acc>();
}

template <class B>
absl::Status BranchesT<B>::StartDecodeStep(int tn) {
  if (decode_b_ == 0) {
    return absl::FailedPreconditionError("a decode step before BeginDecode");
  }
  if (tn < 1 || past_ + tn > cap_) {
    return absl::OutOfRangeError(absl::StrCat("decoding positions ", past_, "..", past_ + tn - 1,
                                              " of sequences with room for ", cap_));
  }
  SATDAR_CHECK(dims_.b == decode_b_ && dims_.t == tn) << "Resize(b, tn) before a decode step";
  stepping_ = true;
  return absl::OkStatus();
}

template <class B>
void BranchesT<B>::FinishDecodeStep(bool advance) {
  if (stepping_ && advance) past_ += dims_.t;
  stepping_ = false;
}

template <class B>
void BranchesT<B>::SetWeights(const Weights<B>& w, Acc* grads) {
  w_ = w;
  grads_ = grads;
}

template <class B>
template <typename U>
AttentionWeights<U> BranchesT<B>::AttnWeights(U* base, const Layer& l) const {
  AttentionWeights<U> w{base + l.wq, base + l.wk, base + l.wv, base + l.wo, nullptr, nullptr};
  if (config_.qk_norm) {
    w.q_norm = base + l.q_norm;
    w.k_norm = base + l.k_norm;
  }
  return w;
}

template <class B>
const typename B::T* BranchesT<B>::ValuesRead(int i) const {
  const Acts& a = layers_[i].acts;
  return (value_residual_ && i >= 1) ? a.vmix.data() : a.attn.v.data();
}

// Moves the shared activations into layer i (Leave moves them back: the same swap).
template <class B>
void BranchesT<B>::Enter(int i) {
  if (shard_.recompute == Recompute::kFull) {
    std::swap(layers_[i].acts, shared_);
  } else if (shard_.recompute == Recompute::kSelective) {
    std::swap(layers_[i].acts.attn.probs, shared_.attn.probs);
  }
}

template <class B>
void BranchesT<B>::Leave(int i) {
  Enter(i);
}

template <class B>
absl::Status BranchesT<B>::RecomputeAttention(int i, const T* xq, const T* xk, const T* xv) {
  if (shard_.recompute == Recompute::kFull) {
    if (value_residual_) value_residual_->SetRecomputing(true);
    const absl::Status status =
        AttentionForwardIn(i, xq, xk, xv, y_scratch_.data(), /*reduce=*/false);
    if (value_residual_) value_residual_->SetRecomputing(false);
    SATDAR_RETURN_IF_ERROR(status);
  } else if (shard_.recompute == Recompute::kSelective) {
    // Q and K are saved: the probabilities again (and the output, discarded).
    AttentionWeights<T> w = AttnWeights(const_cast<T*>(w_.compute), layers_[i]);
    SATDAR_RETURN_IF_ERROR(AttentionCoreForward(x_, y_scratch_.data(), &layers_[i].acts.attn,
                                                ValuesRead(i), w, dims_, cos_.data(),
                                                sin_.data()));
  }
  return absl::OkStatus();
}

template <class B>
absl::Status BranchesT<B>::Recompute(int l, const T* u) {
  const int i = (l - 1) / 2;
  Acts& a = layers_[i].acts;
  const int n = rows_, d = config_.hidden_size;
  if (l % 2 == 1) {
    if (shard_.recompute == Recompute::kFull) {
      SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, a.x_attn.data(), a.rstd_attn.data(), u,
                                                 w_.compute + layers_[i].ln_attn, n, d,
                                                 config_.rms_norm_eps));
    }
    SATDAR_RETURN_IF_ERROR(
        RecomputeAttention(i, a.x_attn.data(), a.x_attn.data(), a.x_attn.data()));
  } else if (shard_.recompute == Recompute::kFull) {
    SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, a.z_mlp.data(), a.rstd_mlp.data(), u,
                                               w_.compute + layers_[i].ln_mlp, n, d,
                                               config_.rms_norm_eps));
    ffn_->SetRecomputing(true);
    const absl::StatusOr<double> aux = FfnForward(i, a.z_mlp.data(), nullptr);
    ffn_->SetRecomputing(false);
    SATDAR_RETURN_IF_ERROR(aux.status());
  }
  return absl::OkStatus();
}

template <class B>
absl::Status BranchesT<B>::Forward(int l, const T* u, T* y) {
  const int i = (l - 1) / 2;
  Layer& L = layers_[i];
  const int n = rows_, d = config_.hidden_size;
  Entered entered(this, i);
  Acts& a = L.acts;
  if (l % 2 == 1) {
    SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, a.x_attn.data(), a.rstd_attn.data(), u,
                                               w_.compute + L.ln_attn, n, d,
                                               config_.rms_norm_eps));
    const T* x = a.x_attn.data();
    SATDAR_RETURN_IF_ERROR(AttentionForwardIn(i, x, x, x, y, /*reduce=*/true));
  } else {
    SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, a.z_mlp.data(), a.rstd_mlp.data(), u,
                                               w_.compute + L.ln_mlp, n, d,
                                               config_.rms_norm_eps));
    SATDAR_ASSIGN_OR_RETURN(L.aux, FfnForward(i, a.z_mlp.data(), y));
  }
  return absl::OkStatus();
}

template <class B>
absl::Status BranchesT<B>::Backward(int l, const T* u, const T* dy, T* du) {
  const int i = (l - 1) / 2;
  if (l % 2 == 0 && hook_ && i + 1 < config_.num_hidden_layers && Owned(i + 1)) hook_(i + 1);
  Layer& L = layers_[i];
  const int n = rows_, d = config_.hidden_size;
  SATDAR_RETURN_IF_ERROR(ops::Zero(x_, dx_.data(), static_cast<int64_t>(dx_.size())));
  Entered entered(this, i);
  SATDAR_RETURN_IF_ERROR(Recompute(l, u));
  const Acts& a = L.acts;
  if (l % 2 == 1) {
    const T* x = a.x_attn.data();
    SATDAR_RETURN_IF_ERROR(AttentionBackwardIn(i, x, x, x, dy, dx_.data(), dx_.data(), dx_.data()));
    SATDAR_RETURN_IF_ERROR(ops::RmsNormBackward(x_, du, grads_ + L.ln_attn, dx_.data(), u,
                                                w_.compute + L.ln_attn, a.rstd_attn.data(), n,
                                                d));
  } else {
    SATDAR_RETURN_IF_ERROR(FfnBackward(i, a.z_mlp.data(), dy, dx_.data()));
    SATDAR_RETURN_IF_ERROR(ops::RmsNormBackward(x_, du, grads_ + L.ln_mlp, dx_.data(), u,
                                                w_.compute + L.ln_mlp, a.rstd_mlp.data(), n,
                                                d));
  }
  return absl::OkStatus();
}

template <class B>
absl::Status BranchesT<B>::AttentionNormedForward(int i, const T* xq, const T* xk, const T* xv,
                                                  T* y) {
  Entered entered(this, i);
  return AttentionForwardIn(i, xq, xk, xv, y, /*reduce=*/true);
}

template <class B>
absl::Status BranchesT<B>::AttentionNormedBackward(int i, const T* xq, const T* xk, const T* xv,
                                                   const T* dy, T* dxq, T* dxk, T* dxv) {
  Entered entered(this, i);
  SATDAR_RETURN_IF_ERROR(RecomputeAttention(i, xq, xk, xv));
  return AttentionBackwardIn(i, xq, xk, xv, dy, dxq, dxk, dxv);
}

template <class B>
absl::Status BranchesT<B>::AttentionForwardIn(int i, const T* xq, const T* xk, const T* xv,
                                              T* y, bool reduce) {
  Layer& L = layers_[i];
  AttentionActs<B>& attn = L.acts.attn;
  AttentionWeights<T> w = AttnWeights(const_cast<T*>(w_.compute), L);
  const std::array<const T*, 3> x = GatherInputs(xq, xk, xv);
  SATDAR_RETURN_IF_ERROR(
      AttentionProjectForward(x_, &attn, x[0], x[1], x[2], w, dims_, &scratch_));
  if (i == 0 && !v1_keep_.empty()) {
    SATDAR_RETURN_IF_ERROR(
        ops::Copy(x_, v1_keep_.data(), attn.v.data(), static_cast<int64_t>(attn.v.size())));
  }
  if (value_residual_ && i >= 1) {
    // The gate (SATFormer) reads the normed input of the values.
    SATDAR_RETURN_IF_ERROR(
        value_residual_->Forward(i, w_, x[2], attn.v.data(), v1(), L.acts.vmix.data()));
  }
  T* out = sp_ ? out_full_.data() : y;
  if (stepping_) {  // the new positions over the cache (no sharding: nothing to reduce)
    const size_t from = static_cast<size_t>(past_) * (config_.head_size() / 2);
    return AttentionDecodeForward(x_, out, &attn, ValuesRead(i), w, dims_, dcos_.data() + from,
                                  dsin_.data() + from, L.cache.k.data(), L.cache.v.data(), past_,
                                  cap_);
  }
  SATDAR_RETURN_IF_ERROR(
      AttentionCoreForward(x_, out, &attn, ValuesRead(i), w, dims_, cos_.data(), sin_.data()));
  // Row-parallel Wo: partial sums, added over TP (into this rank's rows under SP).
  if (!reduce) return absl::OkStatus();
  if (sp_) {
    TpReduceScatter(shard_, out, y, local_nc_);
  } else {
    TpAllReduce(shard_, y, static_cast<size_t>(dims_.rows()) * config_.hidden_size);
  }
  return absl::OkStatus();
}

template <class B>
std::array<const typename B::T*, 3> BranchesT<B>::GatherInputs(const T* xq, const T* xk,
                                                               const T* xv) {
  if (!sp_) return {xq, xk, xv};
  TpAllGather(shard_, xq, gq_.data(), local_nc_);
  const T* fq = gq_.data();
  const T* fk = fq;
  if (xk != xq) {
    TpAllGather(shard_, xk, gk_.data(), local_nc_);
    fk = gk_.data();
  }
  const T* fv = xv == xq ? fq : xv == xk ? fk : nullptr;
  if (fv == nullptr) {
    TpAllGather(shard_, xv, gv_.data(), local_nc_);
    fv = gv_.data();
  }
  return {fq, fk, fv};
}

template <class B>
absl::StatusOr<double> BranchesT<B>::FfnForward(int i, const T* z, T* y) {
  const T* fz = z;
  T* out = y == nullptr ? y_scratch_.data() : y;
  if (sp_) {
    TpAllGather(shard_, z, gq_.data(), local_nc_);
    fz = gq_.data();
    out = out_full_.data();
  }
  SATDAR_ASSIGN_OR_RETURN(const double aux, ffn_->Forward(i, w_, fz, out));
  if (y == nullptr) return aux;  // a recomputation: only the saved tensors matter
  if (!sp_) {
    if (ffn_->tp_partial()) TpAllReduce(shard_, y, local_nc_);
  } else if (ffn_->tp_partial()) {
    TpReduceScatter(shard_, out, y, local_nc_);
  } else {  // every rank computed every row (the MoE): keep this rank's
    SATDAR_RETURN_IF_ERROR(ops::Copy(x_, y, out + shard_.tp_rank * local_nc_,
                                     static_cast<int64_t>(local_nc_)));
  }
  return aux;
}

template <class B>
absl::Status BranchesT<B>::FfnBackward(int i, const T* z, const T* dy, T* dz) {
  if (!sp_) {
    SATDAR_RETURN_IF_ERROR(ffn_->Backward(i, w_, grads_, z, dy, dz, loss_scale_));
    if (ffn_->tp_partial()) TpAllReduce(shard_, dz, local_nc_);
    return absl::OkStatus();
  }
  TpAllGather(shard_, z, gq_.data(), local_nc_);
  TpAllGather(shard_, dy, dy_full_.data(), local_nc_);
  SATDAR_RETURN_IF_ERROR(ops::Zero(x_, dq_full_.data(), static_cast<int64_t>(dq_full_.size())));
  SATDAR_RETURN_IF_ERROR(ffn_->Backward(i, w_, grads_, gq_.data(), dy_full_.data(),
                                        dq_full_.data(), loss_scale_));
  if (ffn_->tp_partial()) {
    TpReduceScatter(shard_, dq_full_.data(), scatter_.data(), local_nc_);
  } else {
    const T* mine = dq_full_.data() + shard_.tp_rank * local_nc_;
    SATDAR_RETURN_IF_ERROR(
        ops::Copy(x_, scatter_.data(), mine, static_cast<int64_t>(local_nc_)));
  }
  SATDAR_RETURN_IF_ERROR(
      ops::AddTo(x_, dz, scatter_.data(), static_cast<int64_t>(local_nc_)));
  return absl::OkStatus();
}

template <class B>
absl::Status BranchesT<B>::AttentionBackwardIn(int i, const T* xq, const T* xk, const T* xv,
                                               const T* dy, T* dxq, T* dxk, T* dxv) {
  Layer& L = layers_[i];
  const AttentionActs<B>& attn = L.acts.attn;
  AttentionWeights<T> w = AttnWeights(const_cast<T*>(w_.compute), L);
  AttentionWeights<Acc> g = AttnWeights(grads_, L);
  // Under SP: every row of the inputs and of dy again, and the inputs' gradients of every row
  // into full buffers, reduce-scattered into this rank's rows below.
  const std::array<const T*, 3> x = GatherInputs(xq, xk, xv);
  const T* fdy = dy;
  T *gq = dxq, *gk = dxk, *gv = dxv;
  if (sp_) {
    TpAllGather(shard_, dy, dy_full_.data(), local_nc_);
    fdy = dy_full_.data();
    for (Vec<T>* v : {&dq_full_, &dk_full_, &dv_full_}) {
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, v->data(), static_cast<int64_t>(v->size())));
    }
    gq = dq_full_.data();
    gk = dxk == dxq ? gq : dk_full_.data();
    gv = dxv == dxq ? gq : dxv == dxk ? gk : dv_full_.data();
  }
  SATDAR_RETURN_IF_ERROR(AttentionCoreBackward(x_, g, fdy, attn, ValuesRead(i), w, dims_,
                                               cos_.data(), sin_.data(), &scratch_));
  const T* dv = scratch_.dv.data();  // d loss / d (values attention read)
  if (value_residual_ && i >= 1) {
    SATDAR_RETURN_IF_ERROR(value_residual_->Backward(i, w_, grads_, x[2], attn.v.data(), v1(),
                                                     scratch_.dv.data(), gv, dv_raw_.data(),
                                                     dv1_.data()));
    dv = dv_raw_.data();
  } else if (value_residual_ && i == 0) {
    // Layer 1's V is also V1: add the gradient every later layer sent it.
    SATDAR_RETURN_IF_ERROR(ops::Add(x_, dv_raw_.data(), scratch_.dv.data(), dv1_.data(),
                                    static_cast<int64_t>(dv_raw_.size())));
    dv = dv_raw_.data();
    SATDAR_RETURN_IF_ERROR(value_residual_->FinishBackward(w_, grads_));
  }
  SATDAR_RETURN_IF_ERROR(AttentionProjectBackward(x_, gq, gk, gv, g, dv, x[0], x[1], x[2], w,
                                                  dims_, &scratch_));
  // Column-parallel q/k/v (and the gate rows): each rank's input gradients are partial sums,
  // added over the TP group once per distinct buffer (under SP into this rank's rows).
  auto reduce = [&](T* full, T* local) -> absl::Status {
    if (!sp_) {
      TpAllReduce(shard_, local, local_nc_);
      return absl::OkStatus();
    }
    TpReduceScatter(shard_, full, scatter_.data(), local_nc_);
    return ops::AddTo(x_, local, scatter_.data(), static_cast<int64_t>(local_nc_));
  };
  SATDAR_RETURN_IF_ERROR(reduce(gq, dxq));
  if (dxk != dxq) SATDAR_RETURN_IF_ERROR(reduce(gk, dxk));
  if (dxv != dxq && dxv != dxk) SATDAR_RETURN_IF_ERROR(reduce(gv, dxv));
  return absl::OkStatus();
}

template <class B>
const typename B::T* BranchesT<B>::v1() const {
  if (!Owned(0) || v1_in_ != nullptr) return v1_in_;  // a stage's, or an analysis' (SetV1)
  return v1_keep_.empty() ? layers_[0].acts.attn.v.data() : v1_keep_.data();
}

template <class B>
absl::Status BranchesT<B>::BeginBackward(double loss_scale) {
  loss_scale_ = loss_scale;
  return ops::Zero(x_, dv1_.data(), static_cast<int64_t>(dv1_.size()));
}

template <class B>
double BranchesT<B>::aux_loss() const {
  double sum = 0;
  for (int i = 0; i < config_.num_hidden_layers; ++i) {
    if (Owned(i)) sum += layers_[i].aux;
  }
  return sum;
}

template <class B>
void BranchesT<B>::AppendStats(nlohmann::json* stats) const {
  if (value_residual_) value_residual_->AppendStats(stats);
  ffn_->AppendStats(stats);
}

template <class B>
void BranchesT<B>::ResetStats() {
  if (value_residual_) value_residual_->ResetStats();
  ffn_->ResetStats();
}

template class BranchesT<Cpu<float>>;
template class BranchesT<Cpu<double>>;
#if defined(SATDAR_WITH_CUDA)
template class BranchesT<Cuda<float>>;
template class BranchesT<Cuda<__nv_bfloat16>>;
#endif

}  // namespace satdar::model
