#include "runtime/gradient_sync.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/check.h"
#include "core/ops/elementwise.h"

#if defined(SATDAR_WITH_CUDA)
#include "core/cuda/stream.h"
#endif

namespace satdar::runtime {

namespace ops = ::satdar::core::ops;

ParamRoles RolesOf(const model::ParamTable& table, const MeshGroups& g, bool tied) {
  model::RankPlace place;
  place.tp = g.coord.tp;
  place.pp = g.coord.pp;
  place.ep = g.coord.ep;
  place.pipeline = g.shape.pp > 1;
  return model::RolesOf(table, place, tied);
}

// The CPU's collectives read host memory the caller has finished writing: no events.
template <class B>
struct GradientSyncT<B>::Marks {
  absl::StatusOr<comm::CollectiveOptions> Ready(const typename B::Exec& x,
                                                comm::CollectiveOptions c, bool reuse) {
    (void)x, (void)reuse;
    return c;
  }
};

#if defined(SATDAR_WITH_CUDA)
// A pool of events, one per collective in flight; all are free again once nothing is pending.
template <>
struct GradientSyncT<model::Cuda<float>>::Marks {
  absl::StatusOr<comm::CollectiveOptions> Ready(const core::CudaExec& x,
                                                comm::CollectiveOptions c, bool reuse) {
    if (reuse) used = 0;
    if (used == events.size()) {
      SATDAR_ASSIGN_OR_RETURN(core::cuda::Event e, core::cuda::Event::Create());
      events.push_back(std::move(e));
    }
    SATDAR_RETURN_IF_ERROR(events[used].Record(x.stream));
    c.ready_event = events[used++].get();
    return c;
  }
  std::vector<core::cuda::Event> events;
  size_t used = 0;
};
#endif

template <class B>
GradientSyncT<B>::GradientSyncT(const model::ParamTable& table, const MeshGroups* groups,
                                const model::ModelConfig& config,
                                const std::vector<ZeroPartition>& parts,
                                const comm::CollectiveOptions& options,
                                const typename B::Exec& x)
    : g_(groups),
      roles_(RolesOf(table, *groups, config.tie_word_embeddings)),
      n_(table.size()),
      parts_(parts),
      copts_(options),
      x_(x),
      overlap_(groups->data_size() > 1 && parts.empty() && groups->shape.pp == 1 &&
               groups->shape.ep == 1),
      marks_(std::make_unique<Marks>()) {
  if (!parts_.empty()) {
    std::vector<bool> counted(n_, false);
    for (const auto& [off, len] : roles_.in_norm_zero) {
      std::fill(counted.begin() + off, counted.begin() + off + len, true);
    }
    for (const ZeroPartition& p : parts_) {
      Runs runs;
      p.ForOwned([&](int64_t k, int64_t flat) {
        if (!counted[flat]) return;
        if (!runs.empty() && runs.back().first + runs.back().second == k) {
          ++runs.back().second;
        } else {
          runs.emplace_back(k, 1);
        }
      });
      counted_shard_.push_back(std::move(runs));
    }
  }
  for (size_t i : table.BlockStarts()) {
    layer_start_.push_back(i < table.specs().size() ? table.specs()[i].offset : n_);
  }
}

template <class B>
GradientSyncT<B>::~GradientSyncT() = default;

template <class B>
absl::StatusOr<comm::CollectiveOptions> GradientSyncT<B>::Ready() {
  return marks_->Ready(x_, copts_, pending_.empty());
}

template <class B>
void GradientSyncT<B>::ReduceRange(G* grads, int64_t begin, int64_t end) {
  absl::StatusOr<comm::CollectiveOptions> c = Ready();
  if (!c.ok()) {
    // Keep the collectives in step with the other ranks: wait for the stream instead of an
    // event, issue it anyway, and fail the step in Reduce.
    if (hook_status_.ok()) hook_status_ = c.status();
    (void)ops::Synchronize(x_);
    c = copts_;
  }
  pending_.push_back(g_->data->AllReduce(grads + begin, end - begin, core::DTypeOf<G>::value,
                                         comm::ReduceOp::kAvg, *c));
}

template <class B>
void GradientSyncT<B>::EndOverlap(G* grads) {
  // What the hook did not cover: embedding, globals and layer 0; final norm and head.
  ReduceRange(grads, 0, layer_start_.size() > 2 ? layer_start_[1] : layer_start_.back());
  ReduceRange(grads, layer_start_.back(), n_);
}

template <class B>
absl::Status GradientSyncT<B>::WaitPending() {
  absl::Status first = std::exchange(hook_status_, absl::OkStatus());
  for (auto& w : pending_) {
    absl::Status s = w->Wait();
    if (first.ok()) first = s;
  }
  pending_.clear();
  return first;
}

template <class B>
void GradientSyncT<B>::Abandon() {
  (void)WaitPending();
}

template <class B>
absl::Status GradientSyncT<B>::ReduceScalar(comm::Communicator* group, double* v,
                                            comm::ReduceOp op) {
  if (group == nullptr) return absl::OkStatus();
  typename B::AllocScope scope(x_);
  scalar_.resize(1);
  SATDAR_RETURN_IF_ERROR(scope.status());
  SATDAR_RETURN_IF_ERROR(ops::Upload(x_, scalar_.data(), v, 1));
  SATDAR_ASSIGN_OR_RETURN(comm::CollectiveOptions c, Ready());
  SATDAR_RETURN_IF_ERROR(group->AllReduce(scalar_.data(), 1, core::DType::kF64, op, c)->Wait());
  return ops::Download(x_, v, scalar_.data(), 1);
}

template <class B>
absl::StatusOr<double> GradientSyncT<B>::ReduceLoss(double loss) {
  SATDAR_RETURN_IF_ERROR(ReduceScalar(g_->pp.get(), &loss, comm::ReduceOp::kSum));
  SATDAR_RETURN_IF_ERROR(ReduceScalar(g_->data.get(), &loss, comm::ReduceOp::kAvg));
  return loss;
}

template <class B>
absl::Status GradientSyncT<B>::SumRuns(comm::Communicator* group, const Runs& runs, G* grads) {
  if (group == nullptr || runs.empty()) return absl::OkStatus();
  int64_t total = 0;
  for (const auto& run : runs) total += run.second;
  typename B::AllocScope scope(x_);
  packed_.resize(total);  // one all-reduce for all of them
  SATDAR_RETURN_IF_ERROR(scope.status());
  int64_t k = 0;
  for (const auto& [off, len] : runs) {
    SATDAR_RETURN_IF_ERROR(ops::Copy(x_, packed_.data() + k, grads + off, len));
    k += len;
  }
  SATDAR_ASSIGN_OR_RETURN(comm::CollectiveOptions c, Ready());
  SATDAR_RETURN_IF_ERROR(group->AllReduce(packed_.data(), total, core::DTypeOf<G>::value,
                                          comm::ReduceOp::kSum, c)->Wait());
  k = 0;
  for (const auto& [off, len] : runs) {
    SATDAR_RETURN_IF_ERROR(ops::Copy(x_, grads + off, packed_.data() + k, len));
    k += len;
  }
  return absl::OkStatus();
}

template <class B>
absl::Status GradientSyncT<B>::Reduce(G* grads, Vec<G>* shard) {
  constexpr core::DType kDType = core::DTypeOf<G>::value;
  SATDAR_RETURN_IF_ERROR(WaitPending());
  SATDAR_RETURN_IF_ERROR(SumRuns(g_->tp.get(), roles_.tp_partial, grads));
  SATDAR_RETURN_IF_ERROR(SumRuns(g_->pp.get(), roles_.pp_partial, grads));
  const int pp = g_->shape.pp, stage = g_->coord.pp;
  if (roles_.tied_embedding.first >= 0 && (stage == 0 || stage == pp - 1)) {
    const auto [off, len] = roles_.tied_embedding;
    const int peer = stage == 0 ? pp - 1 : 0;
    typename B::AllocScope scope(x_);
    other_.resize(len);
    SATDAR_RETURN_IF_ERROR(scope.status());
    SATDAR_ASSIGN_OR_RETURN(comm::CollectiveOptions c, Ready());
    // Point-to-point sends may not wait on a ready_event (NCCL's do not): the stream first.
    SATDAR_RETURN_IF_ERROR(ops::Synchronize(x_));
    auto sent = g_->pp->Send(grads + off, len, kDType, peer, 7, c);
    SATDAR_RETURN_IF_ERROR(g_->pp->Recv(other_.data(), len, kDType, peer, 7, c)->Wait());
    SATDAR_RETURN_IF_ERROR(sent->Wait());
    // Both stages add in the same order (first stage's part + last stage's part).
    G* mine = grads + off;
    SATDAR_RETURN_IF_ERROR(stage == 0 ? ops::Add(x_, mine, mine, other_.data(), len)
                                      : ops::Add(x_, mine, other_.data(), mine, len));
  }
  if (!parts_.empty()) return ReduceScatterShards(grads, shard);
  if (g_->data && !overlap_) {
    // Expert weights already hold every EP rank's tokens: average over dp only, and divide
    // by ep, as the loss is the mean over all dp x ep replicas.
    for (const auto& [off, len] : roles_.dense) ReduceRange(grads, off, off + len);
    for (const auto& [off, len] : roles_.experts) {
      if (g_->dp) {
        SATDAR_ASSIGN_OR_RETURN(comm::CollectiveOptions c, Ready());
        pending_.push_back(g_->dp->AllReduce(grads + off, len, kDType, comm::ReduceOp::kAvg, c));
      }
    }
    SATDAR_RETURN_IF_ERROR(WaitPending());
    for (const auto& [off, len] : roles_.experts) {
      SATDAR_RETURN_IF_ERROR(ops::Divide(x_, grads + off, len, g_->shape.ep));
    }
  }
  return absl::OkStatus();
}

template <class B>
absl::Status GradientSyncT<B>::ReduceScatterShards(G* grads, Vec<G>* shard) {
  constexpr core::DType kDType = core::DTypeOf<G>::value;
  int64_t total = 0;
  for (const ZeroPartition& p : parts_) total += p.shard;
  typename B::AllocScope scope(x_);
  shard->resize(total);
  SATDAR_RETURN_IF_ERROR(scope.status());
  int64_t at = 0;
  for (const ZeroPartition& p : parts_) {
    // The identity partition reduces the (padded) flat buffer in place of a packed copy.
    const G* from = grads;
    if (!p.identity()) {
      packed_.resize(p.padded());
      SATDAR_RETURN_IF_ERROR(scope.status());
      SATDAR_RETURN_IF_ERROR(ops::Zero(x_, packed_.data(), p.padded()));
      int64_t k = 0;
      for (const auto& [off, len] : p.runs) {
        SATDAR_RETURN_IF_ERROR(ops::Copy(x_, packed_.data() + k, grads + off, len));
        k += len;
      }
      from = packed_.data();
    }
    G* to = shard->data() + at;
    if (p.group != nullptr) {
      SATDAR_ASSIGN_OR_RETURN(comm::CollectiveOptions c, Ready());
      SATDAR_RETURN_IF_ERROR(
          p.group->ReduceScatter(from, to, p.shard, kDType, comm::ReduceOp::kAvg, c)->Wait());
    } else {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, to, from, p.shard));
    }
    if (p.grad_scale != 1.0) SATDAR_RETURN_IF_ERROR(ops::Scale(x_, to, p.shard, p.grad_scale));
    at += p.shard;
  }
  return absl::OkStatus();
}

