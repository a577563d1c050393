#include "worker/gradient_sync.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace satdar::worker {

ParamRoles RolesOf(const model::ParamTable& table, const MeshGroups& g, bool tied) {
  model::RankPlace place;
  place.tp = g.coord.tp;
  place.pp = g.coord.pp;
  place.ep = g.coord.ep;
  place.pipeline = g.shape.pp > 1;
  return model::RolesOf(table, place, tied);
}

template <typename T>
GradientSync<T>::GradientSync(const model::ParamTable& table, const MeshGroups* groups,
                              const model::ModelConfig& config,
                              const std::vector<ZeroPartition>& parts,
                              const comm::CollectiveOptions& options)
    : g_(groups),
      roles_(RolesOf(table, *groups, config.tie_word_embeddings)),
      n_(table.size()),
      parts_(parts),
      copts_(options),
      overlap_(groups->data_size() > 1 && parts.empty() && groups->shape.pp == 1 &&
               groups->shape.ep == 1) {
  if (!parts_.empty()) {
    counted_zero_.assign(n_, false);
    for (const auto& [off, len] : roles_.in_norm_zero) {
      std::fill(counted_zero_.begin() + off, counted_zero_.begin() + off + len, true);
    }
  }
  for (size_t i : table.BlockStarts()) {
    layer_start_.push_back(i < table.specs().size() ? table.specs()[i].offset : n_);
  }
}

template <typename T>
void GradientSync<T>::ReduceRange(T* grads, int64_t begin, int64_t end) {
  pending_.push_back(g_->data->AllReduce(grads + begin, end - begin, core::DTypeOf<T>::value,
                                         comm::ReduceOp::kAvg, copts_));
}

template <typename T>
void GradientSync<T>::BeginLastBackward(model::Model<T>* model, T* grads) {
  if (!overlap_) return;
  model->SetLayerGradientsReadyHook([this, grads](int layer) {
    ReduceRange(grads, layer_start_[layer], layer_start_[layer + 1]);
  });
}

template <typename T>
void GradientSync<T>::EndLastBackward(model::Model<T>* model, T* grads) {
  if (!overlap_) return;
  model->SetLayerGradientsReadyHook(nullptr);
  // What the hook did not cover: embedding, globals and layer 0; final norm and head.
  ReduceRange(grads, 0, layer_start_.size() > 2 ? layer_start_[1] : layer_start_.back());
  ReduceRange(grads, layer_start_.back(), n_);
}

template <typename T>
absl::Status GradientSync<T>::WaitPending() {
  absl::Status first;
  for (auto& w : pending_) {
    absl::Status s = w->Wait();
    if (first.ok()) first = s;
  }
  pending_.clear();
  return first;
}

template <typename T>
absl::StatusOr<double> GradientSync<T>::ReduceLoss(double loss) {
  if (g_->pp) {
    SATDAR_RETURN_IF_ERROR(
        g_->pp->AllReduce(&loss, 1, core::DType::kF64, comm::ReduceOp::kSum, copts_)->Wait());
  }
  if (g_->data) {
    SATDAR_RETURN_IF_ERROR(
        g_->data->AllReduce(&loss, 1, core::DType::kF64, comm::ReduceOp::kAvg, copts_)->Wait());
  }
  return loss;
}

