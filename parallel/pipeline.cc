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

absl::StatusOr<PipelineLinks> MakePipelineLinks(comm::Communicator* pp,
                                                const comm::CollectiveOptions& options,
                                                double* probe) {
  const int p = pp->size(), s = pp->rank();
  if (p < 2) return absl::InvalidArgumentError("pipeline links need 2 or more stages");
  // Edge j joins stages j and j + 1 (mod p). Each round of splits takes a matching of the
  // ring's edges (even and odd j; with an odd p the last edge alone), once per direction.
  auto round_of = [p](int j) { return p % 2 == 1 && j == p - 1 ? 2 : j % 2; };
  const int rounds = p % 2 == 1 ? 3 : 2;
  PipelineLinks links;
  for (int next = 1; next >= 0; --next) {
    for (int r = 0; r < rounds; ++r) {
      // This rank's edge in the round, if any: its own (j = s) or the one before (j = s - 1).
      int edge = -1;
      if (round_of(s) == r) edge = s;
      if (round_of((s + p - 1) % p) == r) edge = (s + p - 1) % p;
      // The sender first: stage j sends activations over edge j, stage j + 1 gradients.
      const int sender = next ? edge : (edge + 1) % p;
      SATDAR_ASSIGN_OR_RETURN(
          std::unique_ptr<comm::Communicator> c,
          pp->Split(edge >= 0 ? edge : p + s, edge >= 0 && s == sender ? 0 : 1, options));
      if (edge < 0) continue;  // a singleton: no link this round
      if (probe != nullptr) {
        // One message over the new link, while its two ranks are both here: NCCL connects a
        // link at its first use, which must not be in the middle of the schedule.
        comm::CollectiveOptions o = options;
        o.enqueue_now = true;
        SATDAR_RETURN_IF_ERROR(
            (s == sender ? c->Send(probe, 1, core::DType::kF64, 1, 0, o)
                         : c->Recv(probe, 1, core::DType::kF64, 0, 0, o))
                ->Wait());
      }
      const bool mine = edge == s;  // the edge to the next stage
      auto& slot = next ? (mine ? links.to_next : links.from_prev)
                        : (mine ? links.from_next : links.to_prev);
      slot = std::move(c);
    }
  }
  return links;
}

PipelineSchedule::PipelineSchedule(comm::Communicator* pp,
                                   std::vector<std::vector<PipelineStage*>> chunks,
                                   comm::CollectiveOptions options)
    : pp_(pp), chunks_(std::move(chunks)), options_(options), stage_(pp->rank()),
      stages_(pp->size()) {
  InitSlots();
}

void PipelineSchedule::InitSlots() {
  SATDAR_CHECK(!chunks_.empty()) << "a pipeline rank needs at least one chunk";
  for (const auto& slots : chunks_) {
    SATDAR_CHECK(!slots.empty()) << "a pipeline chunk needs at least one model";
    views_.emplace_back(slots.size());
    sends_.emplace_back(slots.size());
  }
  forward_bytes_.assign(chunks_.size(), 0);
  backward_bytes_.assign(chunks_.size(), 0);
}

PipelineSchedule::PipelineSchedule(PipelineLinks links, int stage, int stages,
                                   std::vector<std::vector<PipelineStage*>> chunks,
                                   comm::CollectiveOptions options)
    : pp_(nullptr), links_(std::move(links)), chunks_(std::move(chunks)), options_(options),
      stage_(stage), stages_(stages) {
  SATDAR_CHECK(links_.to_next && links_.from_prev && links_.to_prev && links_.from_next)
      << "pipeline stage " << stage << " is missing a link";
  InitSlots();
}

std::pair<comm::Communicator*, int> PipelineSchedule::Route(bool send, bool forward) const {
  if (pp_ != nullptr) {
    const int next = (stage_ + 1) % stages_, prev = (stage_ + stages_ - 1) % stages_;
    return {pp_, send == forward ? next : prev};
  }
  // On a link the sender is rank 0, the receiver rank 1.
  if (send) return {forward ? links_.to_next.get() : links_.to_prev.get(), 1};
  return {forward ? links_.from_prev.get() : links_.from_next.get(), 0};
}

absl::Status PipelineSchedule::WaitSends(int chunk, int slot, bool forward) {
  std::vector<std::unique_ptr<comm::Work>>& pending = sends_[chunk][slot][forward ? 0 : 1];
  for (auto& w : pending) {
    absl::Status s = w->Wait();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("pipeline stage ", Virtual(chunk), ": ",
                                                 s.message()));
    }
  }
  pending.clear();
  return absl::OkStatus();
}

