#include "parallel/pipeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::parallel {

namespace {

// Activations into chunk v travel with tag kForwardTag + v, gradients into chunk v with
// kBackwardTag + v.
constexpr int kForwardTag = 1000;
constexpr int kBackwardTag = 2000;

int Warmup(int stages, int stage, int chunks, int m) {
  if (chunks == 1) return std::min(stages - stage - 1, m);
  return std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, chunks * m);
}

}  // namespace

int PipelineSlots(int stages, int stage, int chunks, int microbatches) {
  return std::max(1, std::min(microbatches, Warmup(stages, stage, chunks, microbatches) + 1));
}

template <typename T>
PipelineSchedule<T>::PipelineSchedule(comm::Communicator* pp,
                                      std::vector<std::vector<model::Model<T>*>> chunks,
                                      std::vector<int64_t> offsets,
                                      comm::CollectiveOptions options)
    : pp_(pp), chunks_(std::move(chunks)), offsets_(std::move(offsets)), options_(options),
      stage_(pp->rank()), stages_(pp->size()), forward_bytes_(chunks_.size(), 0),
      backward_bytes_(chunks_.size(), 0) {
  SATDAR_CHECK(!chunks_.empty() && chunks_.size() == offsets_.size())
      << "a pipeline rank needs at least one chunk and an offset per chunk";
  for (const auto& slots : chunks_) {
    SATDAR_CHECK(!slots.empty()) << "a pipeline chunk needs at least one model";
    sends_.emplace_back(slots.size());
  }
}

template <typename T>
absl::Status PipelineSchedule<T>::WaitSends(int chunk, int slot) {
  for (auto& w : sends_[chunk][slot]) {
    absl::Status s = w->Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("pipeline stage ", Virtual(chunk), ": ",
                                                 s.message()));
    }
  }
  sends_[chunk][slot].clear();
  return absl::OkStatus();
}