template <typename T>
absl::Status GradientSync<T>::SumRuns(comm::Communicator* group, const Runs& runs, T* grads) {
  if (group == nullptr || runs.empty()) return absl::OkStatus();
  std::vector<T> packed;  // one all-reduce for all of them
  for (const auto& [off, len] : runs) packed.insert(packed.end(), grads + off, grads + off + len);
  SATDAR_RETURN_IF_ERROR(group->AllReduce(packed.data(), packed.size(), core::DTypeOf<T>::value,
                                          comm::ReduceOp::kSum, copts_)->Wait());
  size_t k = 0;
  for (const auto& [off, len] : runs) {
    std::copy(packed.begin() + k, packed.begin() + k + len, grads + off);
    k += len;
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GradientSync<T>::Reduce(T* grads, std::vector<T>* shard) {
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  SATDAR_RETURN_IF_ERROR(WaitPending());
  SATDAR_RETURN_IF_ERROR(SumRuns(g_->tp.get(), roles_.tp_partial, grads));
  SATDAR_RETURN_IF_ERROR(SumRuns(g_->pp.get(), roles_.pp_partial, grads));
  const int pp = g_->shape.pp, stage = g_->coord.pp;
  if (roles_.tied_embedding.first >= 0 && (stage == 0 || stage == pp - 1)) {
    const auto [off, len] = roles_.tied_embedding;
    const int peer = stage == 0 ? pp - 1 : 0;
    std::vector<T> other(len);
    auto sent = g_->pp->Send(grads + off, len, kDType, peer, 7, copts_);
    SATDAR_RETURN_IF_ERROR(g_->pp->Recv(other.data(), len, kDType, peer, 7, copts_)->Wait());
    SATDAR_RETURN_IF_ERROR(sent->Wait());
    // Both stages add in the same order (first stage's part + last stage's part).
    T* mine = grads + off;
    for (int64_t i = 0; i < len; ++i) mine[i] = stage == 0 ? mine[i] + other[i] : other[i] + mine[i];
  }
  if (!parts_.empty()) return ReduceScatterShards(grads, shard);
  if (g_->data && !overlap_) {
    // Expert weights already hold every EP rank's tokens: average over dp only, and divide
    // by ep, as the loss is the mean over all dp x ep replicas.
    for (const auto& [off, len] : roles_.dense) ReduceRange(grads, off, off + len);
    for (const auto& [off, len] : roles_.experts) {
      if (g_->dp) {
        pending_.push_back(g_->dp->AllReduce(grads + off, len, kDType, comm::ReduceOp::kAvg,
                                             copts_));
      }
    }
    SATDAR_RETURN_IF_ERROR(WaitPending());
    for (const auto& [off, len] : roles_.experts) {
      for (int64_t i = 0; i < len; ++i) grads[off + i] /= static_cast<T>(g_->shape.ep);
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GradientSync<T>::ReduceScatterShards(T* grads, std::vector<T>* shard) {
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  int64_t total = 0;
  for (const ZeroPartition& p : parts_) total += p.shard;
  shard->resize(total);
  std::vector<T> packed;
  int64_t at = 0;
  for (const ZeroPartition& p : parts_) {
    // The identity partition reduces the (padded) flat buffer in place of a packed copy.
    const T* from = grads;
    if (!p.identity()) {
      packed.assign(p.padded(), T(0));
      p.Pack(grads, packed.data());
      from = packed.data();
    }
    T* to = shard->data() + at;
    if (p.group != nullptr) {
      SATDAR_RETURN_IF_ERROR(p.group->ReduceScatter(from, to, p.shard, kDType,
                                                    comm::ReduceOp::kAvg, copts_)->Wait());
    } else {
      std::copy(from, from + p.shard, to);
    }
    if (p.grad_scale != 1.0) {
      for (int64_t i = 0; i < p.shard; ++i) to[i] *= static_cast<T>(p.grad_scale);
    }
    at += p.shard;
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<double> GradientSync<T>::GlobalNorm(const T* values) {
  // Every element once (replicated copies counted on one rank), in index order, summed over
  // the model pieces (and under ZeRO-1 over the replicas' shards).
  double sq = 0;
  if (parts_.empty()) {
    for (const auto& [off, len] : roles_.in_norm) {
      for (int64_t i = off; i < off + len; ++i) {
        const double v = static_cast<double>(values[i]);
        sq += v * v;
      }
    }
  }
  int64_t at = 0;
  for (const ZeroPartition& p : parts_) {
    double part = 0;
    p.ForOwned([&](int64_t k, int64_t flat) {
      if (!counted_zero_[flat]) return;
      const double v = static_cast<double>(values[at + k]);
      part += v * v;
    });
    at += p.shard;
    if (p.group != nullptr) {
      SATDAR_RETURN_IF_ERROR(
          p.group->AllReduce(&part, 1, core::DType::kF64, comm::ReduceOp::kSum, copts_)->Wait());
    }
    // A dense partition's sum is the same on every EP rank of the replica: count it once.
    if (!p.dense || g_->coord.ep == 0) sq += part;
  }
  if (g_->mp) {
    SATDAR_RETURN_IF_ERROR(
        g_->mp->AllReduce(&sq, 1, core::DType::kF64, comm::ReduceOp::kSum, copts_)->Wait());
  }
  return std::sqrt(sq);
}

template class GradientSync<float>;
template class GradientSync<double>;

}  // namespace satdar::worker
