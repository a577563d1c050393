#include "parallel/pipeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::parallel {

namespace {
constexpr int kForwardTag = 101;   // activations, stage s -> s+1
constexpr int kBackwardTag = 102;  // gradients, stage s+1 -> s
}  // namespace

template <typename T>
PipelineSchedule<T>::PipelineSchedule(comm::Communicator* pp, std::vector<model::Model<T>*> slots,
                                      comm::CollectiveOptions options)
    : pp_(pp), slots_(std::move(slots)), options_(options), stage_(pp->rank()),
      stages_(pp->size()), sends_(slots_.size()) {
  SATDAR_CHECK(!slots_.empty()) << "a pipeline stage needs at least one model";
}

template <typename T>
absl::Status PipelineSchedule<T>::WaitSends(int slot) {
  for (auto& w : sends_[slot]) {
    absl::Status s = w->Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("pipeline stage ", stage_, ": ", s.message()));
    }
  }
  sends_[slot].clear();
  return absl::OkStatus();
}

template <typename T>
absl::Status PipelineSchedule<T>::Forward(int mb, const T* params, const int32_t* tokens, int b,
                                          int t, double* value) {
  const int slot = mb % static_cast<int>(slots_.size());
  SATDAR_RETURN_IF_ERROR(WaitSends(slot));  // the slot's buffers are free again
  model::Model<T>* m = slots_[slot];
  model::StageBuffers<T>* io = m->PrepareStage(b, t);
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  for (auto& v : io->in) {
    absl::Status s = pp_->Recv(v.data(), v.size(), kDType, stage_ - 1, kForwardTag, options_)->Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("pipeline stage ", stage_, " receiving micro-batch ",
                                                 mb, " from stage ", stage_ - 1, ": ", s.message()));
    }
  }
  SATDAR_ASSIGN_OR_RETURN(*value, m->Forward(params, tokens, b, t));
  for (const auto& v : io->out) {
    sends_[slot].push_back(pp_->Send(v.data(), v.size(), kDType, stage_ + 1, kForwardTag, options_));
    forward_bytes_ += static_cast<int64_t>(v.size() * sizeof(T));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status PipelineSchedule<T>::Backward(int mb, const T* params, T* grads, double loss_scale) {
  const int slot = mb % static_cast<int>(slots_.size());
  SATDAR_RETURN_IF_ERROR(WaitSends(slot));
  model::Model<T>* m = slots_[slot];
  model::StageBuffers<T>* io = m->PrepareStage(b_, t_);  // sized already: no reallocation
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  for (auto& v : io->dout) {
    absl::Status s =
        pp_->Recv(v.data(), v.size(), kDType, stage_ + 1, kBackwardTag, options_)->Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("pipeline stage ", stage_,
                                                 " receiving gradients of micro-batch ", mb,
                                                 " from stage ", stage_ + 1, ": ", s.message()));
    }
  }
  SATDAR_RETURN_IF_ERROR(m->Backward(params, grads, loss_scale));
  for (const auto& v : io->din) {
    sends_[slot].push_back(
        pp_->Send(v.data(), v.size(), kDType, stage_ - 1, kBackwardTag, options_));
    backward_bytes_ += static_cast<int64_t>(v.size() * sizeof(T));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<double> PipelineSchedule<T>::Step(
    const T* params, T* grads, const std::function<const int32_t*(int mb)>& tokens, int m, int b,
    int t) {
  b_ = b;
  t_ = t;
  forward_bytes_ = backward_bytes_ = 0;
  const int warmup = std::min(stages_ - stage_ - 1, m);
  SATDAR_CHECK(static_cast<int>(slots_.size()) >= std::min(warmup + 1, m))
      << "stage " << stage_ << " needs " << warmup + 1 << " model slots";
  double sum = 0, value = 0;
  const double scale = 1.0 / m;
  for (int mb = 0; mb < warmup; ++mb) {
    SATDAR_RETURN_IF_ERROR(Forward(mb, params, tokens(mb), b, t, &value));
    sum += value;
  }
  for (int mb = warmup; mb < m; ++mb) {  // steady state: one forward, one backward
    SATDAR_RETURN_IF_ERROR(Forward(mb, params, tokens(mb), b, t, &value));
    sum += value;
    SATDAR_RETURN_IF_ERROR(Backward(mb - warmup, params, grads, scale));
  }
  for (int mb = m - warmup; mb < m; ++mb) {  // drain
    SATDAR_RETURN_IF_ERROR(Backward(mb, params, grads, scale));
  }
  for (int slot = 0; slot < static_cast<int>(slots_.size()); ++slot) {
    SATDAR_RETURN_IF_ERROR(WaitSends(slot));
  }
  return sum;
}

template <typename T>
absl::StatusOr<double> PipelineSchedule<T>::ForwardOnly(
    const T* params, const std::function<const int32_t*(int mb)>& tokens, int m, int b, int t) {
  b_ = b;
  t_ = t;
  double sum = 0, value = 0;
  for (int mb = 0; mb < m; ++mb) {
    SATDAR_RETURN_IF_ERROR(Forward(mb, params, tokens(mb), b, t, &value));
    if (stage_ == stages_ - 1) sum += slots_[mb % slots_.size()]->last_cross_entropy();
  }
  for (int slot = 0; slot < static_cast<int>(slots_.size()); ++slot) {
    SATDAR_RETURN_IF_ERROR(WaitSends(slot));
  }
  return sum;
}

template class PipelineSchedule<float>;
template class PipelineSchedule<double>;

}  // namespace satdar::parallel
