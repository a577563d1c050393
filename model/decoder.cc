#include "model/decoder.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/layers/linear.h"
#include "model/ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

// The first stage looks tokens up; with tied embeddings the last stage's head is the same
// matrix, so it holds a copy too (the trainer sums the two copies' gradients).
bool HoldsEmbedding(const ModelConfig& c, const Sharding& shard) {
  return shard.first_stage() || (shard.last_stage() && c.tie_word_embeddings);
}

}  // namespace

ParamTable DecoderParams(const ModelConfig& c, const Sharding& shard,
                         const DesignParams& design, int64_t align) {
  ParamTable table(align);
  const ParamInit normal = ParamInit::Normal(c.initializer_range);
  const int r = shard.tp_rank, tp = shard.tp_size;
  // Vocabulary-parallel: each TP rank holds a contiguous range of rows of the padded
  // vocabulary (Sharding::PaddedVocab; the rows past vocab_size are zero).
  const int64_t padded = shard.PaddedVocab(c);
  if (HoldsEmbedding(c, shard)) {
    table.AddPaddedShard("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, normal, 0,
                         r, tp, padded)
        .role = ParamRole::kEmbedding;
  }
  auto add = [&](AddParamsFn fn, ParamPlace place, int layer) {
    if (fn != nullptr) fn(c, shard, place, layer, &table);
  };
  add(design.value_residual, ParamPlace::kGlobal, -1);
  // Under sequence parallelism the topology and the final norm see this rank's token rows:
  // their gradients are partial sums over TP.
  const bool rows_split = shard.sequence_parallel && tp > 1;
  for (int i = shard.first_layer(c); i < shard.end_layer(c); ++i) {
    const size_t block = table.specs().size();
    AddBranchParams(c, shard, i, design, &table);
    const size_t before = table.specs().size();
    add(design.topology, ParamPlace::kLayer, i);
    if (rows_split) table.MarkTpPartial(before);
    table.MarkRole(block, ParamRole::kLayer, i);
  }
  if (shard.last_stage()) {
    const size_t final = table.specs().size();
    table.Add("model.norm.weight", {c.hidden_size}, ParamInit::Constant(1.0)).tp_partial_grad =
        rows_split;
    const size_t before = table.specs().size();
    add(design.topology, ParamPlace::kFinal, -1);
    if (rows_split) table.MarkTpPartial(before);
    table.MarkRole(final, ParamRole::kFinal);
    if (!c.tie_word_embeddings) {
      table.AddPaddedShard("lm_head.weight", {c.vocab_size, c.hidden_size}, normal, 0, r, tp,
                           padded)
          .role = ParamRole::kHead;
    }
  }
  return table;
}

template <class B>
DecoderModelT<B>::DecoderModelT(const ModelConfig& config, const Sharding& shard,
                                const typename B::Exec& x, ParamTable table,
                                std::unique_ptr<BranchesT<B>> branches,
                                std::unique_ptr<TopologyT<B>> topology)
    : config_(config), shard_(shard), first_sublayer_(2 * shard.first_layer(config) + 1),
      last_sublayer_(2 * shard.end_layer(config)),
      has_embedding_(HoldsEmbedding(config, shard)),
      v0_(shard.TpFirst(shard.PaddedVocab(config))), vl_(shard.TpCount(shard.PaddedVocab(config))),
      vtrue_(std::max(0, std::min(vl_, config.vocab_size - v0_))), x_(x),
      branches_(std::move(branches)), topology_(std::move(topology)), table_(std::move(table)) {
  branches_->Bind(table_);
  topology_->Bind(table_);
  embed_off_ = has_embedding_ ? table_.Offset("model.embed_tokens.weight") : -1;
  norm_off_ = shard.last_stage() ? table_.Offset("model.norm.weight") : -1;
  head_off_ = !shard.last_stage()           ? -1
              : config.tie_word_embeddings ? embed_off_
                                           : table_.Offset("lm_head.weight");
}