template <typename T>
absl::Status PipelineSchedule<T>::WaitAllSends() {
  for (int c = 0; c < chunks(); ++c) {
    for (int slot = 0; slot < static_cast<int>(chunks_[c].size()); ++slot) {
      SATDAR_RETURN_IF_ERROR(WaitSends(c, slot));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status PipelineSchedule<T>::Forward(int chunk, int mb, const T* params,
                                          const int32_t* tokens, int b, int t, double* value) {
  const auto& slots = chunks_[chunk];
  const int slot = mb % static_cast<int>(slots.size());
  SATDAR_RETURN_IF_ERROR(WaitSends(chunk, slot));  // the slot's buffers are free again
  model::Model<T>* m = slots[slot];
  model::StageBuffers<T>* io = m->PrepareStage(b, t);
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  const int prev = (stage_ + stages_ - 1) % stages_, next = (stage_ + 1) % stages_;
  for (auto& v : io->in) {
    absl::Status s =
        pp_->Recv(v.data(), v.size(), kDType, prev, kForwardTag + chunk, options_)->Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("pipeline stage ", Virtual(chunk),
                                                 " receiving micro-batch ", mb, " from stage ",
                                                 Virtual(chunk) - 1, ": ", s.message()));
    }
  }
  SATDAR_ASSIGN_OR_RETURN(*value, m->Forward(params + offsets_[chunk], tokens, b, t));
  // The next virtual stage: this rank's next chunk's on the first rank after the last.
  const int to_chunk = stage_ == stages_ - 1 ? chunk + 1 : chunk;
  for (const auto& v : io->out) {
    sends_[chunk][slot].push_back(
        pp_->Send(v.data(), v.size(), kDType, next, kForwardTag + to_chunk, options_));
    forward_bytes_[chunk] += static_cast<int64_t>(v.size() * sizeof(T));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status PipelineSchedule<T>::Backward(int chunk, int mb, const T* params, T* grads,
                                           double loss_scale) {
  const auto& slots = chunks_[chunk];
  const int slot = mb % static_cast<int>(slots.size());
  SATDAR_RETURN_IF_ERROR(WaitSends(chunk, slot));
  model::Model<T>* m = slots[slot];
  model::StageBuffers<T>* io = m->PrepareStage(b_, t_);  // sized already: no reallocation
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  const int prev = (stage_ + stages_ - 1) % stages_, next = (stage_ + 1) % stages_;
  for (auto& v : io->dout) {
    absl::Status s =
        pp_->Recv(v.data(), v.size(), kDType, next, kBackwardTag + chunk, options_)->Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("pipeline stage ", Virtual(chunk),
                                                 " receiving gradients of micro-batch ", mb,
                                                 " from stage ", Virtual(chunk) + 1, ": ",
                                                 s.message()));
    }
  }
  SATDAR_RETURN_IF_ERROR(
      m->Backward(params + offsets_[chunk], grads + offsets_[chunk], loss_scale));
  const int to_chunk = stage_ == 0 ? chunk - 1 : chunk;
  for (const auto& v : io->din) {
    sends_[chunk][slot].push_back(
        pp_->Send(v.data(), v.size(), kDType, prev, kBackwardTag + to_chunk, options_));
    backward_bytes_[chunk] += static_cast<int64_t>(v.size() * sizeof(T));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<double> PipelineSchedule<T>::Step(
    const T* params, T* grads, const std::function<const int32_t*(int mb)>& tokens, int m, int b,
    int t) {
  b_ = b;
  t_ = t;
  std::fill(forward_bytes_.begin(), forward_bytes_.end(), 0);
  std::fill(backward_bytes_.begin(), backward_bytes_.end(), 0);
  const int v = chunks(), p = stages_;
  SATDAR_CHECK(v == 1 || m % p == 0)
      << "the interleaved schedule needs micro-batches in groups of the " << p << " stages";
  // The i-th forward (backward) of this rank: its chunk and micro-batch. Plain: chunk 0, mb i.
  // Interleaved: groups of p micro-batches visit the chunks in order (backward in reverse).
  auto mb_of = [&](int i) { return v == 1 ? i : (i / (p * v)) * p + i % p; };
  auto forward_chunk = [&](int i) { return v == 1 ? 0 : (i / p) % v; };
  auto backward_chunk = [&](int i) { return v == 1 ? 0 : v - 1 - (i / p) % v; };
  const int total = m * v, warmup = Warmup(p, stage_, v, m);
  for (int c = 0; c < v; ++c) {
    SATDAR_CHECK(static_cast<int>(chunks_[c].size()) >= PipelineSlots(p, stage_, v, m))
        << "stage " << Virtual(c) << " needs " << PipelineSlots(p, stage_, v, m) << " model slots";
  }
  double sum = 0, value = 0;
  const double scale = 1.0 / m;
  auto forward = [&](int i) -> absl::Status {
    SATDAR_RETURN_IF_ERROR(
        Forward(forward_chunk(i), mb_of(i), params, tokens(mb_of(i)), b, t, &value));
    sum += value;
    return absl::OkStatus();
  };
  auto backward = [&](int i) {
    return Backward(backward_chunk(i), mb_of(i), params, grads, scale);
  };
  for (int i = 0; i < warmup; ++i) SATDAR_RETURN_IF_ERROR(forward(i));
  for (int i = 0; i + warmup < total; ++i) {  // steady state: one forward, one backward
    SATDAR_RETURN_IF_ERROR(forward(warmup + i));
    SATDAR_RETURN_IF_ERROR(backward(i));
  }
  for (int i = std::max(0, total - warmup); i < total; ++i) {  // drain
    SATDAR_RETURN_IF_ERROR(backward(i));
  }
  SATDAR_RETURN_IF_ERROR(WaitAllSends());
  return sum;
}

template <typename T>
absl::StatusOr<double> PipelineSchedule<T>::ForwardOnly(
    const T* params, const std::function<const int32_t*(int mb)>& tokens, int m, int b, int t) {
  b_ = b;
  t_ = t;
  double sum = 0, value = 0;
  // Groups of p micro-batches (the last one may be short), each through the chunks in order,
  // as the interleaved step's forwards run (plain: one group of all m). Every message of a
  // group is received within the receiver's same group, so no rank waits on one waiting on it.
  const int group = chunks() == 1 ? m : stages_;
  for (int g0 = 0; g0 < m; g0 += group) {
    for (int c = 0; c < chunks(); ++c) {
      for (int mb = g0; mb < std::min(m, g0 + group); ++mb) {
        SATDAR_RETURN_IF_ERROR(Forward(c, mb, params, tokens(mb), b, t, &value));
        if (LastVirtual(c)) sum += chunks_[c][mb % chunks_[c].size()]->last_cross_entropy();
      }
    }
  }
  SATDAR_RETURN_IF_ERROR(WaitAllSends());
  return sum;
}

template class PipelineSchedule<float>;
template class PipelineSchedule<double>;

}  // namespace satdar::parallel
