#include "worker/train_state.h"

#include <algorithm>

#include "core/check.h"
#include "core/ops/adamw.h"

namespace satdar::worker {

template <typename T>
TrainState<T>::TrainState(const model::ParamTable& table, int replicas, int replica, bool zero,
                          uint64_t seed)
    : n_(table.size()),
      zero_(zero && replicas > 1),
      shard_len_(zero_ ? (n_ + replicas - 1) / replicas : n_),
      padded_(zero_ ? shard_len_ * replicas : n_),
      lo_(zero_ ? replica * shard_len_ : 0),
      params_(padded_, T(0)),
      grads_(padded_, T(0)),
      exp_avg_(zero_ ? 0 : n_, T(0)),
      exp_avg_sq_(zero_ ? 0 : n_, T(0)),
      m_shard_(zero_ ? shard_len_ : 0, T(0)),
      v_shard_(zero_ ? shard_len_ : 0, T(0)) {
  table.Initialize(params_.data(), seed);
}

template <typename T>
absl::StatusOr<CheckpointInfo> TrainState<T>::Load(const std::string& path,
                                                   const std::string& config_json,
                                                   const model::ParamTable& table) {
  if (zero_) {
    exp_avg_.assign(padded_, T(0));
    exp_avg_sq_.assign(padded_, T(0));
  }
  SATDAR_ASSIGN_OR_RETURN(CheckpointInfo info, LoadCheckpoint<T>(path, config_json, table, buffers()));
  if (zero_) {  // keep this replica's slice of the moments
    std::copy(exp_avg_.begin() + lo_, exp_avg_.begin() + lo_ + shard_len_, m_shard_.begin());
    std::copy(exp_avg_sq_.begin() + lo_, exp_avg_sq_.begin() + lo_ + shard_len_, v_shard_.begin());
    ReleaseMoments();
  }
  return info;
}

template <typename T>
absl::Status TrainState<T>::GatherMoments(comm::Communicator* data,
                                          const comm::CollectiveOptions& o) {
  if (!zero_) return absl::OkStatus();
  constexpr core::DType kDType = core::DTypeOf<T>::value;
  exp_avg_.assign(padded_, T(0));
  exp_avg_sq_.assign(padded_, T(0));
  SATDAR_RETURN_IF_ERROR(data->AllGather(m_shard_.data(), exp_avg_.data(), shard_len_, kDType, o)->Wait());
  return data->AllGather(v_shard_.data(), exp_avg_sq_.data(), shard_len_, kDType, o)->Wait();
}

template <typename T>
void TrainState<T>::ReleaseMoments() {
  if (!zero_) return;
  exp_avg_.clear();
  exp_avg_.shrink_to_fit();
  exp_avg_sq_.clear();
  exp_avg_sq_.shrink_to_fit();
}

template <typename T>
absl::Status TrainState<T>::Update(const core::AdamWParams& hp, const std::vector<T>& shard,
                                   comm::Communicator* data, core::ThreadPool* pool,
                                   const comm::CollectiveOptions& o) {
  if (!zero_) {
    core::cpu::AdamWUpdate(params_.data(), grads_.data(), exp_avg_.data(), exp_avg_sq_.data(), n_,
                           hp, pool);
    return absl::OkStatus();
  }
  // Update this replica's slice, then every replica gathers the whole parameter buffer.
  core::cpu::AdamWUpdate(params_.data() + lo_, shard.data(), m_shard_.data(), v_shard_.data(),
                         shard_len_, hp, pool);
  std::vector<T> mine(params_.begin() + lo_, params_.begin() + lo_ + shard_len_);
  return data->AllGather(mine.data(), params_.data(), shard_len_, core::DTypeOf<T>::value, o)->Wait();
}

template class TrainState<float>;
template class TrainState<double>;

}  // namespace satdar::worker