template <class B>
absl::Status DecoderModelT<B>::Resize(int b, int t, bool inference) {
  if (b == b_ && t == t_ && inference == inference_) return absl::OkStatus();
  typename B::AllocScope scope(x_);
  absl::Status status = ResizeBuffers(b, t, inference);
  if (status.ok()) status = scope.status();
  // Sized for (b, t) only when every buffer is: otherwise the next pass retries.
  b_ = status.ok() ? b : 0;
  t_ = status.ok() ? t : 0;
  inference_ = inference;
  return status;
}

template <class B>
absl::Status DecoderModelT<B>::ResizeBuffers(int b, int t, bool inference) {
  const size_t n = static_cast<size_t>(b) * t, nc = n * config_.hidden_size;
  // Under sequence parallelism the residual stream is this rank's rows (lnc of nc).
  rows_ = shard_.StreamRows(static_cast<int>(n));
  const size_t lnc = static_cast<size_t>(rows_) * config_.hidden_size;
  const bool sp = rows_ != static_cast<int>(n);
  host_inputs_.resize(n);
  host_targets_.resize(n);
  inputs_.resize(n);
  targets_.resize(n);
  h0_.resize(lnc);
  x_final_.resize(lnc);
  dx_final_.resize(lnc);
  dh0_.resize(lnc);
  full_.resize(sp ? nc : 0);
  if (shard_.last_stage()) {
    lnf_.resize(nc);
    lnf_local_.resize(sp ? lnc : 0);
    lnf_rstd_.resize(rows_);
    logits_.resize(n * vl_);
    losses_.resize(n);
    host_losses_.resize(n);
    dnorm_.resize(nc);
    dnorm_local_.resize(sp ? lnc : 0);
    row_max_.resize(n);
    row_lse_.resize(n);
  }
  SATDAR_RETURN_IF_ERROR(branches_->Resize(b, t, inference));
  SATDAR_RETURN_IF_ERROR(topology_->Resize(rows_));
  // Boundary buffers: the topology's state tensors, then V1.
  const size_t v1 = n * shard_.TpCount(config_.num_key_value_heads) * config_.head_size();
  auto layout = [&](int after_sublayer, std::vector<Vec<T>>* a, std::vector<Vec<T>>* g) {
    Vec<T> stream;
    stream.resize(lnc);
    a->assign(topology_->BoundaryTensors(after_sublayer), stream);
    if (branches_->has_value_residual()) {
      a->emplace_back();
      a->back().resize(v1);
    }
    *g = *a;
  };
  stage_ = StageBuffersT<B>();
  if (!shard_.first_stage()) layout(first_sublayer_ - 1, &stage_.in, &stage_.din);
  if (!shard_.last_stage()) layout(last_sublayer_, &stage_.out, &stage_.dout);
  return absl::OkStatus();
}

template <class B>
absl::Status DecoderModelT<B>::EmbeddingForward(const T* table, T* h0) {
  const int n = b_ * t_, d = config_.hidden_size;
  if (shard_.tp_size == 1) return ops::EmbeddingForward(x_, h0, inputs_.data(), table, n, d);
  // Rows outside this rank's vocabulary range are 0; the sum over ranks is the lookup (under
  // sequence parallelism reduce-scattered: this rank's token rows).
  const bool sp = rows_ != n;
  T* all = sp ? full_.data() : h0;
  SATDAR_RETURN_IF_ERROR(
      ops::VocabSliceEmbeddingForward(x_, all, inputs_.data(), table, v0_, vl_, n, d));
  if (sp) {
    TpReduceScatter(shard_, all, h0, static_cast<size_t>(rows_) * d);
  } else {
    TpAllReduce(shard_, h0, static_cast<size_t>(n) * d);
  }
  return absl::OkStatus();
}

template <class B>
absl::Status DecoderModelT<B>::EmbeddingBackward(Acc* dtable) {
  const int n = b_ * t_, d = config_.hidden_size;
  if (shard_.tp_size == 1) {
    return ops::EmbeddingBackward(x_, dtable, dh0_.data(), inputs_.data(), n, d);
  }
  const T* dh0 = dh0_.data();
  if (rows_ != n) {  // every token's gradient, for this rank's vocabulary rows
    TpAllGather(shard_, dh0_.data(), full_.data(), static_cast<size_t>(rows_) * d);
    dh0 = full_.data();
  }
  return ops::VocabSliceEmbeddingBackward(x_, dtable, dh0, inputs_.data(), v0_, vl_, n, d);
}

