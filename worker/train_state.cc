#include "worker/train_state.h"

#include <algorithm>

#include "core/check.h"
#include "core/ops/adamw.h"

namespace satdar::worker {

template <typename T>
TrainState<T>::TrainState(const model::ParamTable& table, std::vector<ZeroPartition> parts,
                          uint64_t seed)
    : n_(table.size()),
      parts_(std::move(parts)),
      params_(parts_.size() == 1 && parts_[0].identity() ? std::max(n_, parts_[0].padded()) : n_,
              T(0)),
      grads_(params_.size(), T(0)),
      exp_avg_(parts_.empty() ? n_ : 0, T(0)),
      exp_avg_sq_(parts_.empty() ? n_ : 0, T(0)) {
  for (const ZeroPartition& p : parts_) {
    m_shard_.emplace_back(p.shard, T(0));
    v_shard_.emplace_back(p.shard, T(0));
  }
  table.Initialize(params_.data(), seed);
}

template <typename T>
absl::StatusOr<CheckpointInfo> TrainState<T>::Load(const std::string& path,
                                                   const std::string& config_json,
                                                   bool weights_only,
                                                   const model::ParamTable& table) {
  if (zero()) {
    exp_avg_.assign(n_, T(0));
    exp_avg_sq_.assign(n_, T(0));
  }
  OptimizerBuffers<T> into = buffers();
  if (weights_only) into.exp_avg = into.exp_avg_sq = nullptr;
  SATDAR_ASSIGN_OR_RETURN(CheckpointInfo info, LoadCheckpoint<T>(path, config_json, table, into));
  for (size_t q = 0; q < parts_.size(); ++q) {  // keep this rank's shards of the moments
    parts_[q].ForOwned([&](int64_t k, int64_t flat) {
      m_shard_[q][k] = exp_avg_[flat];
      v_shard_[q][k] = exp_avg_sq_[flat];
    });
  }
  ReleaseMoments();
  return info;
}

template <typename T>
absl::Status TrainState<T>::GatherMoments(const comm::CollectiveOptions& o) {
  if (!zero()) return absl::OkStatus();
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  exp_avg_.assign(n_, T(0));
  exp_avg_sq_.assign(n_, T(0));
  for (size_t q = 0; q < parts_.size(); ++q) {
    const ZeroPartition& p = parts_[q];
    std::vector<T> packed(p.padded());
    for (auto [shard, whole] : {std::pair{&m_shard_[q], &exp_avg_}, {&v_shard_[q], &exp_avg_sq_}}) {
      if (p.group != nullptr) {
        SATDAR_RETURN_IF_ERROR(
            p.group->AllGather(shard->data(), packed.data(), p.shard, kDType, o)->Wait());
        p.Unpack(packed.data(), whole->data());
      } else {
        p.Unpack(shard->data(), whole->data());
      }
    }
  }
  return absl::OkStatus();
}

template <typename T>
void TrainState<T>::ReleaseMoments() {
  if (!zero()) return;
  exp_avg_.clear();
  exp_avg_.shrink_to_fit();
  exp_avg_sq_.clear();
  exp_avg_sq_.shrink_to_fit();
}

template <typename T>
absl::Status TrainState<T>::Update(const core::AdamWParams& hp, const std::vector<T>& shard,
                                   core::ThreadPool* pool, const comm::CollectiveOptions& o) {
  if (!zero()) {
    core::cpu::AdamWUpdate(params_.data(), grads_.data(), exp_avg_.data(), exp_avg_sq_.data(), n_,
                           hp, pool);
    return absl::OkStatus();
  }
  // Update this rank's shard of each partition, then its group gathers the partition.
  int64_t at = 0;
  for (size_t q = 0; q < parts_.size(); ++q) {
    const ZeroPartition& p = parts_[q];
    std::vector<T> mine(p.shard, T(0));  // the padding past the partition's end stays 0
    p.ForOwned([&](int64_t k, int64_t flat) { mine[k] = params_[flat]; });
    core::cpu::AdamWUpdate(mine.data(), shard.data() + at, m_shard_[q].data(), v_shard_[q].data(),
                           p.shard, hp, pool);
    at += p.shard;
    if (p.group == nullptr) {
      p.Unpack(mine.data(), params_.data());
      continue;
    }
    std::vector<T> packed(p.identity() ? 0 : p.padded());
    T* into = p.identity() ? params_.data() : packed.data();  // params_ is padded() long
    SATDAR_RETURN_IF_ERROR(
        p.group->AllGather(mine.data(), into, p.shard, core::DTypeOf<T>::value, o)->Wait());
    if (!p.identity()) p.Unpack(packed.data(), params_.data());
  }
  return absl::OkStatus();
}

template class TrainState<float>;
template class TrainState<double>;

}  // namespace satdar::worker
