// worker/gradient_sync.h: what happens to one rank's gradients between its backward pass and
// the optimizer, for every dp x tp x pp x ep layout.
//
//   GradientSync<T> sync(table, &groups, config, state.zero_shard_len(), copts);
//   sync.BeginLastBackward(model, grads);       // overlapping all-reduces per layer, if it can
//   model->Backward(...);
//   sync.EndLastBackward(grads);
//   SATDAR_RETURN_IF_ERROR(sync.Reduce(grads, &shard));   // TP, tied embedding, replicas
//   SATDAR_ASSIGN_OR_RETURN(double norm, sync.GlobalNorm(zero ? shard : grads, lo));
//
// The parts, in order: the TP partial sums (q/k norms, ResFormer lambdas: one all-reduce for
// all of them), the pipeline partial sums (ResFormer learnable_plus's scale and logits, held
// by every stage: one all-reduce over the stages), the tied embedding's two pipeline copies (added in the same order on both end
// stages), the average over the data-parallel replicas (expert weights over dp only, divided by
// ep; under ZeRO-1 a reduce-scatter into this replica's slice), then the global norm, each
// element counted once across the model pieces. Without pipeline or expert parallelism the
// replicas' all-reduce overlaps the backward pass: layer i's slice of the flat buffer is
// all-reduced as soon as the backward pass is done with it. Every sum is in a fixed order, so
// every layout gets the single-rank result up to that order (bit-identical per layout).
#ifndef SATDAR_WORKER_GRADIENT_SYNC_H_
#define SATDAR_WORKER_GRADIENT_SYNC_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/model.h"
#include "model/param_roles.h"
#include "model/param_table.h"
#include "comm/communicator.h"
#include "worker/mesh_groups.h"
#include "worker/zero_partition.h"

namespace satdar::worker {

// What one rank's parameters mean for reductions and the gradient norm (model/param_roles.h)
// at its place in `groups`.
using model::ParamRoles;
ParamRoles RolesOf(const model::ParamTable& table, const MeshGroups& groups, bool tied);

template <typename T>
class GradientSync {
 public:
  // parts non-empty: ZeRO-1 over those partitions (zero_partition.h; the TrainState's).
  GradientSync(const model::ParamTable& table, const MeshGroups* groups,
               const model::ModelConfig& config, const std::vector<ZeroPartition>& parts,
               const comm::CollectiveOptions& options);

  // Around the last micro-batch's backward pass: start each layer's all-reduce as soon as its
  // gradients are final, then the rest (embedding and layer 0; final norm and head).
  void BeginLastBackward(model::Model<T>* model, T* grads);
  void EndLastBackward(model::Model<T>* model, T* grads);

  // The step's loss: each pipeline stage's share summed, the replicas averaged.
  absl::StatusOr<double> ReduceLoss(double loss);
  // Everything after the backward passes; under ZeRO-1 *shard gets this rank's shards of the
  // partitions, back to back (grads is then scratch, padded as TrainState sizes it).
  absl::Status Reduce(T* grads, std::vector<T>* shard);
  // The global gradient norm from what Reduce left: grads, or under ZeRO-1 the shards.
  absl::StatusOr<double> GlobalNorm(const T* values);

 private:
  void ReduceRange(T* grads, int64_t begin, int64_t end);
  // Sums the runs of grads over group (nothing without one).
  absl::Status SumRuns(comm::Communicator* group, const Runs& runs, T* grads);
  absl::Status WaitPending();

  absl::Status ReduceScatterShards(T* grads, std::vector<T>* shard);

  const MeshGroups* g_;
  const ParamRoles roles_;
  const int64_t n_;
  const std::vector<ZeroPartition> parts_;
  std::vector<bool> counted_zero_;  // ZeRO-1: flat element -> in roles_.in_norm_zero
  const comm::CollectiveOptions copts_;
  const bool overlap_;
  std::vector<int64_t> layer_start_;  // first element of each layer, then the final norm's
  std::vector<std::unique_ptr<comm::Work>> pending_;
};

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_GRADIENT_SYNC_H_