template <class B>
absl::Status DecoderModelT<B>::CrossEntropyLosses() {
  const int n = b_ * t_;
  if (shard_.tp_size == 1) {
    SATDAR_RETURN_IF_ERROR(
        ops::CrossEntropyForward(x_, losses_.data(), logits_.data(), targets_.data(), n, vl_));
  } else {
    // Vocabulary-parallel softmax: the row max, the sum of exponentials and the target's
    // logit are each reduced over the TP group (Megatron-LM's scheme).
    Vec<Acc> sum, target;
    sum.resize(n);
    target.resize(n);
    SATDAR_RETURN_IF_ERROR(
        ops::VocabParallelRowMax(x_, row_max_.data(), logits_.data(), n, vl_));
    TpAllReduce(shard_, row_max_.data(), n, comm::ReduceOp::kMax);
    SATDAR_RETURN_IF_ERROR(ops::VocabParallelSumExp(x_, sum.data(), target.data(),
                                                    logits_.data(), row_max_.data(),
                                                    targets_.data(), v0_, n, vl_));
    TpAllReduce(shard_, sum.data(), n);
    TpAllReduce(shard_, target.data(), n);
    SATDAR_RETURN_IF_ERROR(ops::VocabParallelLoss(x_, losses_.data(), row_lse_.data(),
                                                  row_max_.data(), sum.data(), target.data(), n));
  }
  return absl::OkStatus();
}

template <class B>
absl::Status DecoderModelT<B>::MeanLoss(double* loss) {
  const int n = b_ * t_;
  // The loss, read back (a copy on the CPU) and summed in double in order.
  SATDAR_RETURN_IF_ERROR(ops::Download(x_, host_losses_.data(), losses_.data(), n));
  double sum = 0;
  for (Acc l : host_losses_) sum += static_cast<double>(l);
  *loss = sum / n;
  return absl::OkStatus();
}

template <class B>
absl::Status DecoderModelT<B>::CrossEntropyBackward(double loss_scale) {
  const int n = b_ * t_;
  const Acc scale = static_cast<Acc>(loss_scale / n);
  if (shard_.tp_size == 1) {
    return ops::CrossEntropyBackward(x_, logits_.data(), logits_.data(), targets_.data(), scale,
                                     n, vl_);
  }
  return ops::VocabParallelCrossEntropyBackward(x_, logits_.data(), logits_.data(),
                                                row_lse_.data(), targets_.data(), scale, v0_, n,
                                                vl_);
}

template <class B>
absl::Status DecoderModelT<B>::LossIntoSink(const LossSink& sink) {
  const int n = b_ * t_;
  if (sink.train && shard_.tp_size == 1) {
    // The logits become their own gradient in the same pass (sink.scale / N per position).
    SATDAR_RETURN_IF_ERROR(ops::CrossEntropyForwardBackward(
        x_, losses_.data(), logits_.data(), logits_.data(), targets_.data(),
        static_cast<Acc>(sink.scale / n), n, vl_));
  } else {
    SATDAR_RETURN_IF_ERROR(CrossEntropyLosses());
    if (sink.train) SATDAR_RETURN_IF_ERROR(CrossEntropyBackward(sink.scale));
  }
  return ops::AccumulateSum(x_, sink.acc, losses_.data(), n, sink.scale / n);
}

