// model/decoder_analysis.cc: DecoderModelT's analysis entry points (model.h): the residual
// streams' depth states after a forward pass, and the pass split at a sublayer so a state can
// be read out and a pass resumed from another (runtime/analysis.h: CKA and rescue). They run
// the topology's pipeline ranges (ForwardRange) on the whole model, so every design that can
// be pipelined can be analysed, on every backend.
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/decoder.h"
#include "model/ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

// Host doubles <-> the backend's T (through float for bf16).
template <typename T>
double ToDouble(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(v);
  } else {
    return static_cast<double>(static_cast<float>(v));
  }
}
template <typename T>
T FromDouble(double v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    return static_cast<T>(static_cast<float>(v));
  }
}

template <class B>
absl::Status Read(const typename B::Exec& x, const typename B::T* src, int64_t n,
                  std::vector<double>* out) {
  std::vector<typename B::T> host(static_cast<size_t>(n));
  SATDAR_RETURN_IF_ERROR(ops::Download(x, host.data(), src, n));
  out->resize(host.size());
  for (size_t i = 0; i < host.size(); ++i) (*out)[i] = ToDouble(host[i]);
  return absl::OkStatus();
}

}  // namespace

template <class B>
absl::Status DecoderModelT<B>::DepthStates(std::vector<DepthState>* states) const {
  states->clear();
  if (shard_.tp_size * shard_.pp_size * shard_.ep_size != 1) {
    return absl::FailedPreconditionError("depth states: the analyses read the whole model");
  }
  if (b_ == 0) return absl::FailedPreconditionError("depth states before a forward pass");
  std::vector<typename TopologyT<B>::DepthStateRef> refs;
  topology_->DepthStates(&refs);
  const int d = config_.hidden_size, n = b_ * t_;
  std::vector<double> whole;
  for (const auto& r : refs) {
    SATDAR_RETURN_IF_ERROR(Read<B>(x_, r.base, r.whole, &whole));
    DepthState s;
    s.stream = r.stream;
    s.depth = r.depth;
    s.sublayer = r.sublayer;
    s.values.resize(static_cast<size_t>(n) * d);
    for (int row = 0; row < n; ++row) {
      const double* from = whole.data() + r.offset + row * r.row_stride;
      std::copy(from, from + d, s.values.data() + static_cast<size_t>(row) * d);
    }
    states->push_back(std::move(s));
  }
  return absl::OkStatus();
}

template <class B>
absl::Status DecoderModelT<B>::BeginAnalysisPass(const char* what, const Weights<B>& w,
                                                 const int32_t* tokens, int b, int t, int at) {
  pass_ = Pass::kNone;
  if (shard_.tp_size * shard_.pp_size * shard_.ep_size != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the analyses read the whole model, not a shard or stage"));
  }
  const int sublayers = 2 * config_.num_hidden_layers;
  if (at < 2 || at >= sublayers || at % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": sublayer ", at, " is not between two layers (2, 4, .., ",
                     sublayers - 2, ": where a pipeline can split)"));
  }
  SATDAR_RETURN_IF_ERROR(CheckTokens(tokens, b, t));
  if (!pending_.ok()) return std::exchange(pending_, absl::OkStatus());
  SATDAR_RETURN_IF_ERROR(Resize(b, t));
  SATDAR_RETURN_IF_ERROR(UploadTokens(tokens, b, t));
  branches_->SetWeights(w, nullptr);
  const int n = b * t;
  // Boundary tensors, then V1 (as a pipeline boundary's, Resize).
  const size_t nc = static_cast<size_t>(n) * config_.hidden_size;
  const size_t v1 = static_cast<size_t>(n) * config_.num_key_value_heads * config_.head_size();
  const int tensors = topology_->BoundaryTensors(at) + (branches_->has_value_residual() ? 1 : 0);
  analysis_state_.resize(tensors);
  for (int i = 0; i < tensors; ++i) {
    const bool is_v1 = branches_->has_value_residual() && i == tensors - 1;
    analysis_state_[i].resize(is_v1 ? v1 : nc);
  }
  return absl::OkStatus();
}

