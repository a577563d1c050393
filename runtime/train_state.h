// runtime/train_state.h: one rank's training state: the flat parameter and gradient buffers
// carved by its parameter table, and the AdamW moments (under ZeRO-1, only this rank's shard
// of each partition, zero_partition.h: the whole buffer over the data-parallel replicas, or
// with expert parallelism the dense weights over the dp x ep replicas and the experts over
// the dp replicas).
//
//   TrainState<T> state(table, ZeroPartitions(...), seed);   // {}: no ZeRO; Cpu<T>'s
//   ... backward into state.grads(), reduce-scatter into the shard (gradient_sync.h) ...
//   SATDAR_RETURN_IF_ERROR(state.Update(hp, shard, &pool, copts));
//
// Checkpoints hold the full moments whatever the layout: under ZeRO-1 they are gathered from
// the replicas for writing and sliced again when loading.
#ifndef SATDAR_RUNTIME_TRAIN_STATE_H_
#define SATDAR_RUNTIME_TRAIN_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ops/adamw.h"
#include "core/ops/elementwise.h"
#include "model/backend.h"
#include "core/thread_pool.h"
#include "model/param_table.h"
#include "comm/communicator.h"
#include "runtime/checkpoint.h"
#include "runtime/zero_partition.h"

namespace satdar::runtime {

// B: model/backend.h's Cpu<float|double>, or Cuda<float> (fp32 master weights, gradients and
// moments in device memory, with host copies only while a checkpoint is read or written).
template <class B>
class TrainStateT {
 public:
  using G = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // parts: the ZeRO-1 partitions, or empty for replicated moments. x: where the buffers live
  // (on CUDA with an allocator); a failed device allocation is status().
  TrainStateT(const model::ParamTable& table, std::vector<ZeroPartition> parts, uint64_t seed,
              const typename B::Exec& x = {});

  absl::Status status() const { return status_; }
  G* params() { return params_.data(); }
  G* grads() { return grads_.data(); }
  // The gradients, zeroed (on CUDA enqueued on x's stream).
  absl::Status ZeroGrads() {
    return core::ops::Zero(x_, grads_.data(), static_cast<int64_t>(grads_.size()));
  }
  bool zero() const { return !parts_.empty(); }
  const std::vector<ZeroPartition>& parts() const { return parts_; }

  // Loads a checkpoint into the parameters and (this rank's shards of) the moments.
  // weights_only: the moments stay zero (fine-tuning from another run's weights).
  absl::StatusOr<CheckpointInfo> Load(const std::string& path, const std::string& config_json,
                                      bool weights_only,
                                      const model::ParamTable& table);
  // The host buffers a checkpoint writes; first GatherMoments (every replica takes part under
  // ZeRO-1; on CUDA it also reads the parameters back), and ReleaseMoments after writing.
  OptimizerBuffers<G> buffers();
  absl::Status GatherMoments(const comm::CollectiveOptions& o);
  void ReleaseMoments();

  // AdamW over the whole buffer, or under ZeRO-1 over this rank's shards (their gradients in
  // `shard`, the partitions' shards back to back) followed by an all-gather of each
  // partition's parameters over its group. pool: the CPU's threads (unused on CUDA).
  absl::Status Update(const core::AdamWParams& hp, const Vec<G>& shard, core::ThreadPool* pool,
                      const comm::CollectiveOptions& o);

 private:
  const int64_t n_;
  const std::vector<ZeroPartition> parts_;
  const typename B::Exec x_;
  absl::Status status_;
  Vec<G> params_, grads_;
  Vec<G> exp_avg_, exp_avg_sq_;  // whole (without ZeRO-1); on the CPU also gathered for a file
  std::vector<Vec<G>> m_shard_, v_shard_;  // ZeRO-1: this rank's shard per partition
  // CUDA: host copies while a checkpoint is read or written (the CPU's buffers are host ones).
  std::vector<G> host_params_, host_m_, host_v_;
  // CUDA, ZeRO-1: per partition, its owned elements as runs (shard index, flat index, length),
  // for the device copies between the flat buffer and the shard.
  struct OwnedRun {
    int64_t k, flat, len;
  };
  std::vector<std::vector<OwnedRun>> owned_;
};

template <typename T>
using TrainState = TrainStateT<model::Cpu<T>>;

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_TRAIN_STATE_H_