template <class B>
absl::Status DecoderModelT<B>::CheckTokens(const int32_t* tokens, int b, int t) const {
  if (b < 1 || t < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch ", b, " x ", t, " tokens: both must be positive"));
  }
  const int64_t count = static_cast<int64_t>(b) * (t + 1);
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at position ", i,
                                                     " is outside [0, ", config_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

template <class B>
absl::StatusOr<double> DecoderModelT<B>::Forward(const Weights<B>& w, const int32_t* tokens,
                                                 int b, int t) {
  pass_ = Pass::kNone;
  SATDAR_RETURN_IF_ERROR(CheckTokens(tokens, b, t));
  if (!pending_.ok()) return std::exchange(pending_, absl::OkStatus());
  typename B::AllocScope scope(x_);
  absl::StatusOr<double> loss = ForwardPass(w, tokens, b, t, nullptr);
  SATDAR_RETURN_IF_ERROR(scope.status());
  SATDAR_RETURN_IF_ERROR(loss.status());
  SATDAR_RETURN_IF_ERROR(CommStatus());
  pass_ = Pass::kTrain;
  return loss;
}

template <class B>
absl::Status DecoderModelT<B>::ForwardAccumulate(const Weights<B>& w, const int32_t* tokens,
                                                 int b, int t, const LossSink& sink) {
  pass_ = Pass::kNone;
  if (sink.acc == nullptr) return absl::InvalidArgumentError("ForwardAccumulate: no loss sink");
  SATDAR_RETURN_IF_ERROR(CheckTokens(tokens, b, t));
  if (!pending_.ok()) return std::exchange(pending_, absl::OkStatus());
  typename B::AllocScope scope(x_);
  const absl::StatusOr<double> aux = ForwardPass(w, tokens, b, t, &sink);
  SATDAR_RETURN_IF_ERROR(scope.status());
  SATDAR_RETURN_IF_ERROR(aux.status());
  SATDAR_RETURN_IF_ERROR(CommStatus());
  pass_ = sink.train ? Pass::kFused : Pass::kNone;
  return absl::OkStatus();
}

template <class B>
absl::Status DecoderModelT<B>::Backward(const Weights<B>& w, Acc* grads, double loss_scale) {
  if (pass_ == Pass::kNone) {
    return absl::FailedPreconditionError(
        "Backward without a training forward pass (none yet, an evaluation, or a failed one)");
  }
  typename B::AllocScope scope(x_);
  const absl::Status status = BackwardPass(w, grads, loss_scale);
  SATDAR_RETURN_IF_ERROR(scope.status());
  SATDAR_RETURN_IF_ERROR(status);
  return CommStatus();
}

// Model<T>: one parameter buffer is both the compute and the master weights (the CPU; on a
// device only where they have one type).
template <class B>
absl::StatusOr<double> DecoderModelT<B>::Forward(const T* params, const int32_t* tokens, int b,
                                                 int t) {
  if constexpr (std::is_same_v<T, Acc>) {
    return Forward(Weights<B>{params, params}, tokens, b, t);
  } else {
    (void)params, (void)tokens, (void)b, (void)t;
    return absl::UnimplementedError(
        "Model::Forward with one parameter buffer: this model's master weights are fp32, "
        "call DecoderModelT::Forward(const Weights<B>&, ...)");
  }
}

template <class B>
absl::Status DecoderModelT<B>::Backward(const T* params, T* grads, double loss_scale) {
  if constexpr (std::is_same_v<T, Acc>) {
    return Backward(Weights<B>{params, params}, grads, loss_scale);
  } else {
    (void)params, (void)grads, (void)loss_scale;
    return absl::UnimplementedError(
        "Model::Backward with one parameter buffer: this model's master weights and gradients "
        "are fp32, call DecoderModelT::Backward(const Weights<B>&, Acc*, ...)");
  }
}

template <class B>
absl::Status DecoderModelT<B>::BeginDecode(int b, int capacity) {
  if (capacity > config_.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("decoding ", capacity,
                                                   " positions: max_position_embeddings is ",
                                                   config_.max_position_embeddings));
  }
  typename B::AllocScope scope(x_);
  absl::Status status = branches_->BeginDecode(b, capacity);
  if (status.ok()) status = scope.status();
  if (!status.ok()) branches_->EndDecode();  // no half-allocated cache
  return status;
}

template <class B>
absl::Status DecoderModelT<B>::DecodeStep(const T* params, const int32_t* tokens, int b, int tn,
                                          bool all_rows, std::vector<double>* logits) {
  if constexpr (std::is_same_v<T, Acc>) {
    return DecodeStep(Weights<B>{params, params}, tokens, b, tn, all_rows, logits);
  } else {
    (void)params, (void)tokens, (void)b, (void)tn, (void)all_rows, (void)logits;
    return absl::UnimplementedError(
        "Model::DecodeStep with one parameter buffer: this model's master weights are fp32, "
        "call DecoderModelT::DecodeStep(const Weights<B>&, ...)");
  }
}

