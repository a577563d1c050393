// worker/train_state.h: one rank's training state: the flat parameter and gradient buffers
// carved by its parameter table, and the AdamW moments (under ZeRO-1, only this replica's
// 1/replicas slice of them: the flat buffers are padded to a multiple of the replicas and
// replica r owns [r * shard_len, (r + 1) * shard_len)).
//
//   TrainState<T> state(table, replicas, replica, zero, seed);
//   ... backward into state.grads() ...
//   SATDAR_RETURN_IF_ERROR(state.Update(hp, shard, data_group, &pool, copts));
//
// Checkpoints hold the full moments whatever the layout: under ZeRO-1 they are gathered from
// the replicas for writing and sliced again when loading.
#ifndef SATDAR_WORKER_TRAIN_STATE_H_
#define SATDAR_WORKER_TRAIN_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ops/adamw.h"
#include "core/thread_pool.h"
#include "model/param_table.h"
#include "comm/communicator.h"
#include "worker/checkpoint.h"

namespace satdar::worker {

template <typename T>
class TrainState {
 public:
  TrainState(const model::ParamTable& table, int replicas, int replica, bool zero, uint64_t seed);

  T* params() { return params_.data(); }
  T* grads() { return grads_.data(); }
  void ZeroGrads() { std::fill(grads_.begin(), grads_.end(), T(0)); }
  bool zero() const { return zero_; }
  int64_t shard_len() const { return zero_ ? shard_len_ : 0; }  // 0 without ZeRO-1
  int64_t lo() const { return lo_; }  // the first element this replica updates

  // Loads a checkpoint into the parameters and (this replica's slice of) the moments.
  absl::StatusOr<CheckpointInfo> Load(const std::string& path, const std::string& config_json,
                                      const model::ParamTable& table);
  // The buffers a checkpoint writes; under ZeRO-1 first GatherMoments (every replica takes
  // part), and ReleaseMoments after writing.
  OptimizerBuffers<T> buffers() { return {&params_, &exp_avg_, &exp_avg_sq_}; }
  absl::Status GatherMoments(comm::Communicator* data, const comm::CollectiveOptions& o);
  void ReleaseMoments();

  // AdamW over the whole buffer, or under ZeRO-1 over this replica's slice (gradients in
  // `shard`) followed by an all-gather of the parameters over the data group.
  absl::Status Update(const core::AdamWParams& hp, const std::vector<T>& shard,
                      comm::Communicator* data, core::ThreadPool* pool,
                      const comm::CollectiveOptions& o);

 private:
  const int64_t n_;
  const bool zero_;
  const int64_t shard_len_, padded_, lo_;
  std::vector<T> params_, grads_;
  std::vector<T> exp_avg_, exp_avg_sq_;  // whole (without ZeRO-1), or gathered for a checkpoint
  std::vector<T> m_shard_, v_shard_;     // ZeRO-1: this replica's slice
};

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_TRAIN_STATE_H_
