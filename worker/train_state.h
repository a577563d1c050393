// worker/train_state.h: one rank's training state: the flat parameter and gradient buffers
// carved by its parameter table, and the AdamW moments (under ZeRO-1, only this rank's shard
// of each partition, zero_partition.h: the whole buffer over the data-parallel replicas, or
// with expert parallelism the dense weights over the dp x ep replicas and the experts over
// the dp replicas).
//
//   TrainState<T> state(table, ZeroPartitions(...), seed);   // {}: no ZeRO
//   ... backward into state.grads(), reduce-scatter into the shard (gradient_sync.h) ...
//   SATDAR_RETURN_IF_ERROR(state.Update(hp, shard, &pool, copts));
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
#include "worker/zero_partition.h"

namespace satdar::worker {

template <typename T>
class TrainState {
 public:
  // parts: the ZeRO-1 partitions, or empty for replicated moments.
  TrainState(const model::ParamTable& table, std::vector<ZeroPartition> parts, uint64_t seed);

  T* params() { return params_.data(); }
  T* grads() { return grads_.data(); }
  void ZeroGrads() { std::fill(grads_.begin(), grads_.end(), T(0)); }
  bool zero() const { return !parts_.empty(); }
  const std::vector<ZeroPartition>& parts() const { return parts_; }

  // Loads a checkpoint into the parameters and (this rank's shards of) the moments.
  // weights_only: the moments stay zero (fine-tuning from another run's weights).
  absl::StatusOr<CheckpointInfo> Load(const std::string& path, const std::string& config_json,
                                      bool weights_only,
                                      const model::ParamTable& table);
  // The buffers a checkpoint writes; under ZeRO-1 first GatherMoments (every replica takes
  // part), and ReleaseMoments after writing.
  OptimizerBuffers<T> buffers() { return {&params_, &exp_avg_, &exp_avg_sq_}; }
  absl::Status GatherMoments(const comm::CollectiveOptions& o);
  void ReleaseMoments();

  // AdamW over the whole buffer, or under ZeRO-1 over this rank's shards (their gradients in
  // `shard`, the partitions' shards back to back) followed by an all-gather of each
  // partition's parameters over its group.
  absl::Status Update(const core::AdamWParams& hp, const std::vector<T>& shard,
                      core::ThreadPool* pool, const comm::CollectiveOptions& o);

 private:
  const int64_t n_;
  const std::vector<ZeroPartition> parts_;
  std::vector<T> params_, grads_;
  std::vector<T> exp_avg_, exp_avg_sq_;  // whole (without ZeRO-1), or gathered for a checkpoint
  std::vector<std::vector<T>> m_shard_, v_shard_;  // ZeRO-1: this rank's shard per partition
};

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_TRAIN_STATE_H_