template <class B>
absl::Status DecoderModelT<B>::DecodeStep(const Weights<B>& w, const int32_t* tokens, int b,
                                          int tn, bool all_rows, std::vector<double>* logits) {
  pass_ = Pass::kNone;
  const int batch = branches_->decode_batch();
  if (batch == 0) return absl::FailedPreconditionError("DecodeStep before BeginDecode");
  if (b != batch || tn < 1) {
    return absl::InvalidArgumentError(absl::StrCat("decode step of ", b, " x ", tn,
                                                   " tokens: BeginDecode was for ", batch,
                                                   " sequences, and tn must be positive"));
  }
  const int past = branches_->decode_position(), cap = branches_->decode_capacity();
  if (past + tn > cap) {
    return absl::OutOfRangeError(absl::StrCat("decoding positions ", past, "..", past + tn - 1,
                                              ": BeginDecode made room for ", cap));
  }
  const int64_t count = static_cast<int64_t>(b) * tn;
  for (int64_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at position ", i,
                                                     " is outside [0, ", config_.vocab_size, ")"));
    }
  }
  if (!pending_.ok()) return std::exchange(pending_, absl::OkStatus());
  typename B::AllocScope scope(x_);
  const absl::Status status = DecodePass(w, tokens, b, tn, all_rows, logits);
  SATDAR_RETURN_IF_ERROR(scope.status());
  return status;
}

template <class B>
absl::Status DecoderModelT<B>::DecodePass(const Weights<B>& w, const int32_t* tokens, int b,
                                          int tn, bool all_rows, std::vector<double>* logits) {
  SATDAR_RETURN_IF_ERROR(Resize(b, tn, /*inference=*/true));
  const int n = b * tn, d = config_.hidden_size;
  std::copy(tokens, tokens + n, host_inputs_.begin());
  SATDAR_RETURN_IF_ERROR(ops::Upload(x_, inputs_.data(), host_inputs_.data(), n));
  branches_->SetWeights(w, nullptr);
  SATDAR_RETURN_IF_ERROR(branches_->StartDecodeStep(tn));
  absl::Status status = EmbeddingForward(w.compute + embed_off_, h0_.data());
  if (status.ok()) {
    status = topology_->Forward(w, h0_.data(), branches_.get(), x_final_.data());
  }
  branches_->FinishDecodeStep(status.ok());  // the cache now holds the new positions
  SATDAR_RETURN_IF_ERROR(status);
  SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, lnf_.data(), lnf_rstd_.data(), x_final_.data(),
                                             w.compute + norm_off_, n, d,
                                             config_.rms_norm_eps));
  // The head on the rows asked for: every new position, or each sequence's last (gathered
  // into dnorm_, which a decode step does not otherwise use).
  const int rows = all_rows ? n : b;
  const T* head_in = lnf_.data();
  if (!all_rows && tn > 1) {
    for (int bi = 0; bi < b; ++bi) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dnorm_.data() + static_cast<int64_t>(bi) * d,
                                       lnf_.data() + (static_cast<int64_t>(bi) * tn + tn - 1) * d,
                                       d));
    }
    head_in = dnorm_.data();
  }
  SATDAR_RETURN_IF_ERROR(
      ops::MatmulForward(x_, logits_.data(), head_in, w.compute + head_off_, rows, vl_, d));
  SATDAR_RETURN_IF_ERROR(ops::MaskPaddedVocab(x_, logits_.data(), rows, vl_, vtrue_));
  // Read back (a copy on the CPU), without the padded columns.
  std::vector<T> host(static_cast<size_t>(rows) * vl_);
  SATDAR_RETURN_IF_ERROR(
      ops::Download(x_, host.data(), logits_.data(), static_cast<int64_t>(host.size())));
  const int vocab = config_.vocab_size;
  logits->resize(static_cast<size_t>(rows) * vocab);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < vocab; ++j) {
      const T v = host[static_cast<size_t>(r) * vl_ + j];
      if constexpr (std::is_arithmetic_v<T>) {
        (*logits)[static_cast<size_t>(r) * vocab + j] = static_cast<double>(v);
      } else {  // bf16
        (*logits)[static_cast<size_t>(r) * vocab + j] = static_cast<double>(static_cast<float>(v));
      }
    }
  }
  return absl::OkStatus();
}