absl::Status PipelineSchedule::WaitAllSends() {
  for (int c = 0; c < chunks(); ++c) {
    for (int slot = 0; slot < static_cast<int>(chunks_[c].size()); ++slot) {
      SATDAR_RETURN_IF_ERROR(WaitSends(c, slot, /*forward=*/true));
      SATDAR_RETURN_IF_ERROR(WaitSends(c, slot, /*forward=*/false));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PipelineSchedule::Slot> PipelineSchedule::Take(int chunk, int mb) {
  const int slot = mb % static_cast<int>(chunks_[chunk].size());
  PipelineStage* stage = chunks_[chunk][slot];
  absl::StatusOr<model::StageViews> views = stage->Prepare(b_, t_);
  if (!views.ok()) {
    return absl::Status(views.status().code(),
                        absl::StrCat("pipeline stage ", Virtual(chunk), " micro-batch ", mb, ": ",
                                     views.status().message()));
  }
  views_[chunk][slot] = *std::move(views);
  return Slot{stage, &views_[chunk][slot], slot};
}

comm::CollectiveOptions PipelineSchedule::OptionsFor(size_t k, size_t n) const {
  comm::CollectiveOptions o = options_;
  // Over links, the message's last call enqueues it and the calls pending before it as one
  // group (a link's sender issues nothing else that would).
  o.enqueue_now = pp_ == nullptr && k + 1 == n;
  return o;
}

absl::Status PipelineSchedule::Receive(const std::vector<model::BoundaryView>& into,
                                       core::DType dtype, bool forward, int chunk, int mb) {
  const auto [c, from] = Route(/*send=*/false, forward);
  // All of the message's tensors first, so that they are one group where calls are grouped.
  std::vector<std::unique_ptr<comm::Work>> works;
  for (size_t k = 0; k < into.size(); ++k) {
    works.push_back(c->Recv(into[k].data, into[k].count, dtype, from,
                            (forward ? kForwardTag : kBackwardTag) + chunk,
                            OptionsFor(k, into.size())));
  }
  // Every one waited for (none left to write into the buffers later); the first failure.
  absl::Status first;
  for (auto& w : works) {
    absl::Status s = w->Wait();
    if (first.ok() && !s.ok()) first = std::move(s);
  }
  if (first.ok()) return first;
  return absl::Status(first.code(), absl::StrCat("pipeline stage ", Virtual(chunk), " receiving ",
                                                 forward ? "" : "gradients of ", "micro-batch ",
                                                 mb, " from stage ",
                                                 Virtual(chunk) + (forward ? -1 : 1), ": ",
                                                 first.message()));
}

void PipelineSchedule::SendAll(const std::vector<model::BoundaryView>& from, core::DType dtype,
                               bool forward, int chunk, int to_chunk, int mb) {
  const auto [c, to] = Route(/*send=*/true, forward);
  auto& pending = sends_[chunk][mb % static_cast<int>(chunks_[chunk].size())][forward ? 0 : 1];
  for (size_t k = 0; k < from.size(); ++k) {
    pending.push_back(c->Send(from[k].data, from[k].count, dtype, to,
                              (forward ? kForwardTag : kBackwardTag) + to_chunk,
                              OptionsFor(k, from.size())));
    (forward ? forward_bytes_ : backward_bytes_)[chunk] +=
        static_cast<int64_t>(from[k].count * core::DTypeSize(dtype));
  }
}

void PipelineSchedule::Abandon() {
  for (auto& chunk : sends_) {
    for (auto& slot : chunk) {
      for (auto& pending : slot) {
        for (auto& w : pending) (void)w->Wait();  // completes, fails or times out
        pending.clear();
      }
    }
  }
}

absl::Status PipelineSchedule::Forward(int chunk, int mb, const int32_t* tokens, int b, int t,
                                       bool train, double loss_scale, double* value) {
  SATDAR_ASSIGN_OR_RETURN(Slot s, Take(chunk, mb));
  if (!s.views->in.empty()) {
    // The instance's last backward may still read what the receive overwrites.
    SATDAR_RETURN_IF_ERROR(s.stage->Synchronize());
    SATDAR_RETURN_IF_ERROR(Receive(s.views->in, s.views->dtype, /*forward=*/true, chunk, mb));
  }
  // The activations the instance sent last are about to be overwritten. Waiting only here
  // (not before the receive) matters where a send completes only once it is received (NCCL):
  // the peer may post that receive only after this rank's receive let it go on.
  SATDAR_RETURN_IF_ERROR(WaitSends(chunk, s.slot, /*forward=*/true));
  if (train) {
    SATDAR_ASSIGN_OR_RETURN(*value, s.stage->Forward(tokens, b, t, loss_scale));
  } else {
    SATDAR_ASSIGN_OR_RETURN(*value, s.stage->Evaluate(tokens, b, t));
  }
  if (s.views->out.empty()) return absl::OkStatus();
  SATDAR_RETURN_IF_ERROR(s.stage->Synchronize());  // the activations written
  // The next virtual stage: this rank's next chunk's on the first rank after the last.
  const int to_chunk = stage_ == stages_ - 1 ? chunk + 1 : chunk;
  SendAll(s.views->out, s.views->dtype, /*forward=*/true, chunk, to_chunk, mb);
  return absl::OkStatus();
}

absl::Status PipelineSchedule::Backward(int chunk, int mb, double loss_scale) {
  SATDAR_ASSIGN_OR_RETURN(Slot s, Take(chunk, mb));  // sized already: no reallocation
  if (!s.views->dout.empty()) {
    SATDAR_RETURN_IF_ERROR(s.stage->Synchronize());
    SATDAR_RETURN_IF_ERROR(
        Receive(s.views->dout, s.views->dtype, /*forward=*/false, chunk, mb));
  }
  SATDAR_RETURN_IF_ERROR(WaitSends(chunk, s.slot, /*forward=*/false));  // as in Forward
  SATDAR_RETURN_IF_ERROR(s.stage->Backward(loss_scale));
  if (s.views->din.empty()) return absl::OkStatus();
  SATDAR_RETURN_IF_ERROR(s.stage->Synchronize());  // the gradients written
  // A backward pass may resize what it sends (V1's gradient): the buffers' addresses again.
  SATDAR_ASSIGN_OR_RETURN(s, Take(chunk, mb));
  const int to_chunk = stage_ == 0 ? chunk - 1 : chunk;
  SendAll(s.views->din, s.views->dtype, /*forward=*/false, chunk, to_chunk, mb);
  return absl::OkStatus();
}

absl::StatusOr<double> PipelineSchedule::Step(
    const std::function<const int32_t*(int mb)>& tokens, int m, int b, int t) {
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
    SATDAR_RETURN_IF_ERROR(Forward(forward_chunk(i), mb_of(i), tokens(mb_of(i)), b, t,
                                   /*train=*/true, scale, &value));
    sum += value;
    return absl::OkStatus();
  };
  auto backward = [&](int i) { return Backward(backward_chunk(i), mb_of(i), scale); };
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

absl::StatusOr<double> PipelineSchedule::ForwardOnly(
    const std::function<const int32_t*(int mb)>& tokens, int m, int b, int t) {
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
        SATDAR_RETURN_IF_ERROR(
            Forward(c, mb, tokens(mb), b, t, /*train=*/false, 1.0, &value));
        sum += value;
      }
    }
  }
  SATDAR_RETURN_IF_ERROR(WaitAllSends());
  return sum;
}

absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> BoundaryBytes(
    const PipelineSchedule& pipe, comm::Communicator* pp, const comm::CollectiveOptions& options) {
  // Virtual stage j is chunk j / p of rank j % p.
  const int v = pipe.chunks(), p = pipe.stages();
  std::vector<int64_t> mine;
  for (int c = 0; c < v; ++c) {
    mine.push_back(pipe.forward_bytes(c));
    mine.push_back(pipe.backward_bytes(c));
  }
  std::vector<int64_t> all(mine.size() * p);
  SATDAR_RETURN_IF_ERROR(
      pp->AllGather(mine.data(), all.data(), mine.size(), core::DType::kI64, options)->Wait());
  auto at = [&](int j, int which) { return all[((j % p) * v + j / p) * 2 + which]; };
  std::vector<std::pair<int64_t, int64_t>> boundaries;
  for (int j = 0; j + 1 < p * v; ++j) boundaries.emplace_back(at(j, 0), at(j + 1, 1));
  return boundaries;
}

}  // namespace satdar::parallel