template <class B>
absl::Status DecoderModelT<B>::ForwardToState(const T* params, const int32_t* tokens, int b,
                                              int t, int at,
                                              std::vector<std::vector<double>>* state,
                                              std::vector<int>* owner) {
  if constexpr (!std::is_same_v<T, Acc>) {
    (void)params, (void)tokens, (void)b, (void)t, (void)at, (void)state, (void)owner;
    return absl::UnimplementedError("ForwardToState: this model's master weights are fp32");
  } else {
    const Weights<B> w{params, params};
    typename B::AllocScope scope(x_);
    SATDAR_RETURN_IF_ERROR(BeginAnalysisPass("ForwardToState", w, tokens, b, t, at));
    SATDAR_RETURN_IF_ERROR(EmbeddingForward(w.compute + embed_off_, h0_.data()));
    const bool vr = branches_->has_value_residual();
    std::vector<T*> out;
    for (auto& v : analysis_state_) out.push_back(v.data());
    if (vr) out.pop_back();
    branches_->SetV1(nullptr);
    SATDAR_RETURN_IF_ERROR(topology_->ForwardRange(w, 1, at, h0_.data(), {}, branches_.get(),
                                                   x_final_.data(), out));
    SATDAR_RETURN_IF_ERROR(scope.status());
    state->assign(analysis_state_.size(), {});
    owner->clear();
    for (size_t i = 0; i < analysis_state_.size(); ++i) {
      const bool is_v1 = vr && i + 1 == analysis_state_.size();
      const T* src = is_v1 ? branches_->v1() : analysis_state_[i].data();
      SATDAR_RETURN_IF_ERROR(
          Read<B>(x_, src, static_cast<int64_t>(analysis_state_[i].size()), &(*state)[i]));
      owner->push_back(is_v1 ? -1 : topology_->BoundaryStream(at, static_cast<int>(i)));
    }
    return absl::OkStatus();
  }
}

template <class B>
absl::StatusOr<double> DecoderModelT<B>::ForwardFromState(
    const T* params, const int32_t* tokens, int b, int t, int at,
    const std::vector<std::vector<double>>& state, std::vector<double>* losses) {
  if constexpr (!std::is_same_v<T, Acc>) {
    (void)params, (void)tokens, (void)b, (void)t, (void)at, (void)state, (void)losses;
    return absl::UnimplementedError("ForwardFromState: this model's master weights are fp32");
  } else {
    const Weights<B> w{params, params};
    typename B::AllocScope scope(x_);
    SATDAR_RETURN_IF_ERROR(BeginAnalysisPass("ForwardFromState", w, tokens, b, t, at));
    if (state.size() != analysis_state_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardFromState: ", state.size(),
                                                     " state tensors; the state after sublayer ",
                                                     at, " has ", analysis_state_.size()));
    }
    std::vector<T> host;
    for (size_t i = 0; i < state.size(); ++i) {
      if (state[i].size() != analysis_state_[i].size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("ForwardFromState: state tensor ", i, " has ", state[i].size(),
                         " values, not ", analysis_state_[i].size()));
      }
      host.resize(state[i].size());
      for (size_t k = 0; k < host.size(); ++k) host[k] = FromDouble<T>(state[i][k]);
      SATDAR_RETURN_IF_ERROR(ops::Upload(x_, analysis_state_[i].data(), host.data(),
                                         static_cast<int64_t>(host.size())));
    }
    std::vector<const T*> in;
    for (const auto& v : analysis_state_) in.push_back(v.data());
    const bool vr = branches_->has_value_residual();
    if (vr) {
      branches_->SetV1(in.back());
      in.pop_back();
    }
    const absl::Status range = topology_->ForwardRange(
        w, at + 1, 2 * config_.num_hidden_layers, h0_.data(), in, branches_.get(),
        x_final_.data(), {});
    branches_->SetV1(nullptr);
    SATDAR_RETURN_IF_ERROR(range);
    absl::StatusOr<double> loss = HeadPass(w, nullptr);
    SATDAR_RETURN_IF_ERROR(scope.status());
    SATDAR_RETURN_IF_ERROR(loss.status());
    // MeanLoss read every position's loss back into host_losses_.
    if (losses != nullptr) losses->assign(host_losses_.begin(), host_losses_.end());
    return cross_entropy_;  // without the auxiliary losses
  }
}

#define SATDAR_DECODER_ANALYSIS(B)                                                            \
  template absl::Status DecoderModelT<B>::DepthStates(std::vector<DepthState>*) const;        \
  template absl::Status DecoderModelT<B>::BeginAnalysisPass(const char*, const Weights<B>&,   \
                                                            const int32_t*, int, int, int);   \
  template absl::Status DecoderModelT<B>::ForwardToState(                                     \
      const B::T*, const int32_t*, int, int, int, std::vector<std::vector<double>>*,          \
      std::vector<int>*);                                                                     \
  template absl::StatusOr<double> DecoderModelT<B>::ForwardFromState(                         \
      const B::T*, const int32_t*, int, int, int, const std::vector<std::vector<double>>&,    \
      std::vector<double>*);

SATDAR_DECODER_ANALYSIS(Cpu<float>)
SATDAR_DECODER_ANALYSIS(Cpu<double>)
#if defined(SATDAR_WITH_CUDA)
SATDAR_DECODER_ANALYSIS(Cuda<float>)
SATDAR_DECODER_ANALYSIS(Cuda<__nv_bfloat16>)
#endif
#undef SATDAR_DECODER_ANALYSIS

}  // namespace satdar::model