template <class B>
absl::Status DecoderModelT<B>::UploadTokens(const int32_t* tokens, int b, int t) {
  const int n = b * t;
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      host_inputs_[bi * t + ti] = tokens[bi * (t + 1) + ti];
      host_targets_[bi * t + ti] = tokens[bi * (t + 1) + ti + 1];
    }
  }
  SATDAR_RETURN_IF_ERROR(ops::Upload(x_, inputs_.data(), host_inputs_.data(), n));
  return ops::Upload(x_, targets_.data(), host_targets_.data(), n);
}

template <class B>
absl::StatusOr<double> DecoderModelT<B>::ForwardPass(const Weights<B>& w, const int32_t* tokens,
                                                     int b, int t, const LossSink* sink) {
  SATDAR_RETURN_IF_ERROR(Resize(b, t));
  SATDAR_RETURN_IF_ERROR(UploadTokens(tokens, b, t));
  branches_->SetWeights(w, nullptr);
  if (shard_.pp_size == 1) {
    SATDAR_RETURN_IF_ERROR(EmbeddingForward(w.compute + embed_off_, h0_.data()));
    SATDAR_RETURN_IF_ERROR(topology_->Forward(w, h0_.data(), branches_.get(), x_final_.data()));
  } else {
    std::vector<const T*> in;
    std::vector<T*> out;
    if (shard_.first_stage()) {
      SATDAR_RETURN_IF_ERROR(EmbeddingForward(w.compute + embed_off_, h0_.data()));
    } else {
      for (const auto& v : stage_.in) in.push_back(v.data());
      if (branches_->has_value_residual()) {
        branches_->SetV1(stage_.in.back().data());
        in.pop_back();
      }
    }
    for (auto& v : stage_.out) out.push_back(v.data());
    if (branches_->has_value_residual() && !out.empty()) out.pop_back();
    SATDAR_RETURN_IF_ERROR(topology_->ForwardRange(w, first_sublayer_, last_sublayer_,
                                                   h0_.data(), in, branches_.get(),
                                                   x_final_.data(), out));
    if (!shard_.last_stage()) {
      if (branches_->has_value_residual()) {
        Vec<T>& v1 = stage_.out.back();
        SATDAR_RETURN_IF_ERROR(
            ops::Copy(x_, v1.data(), branches_->v1(), static_cast<int64_t>(v1.size())));
      }
      cross_entropy_ = 0;
      // This stage's share of the auxiliary losses.
      if (sink != nullptr && sink->train && branches_->aux_loss() != 0) {
        SATDAR_RETURN_IF_ERROR(
            ops::AccumulateValue(x_, sink->acc, sink->scale * branches_->aux_loss()));
      }
      return branches_->aux_loss();
    }
  }
  return HeadPass(w, sink);
}

template <class B>
absl::StatusOr<double> DecoderModelT<B>::HeadPass(const Weights<B>& w, const LossSink* sink) {
  const ModelConfig& c = config_;
  const int n = b_ * t_, d = c.hidden_size;
  // The final norm on this rank's rows; under SP the head reads every row (all-gathered).
  T* lnf = rows_ != n ? lnf_local_.data() : lnf_.data();
  SATDAR_RETURN_IF_ERROR(ops::RmsNormForward(x_, lnf, lnf_rstd_.data(), x_final_.data(),
                                             w.compute + norm_off_, rows_, d, c.rms_norm_eps));
  if (rows_ != n) TpAllGather(shard_, lnf, lnf_.data(), static_cast<size_t>(rows_) * d);
  SATDAR_RETURN_IF_ERROR(
      ops::MatmulForward(x_, logits_.data(), lnf_.data(), w.compute + head_off_, n, vl_, d));
  // Padded vocabulary rows: no probability (their gradients stay 0).
  SATDAR_RETURN_IF_ERROR(ops::MaskPaddedVocab(x_, logits_.data(), n, vl_, vtrue_));
  if (sink != nullptr) {
    cross_entropy_ = std::numeric_limits<double>::quiet_NaN();  // not read back
    SATDAR_RETURN_IF_ERROR(LossIntoSink(*sink));
    if (sink->train && branches_->aux_loss() != 0) {
      SATDAR_RETURN_IF_ERROR(
          ops::AccumulateValue(x_, sink->acc, sink->scale * branches_->aux_loss()));
    }
    return branches_->aux_loss();
  }
  SATDAR_RETURN_IF_ERROR(CrossEntropyLosses());
  SATDAR_RETURN_IF_ERROR(MeanLoss(&cross_entropy_));
  return cross_entropy_ + branches_->aux_loss();
}