template <class B>
absl::StatusOr<double> GradientSyncT<B>::SumSquares(const G* values, const Runs& runs) {
  if constexpr (!B::kDevice) {
    double sq = 0;  // one sum, in index order
    for (const auto& [off, len] : runs) {
      for (int64_t i = off; i < off + len; ++i) {
        const double v = static_cast<double>(values[i]);
        sq += v * v;
      }
    }
    return sq;
  } else {
    // One device reduction per run, their sums read back together and added in order.
    typename B::AllocScope scope(x_);
    squares_.resize(std::max<size_t>(runs.size(), 1));
    SATDAR_RETURN_IF_ERROR(scope.status());
    for (size_t r = 0; r < runs.size(); ++r) {
      SATDAR_RETURN_IF_ERROR(
          ops::SumSquares(x_, squares_.data() + r, values + runs[r].first, runs[r].second));
    }
    std::vector<double> host(runs.size());
    SATDAR_RETURN_IF_ERROR(
        ops::Download(x_, host.data(), squares_.data(), static_cast<int64_t>(runs.size())));
    double sq = 0;
    for (double s : host) sq += s;
    return sq;
  }
}

template <class B>
absl::StatusOr<double> GradientSyncT<B>::GlobalNorm(const G* values) {
  // Every element once (replicated copies counted on one rank), in index order, summed over
  // the model pieces (and under ZeRO-1 over the replicas' shards).
  double sq = 0;
  if (parts_.empty()) {
    SATDAR_ASSIGN_OR_RETURN(sq, SumSquares(values, roles_.in_norm));
  }
  int64_t at = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const ZeroPartition& p = parts_[i];
    SATDAR_ASSIGN_OR_RETURN(double part, SumSquares(values + at, counted_shard_[i]));
    at += p.shard;
    SATDAR_RETURN_IF_ERROR(ReduceScalar(p.group, &part, comm::ReduceOp::kSum));
    // A dense partition's sum is the same on every EP rank of the replica: count it once.
    if (!p.dense || g_->coord.ep == 0) sq += part;
  }
  SATDAR_RETURN_IF_ERROR(ReduceScalar(g_->mp.get(), &sq, comm::ReduceOp::kSum));
  return std::sqrt(sq);
}

template class GradientSyncT<model::Cpu<float>>;
template class GradientSyncT<model::Cpu<double>>;
#if defined(SATDAR_WITH_CUDA)
template class GradientSyncT<model::Cuda<float>>;
#endif

}  // namespace satdar::runtime