template <class B>
absl::Status DecoderModelT<B>::BackwardPass(const Weights<B>& w, Acc* grads, double loss_scale) {
  const ModelConfig& c = config_;
  const int n = b_ * t_, d = c.hidden_size;
  if (shard_.last_stage()) {
    if (pass_ == Pass::kTrain) SATDAR_RETURN_IF_ERROR(CrossEntropyBackward(loss_scale));
    // dnorm = dlogits W (overwritten), dW_head += dlogits^T lnf (fp32 on a device).
    SATDAR_RETURN_IF_ERROR(layers_internal::LinearBackward(x_, dnorm_.data(), grads + head_off_,
                                                           logits_.data(), lnf_.data(),
                                                           w.compute + head_off_, n, vl_, d,
                                                           /*overwrite=*/true));
    // Each rank's vocabulary slice: summed over TP (under SP into this rank's rows).
    const T* dnorm = dnorm_.data();
    if (rows_ != n) {
      TpReduceScatter(shard_, dnorm_.data(), dnorm_local_.data(), dnorm_local_.size());
      dnorm = dnorm_local_.data();
    } else {
      TpAllReduce(shard_, dnorm_.data(), dnorm_.size());
    }
    SATDAR_RETURN_IF_ERROR(
        ops::Zero(x_, dx_final_.data(), static_cast<int64_t>(dx_final_.size())));
    SATDAR_RETURN_IF_ERROR(ops::RmsNormBackward(x_, dx_final_.data(), grads + norm_off_, dnorm,
                                                x_final_.data(), w.compute + norm_off_,
                                                lnf_rstd_.data(), rows_, d));
  }
  branches_->SetWeights(w, grads);
  SATDAR_RETURN_IF_ERROR(branches_->BeginBackward(loss_scale));
  if (shard_.pp_size == 1) {
    SATDAR_RETURN_IF_ERROR(topology_->Backward(w, grads, dx_final_.data(), branches_.get(),
                                               dh0_.data()));
  } else {
    std::vector<const T*> dout;
    std::vector<T*> din;
    for (const auto& v : stage_.dout) dout.push_back(v.data());
    for (auto& v : stage_.din) din.push_back(v.data());
    const bool vr = branches_->has_value_residual();
    if (vr && !dout.empty()) {
      // The later stages' gradient of V1 (summed along the way), added to by this stage.
      Vec<T>* dv1 = branches_->dv1();
      const Vec<T>& later = stage_.dout.back();
      dv1->resize(later.size());
      SATDAR_RETURN_IF_ERROR(
          ops::Copy(x_, dv1->data(), later.data(), static_cast<int64_t>(later.size())));
      dout.pop_back();
    }
    if (vr && !din.empty()) din.pop_back();
    SATDAR_RETURN_IF_ERROR(topology_->BackwardRange(w, grads, first_sublayer_, last_sublayer_,
                                                    dx_final_.data(), dout, branches_.get(),
                                                    dh0_.data(), din));
    if (vr && !shard_.first_stage()) {
      const Vec<T>& dv1 = *branches_->dv1();
      Vec<T>& sent = stage_.din.back();
      sent.resize(dv1.size());
      SATDAR_RETURN_IF_ERROR(
          ops::Copy(x_, sent.data(), dv1.data(), static_cast<int64_t>(dv1.size())));
    }
    if (!shard_.first_stage()) return absl::OkStatus();
  }
  return EmbeddingBackward(grads + embed_off_);
}

template <class B>
void DecoderModelT<B>::AppendStats(nlohmann::json* stats) const {
  branches_->AppendStats(stats);
  topology_->AppendStats(stats);
}

template <class B>
void DecoderModelT<B>::ResetStats() {
  branches_->ResetStats();
  topology_->ResetStats();
}

template <class B>
void DecoderModelT<B>::SetStatsEnabled(bool on) {
  if (ValueResidualT<B>* vr = branches_->value_residual()) vr->SetStatsEnabled(on);
  topology_->SetStatsEnabled(on);
}

template <class B>
bool DecoderModelT<B>::SetGateAblation(GateAblation mode) {
  ValueResidualT<B>* vr = branches_->value_residual();
  if (vr == nullptr) return mode == GateAblation::kNone;
  return vr->SetGateAblation(mode);
}

template <class B>
void DecoderModelT<B>::Predictions(std::vector<int32_t>* argmax) const {
  SATDAR_CHECK(shard_.last_stage()) << "Predictions on a pipeline stage without the head";
  const int n = b_ * t_, v = vl_;
  argmax->resize(n);
  // (best logit, its vocabulary id) per row of this rank's slice.
  std::vector<double> best(2 * static_cast<size_t>(n));
  // The logits read back a few rows at a time (copies on the CPU; a failed copy on a device
  // leaves argmax empty).
  const int chunk = std::max(1, std::min(n, (1 << 20) / std::max(v, 1)));
  std::vector<T> rows(static_cast<size_t>(chunk) * v);
  for (int r0 = 0; r0 < n; r0 += chunk) {
    const int count = std::min(chunk, n - r0);
    if (!ops::Download(x_, rows.data(), logits_.data() + static_cast<size_t>(r0) * v,
                       static_cast<int64_t>(count) * v)
             .ok()) {
      argmax->clear();
      return;
    }
    for (int r = r0; r < r0 + count; ++r) {
      const T* row = rows.data() + static_cast<size_t>(r - r0) * v;
      const int j = static_cast<int>(std::max_element(row, row + v) - row);
      (*argmax)[r] = v0_ + j;
      best[2 * r] = row[j];
      best[2 * r + 1] = v0_ + j;
    }
  }
  if (shard_.tp_size == 1) return;
  // Every TP rank's (best, id) pairs, gathered in the backend's memory (the TP communicator
  // moves device memory on a device).
  std::vector<double> all(best.size() * shard_.tp_size);
  Vec<double> mine, gathered;
  const bool gathered_ok =
      Allocate<B>(x_, [&] {
        mine.resize(best.size());
        gathered.resize(all.size());
      }).ok() &&
      ops::Upload(x_, mine.data(), best.data(), static_cast<int64_t>(best.size())).ok();
  if (gathered_ok) TpAllGather(shard_, mine.data(), gathered.data(), best.size());
  if (!gathered_ok || (shard_.errors != nullptr && shard_.errors->failed()) ||
      !ops::Download(x_, all.data(), gathered.data(), static_cast<int64_t>(all.size())).ok()) {
    argmax->clear();
    return;
  }
  for (int r = 0; r < n; ++r) {
    double top = all[2 * r];
    (*argmax)[r] = static_cast<int32_t>(all[2 * r + 1]);
    for (int q = 1; q < shard_.tp_size; ++q) {  // ties go to the lower id (the lower rank)
      const double* e = all.data() + q * best.size() + 2 * r;
      if (e[0] > top) {
        top = e[0];
        (*argmax)[r] = static_cast<int32_t>(e[1]);
      }
    }
  }
}

template <class B>
bool DecoderModelT<B>::GateValues(int layer, std::vector<double>* gates) const {
  ValueResidualT<B>* vr = branches_->value_residual();
  const Acc* g = vr == nullptr ? nullptr : vr->gate_values(layer);
  if (g == nullptr) return false;
  // Read back (a copy on the CPU).
  std::vector<Acc> host(static_cast<size_t>(b_) * t_ * shard_.TpCount(config_.num_key_value_heads));
  if (!ops::Download(x_, host.data(), g, static_cast<int64_t>(host.size())).ok()) return false;
  gates->assign(host.begin(), host.end());
  return true;
}

template class DecoderModelT<Cpu<float>>;
template class DecoderModelT<Cpu<double>>;
#if defined(SATDAR_WITH_CUDA)
template class DecoderModelT<Cuda<float>>;
template class DecoderModelT<Cuda<__nv_bfloat16>>;
#endif

}  // namespace satdar::model
