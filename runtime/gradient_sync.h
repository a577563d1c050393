// runtime/gradient_sync.h: what happens to one rank's gradients between its backward pass and
// the optimizer, for every dp x tp x pp x ep layout.
//
//   GradientSync<T> sync(table, &groups, config, state.parts(), copts);
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
#ifndef SATDAR_RUNTIME_GRADIENT_SYNC_H_
#define SATDAR_RUNTIME_GRADIENT_SYNC_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/param_roles.h"
#include "model/param_table.h"
#include "comm/communicator.h"
#include "runtime/mesh_groups.h"
#include "runtime/zero_partition.h"

namespace satdar::runtime {

// What one rank's parameters mean for reductions and the gradient norm (model/param_roles.h)
// at its place in `groups`.
using model::ParamRoles;
ParamRoles RolesOf(const model::ParamTable& table, const MeshGroups& groups, bool tied);

// B: the backend of the gradients (model/backend.h): Cpu<float|double> with host
// communicators, or Cuda<float> (fp32 gradients in device memory, whatever the compute type)
// with device communicators (NCCL, or the staged one). The arithmetic between collectives
// (packing runs, the tied embedding's sum, scalings, sums of squares) is core/ops/elementwise
// on x; on CUDA every collective waits on an event recorded on x.stream, so it reads what the
// stream wrote. Scalars (the loss, the norm's partial sums) go through a one-element buffer of
// the backend, since a device communicator reduces device memory.
template <class B>
class GradientSyncT {
 public:
  using G = typename B::Acc;  // the gradients' element type
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // parts non-empty: ZeRO-1 over those partitions (zero_partition.h; the TrainState's).
  // groups: communicators of B's memory; x: where the arithmetic runs (on CUDA with an
  // allocator for the scratch buffers).
  GradientSyncT(const model::ParamTable& table, const MeshGroups* groups,
                const model::ModelConfig& config, const std::vector<ZeroPartition>& parts,
                const comm::CollectiveOptions& options, const typename B::Exec& x = {});
  ~GradientSyncT();

  // Around the last micro-batch's backward pass: start each layer's all-reduce as soon as its
  // gradients are final, then the rest (embedding and layer 0; final norm and head). M is any
  // model with SetLayerGradientsReadyHook (model::Model<T>, model::DeviceModel).
  template <class M>
  void BeginLastBackward(M* model, G* grads) {
    if (!overlap_) return;
    model->SetLayerGradientsReadyHook([this, grads](int layer) {
      ReduceRange(grads, layer_start_[layer], layer_start_[layer + 1]);
    });
  }
  template <class M>
  void EndLastBackward(M* model, G* grads) {
    if (!overlap_) return;
    model->SetLayerGradientsReadyHook(nullptr);
    EndOverlap(grads);
  }

  // The step's loss: each pipeline stage's share summed, the replicas averaged.
  absl::StatusOr<double> ReduceLoss(double loss);
  // Everything after the backward passes; under ZeRO-1 *shard gets this rank's shards of the
  // partitions, back to back (grads is then scratch, padded as TrainState sizes it).
  absl::Status Reduce(G* grads, Vec<G>* shard);
  // The global gradient norm from what Reduce left: grads, or under ZeRO-1 the shards.
  absl::StatusOr<double> GlobalNorm(const G* values);
  // Waits for what is still in flight (a step given up), ignoring its errors.
  void Abandon();

 private:
  struct Marks;  // CUDA: the events collectives wait on; nothing on the CPU

  void ReduceRange(G* grads, int64_t begin, int64_t end);
  void EndOverlap(G* grads);
  // copts_, on CUDA with an event just recorded on x_.stream as its ready_event.
  absl::StatusOr<comm::CollectiveOptions> Ready();
  // Sums the runs of grads over group (nothing without one).
  absl::Status SumRuns(comm::Communicator* group, const Runs& runs, G* grads);
  // *v reduced over group (nothing without one) through scalar_.
  absl::Status ReduceScalar(comm::Communicator* group, double* v, comm::ReduceOp op);
  // The sum of values[i]^2 over the runs, in order.
  absl::StatusOr<double> SumSquares(const G* values, const Runs& runs);
  absl::Status WaitPending();

  absl::Status ReduceScatterShards(G* grads, Vec<G>* shard);

  const MeshGroups* g_;
  const ParamRoles roles_;
  const int64_t n_;
  const std::vector<ZeroPartition> parts_;
  // ZeRO-1: per partition, the runs of its shard (packed indices from this member's first)
  // counted in the norm (roles_.in_norm_zero).
  std::vector<Runs> counted_shard_;
  const comm::CollectiveOptions copts_;
  const typename B::Exec x_;
  const bool overlap_;
  std::vector<int64_t> layer_start_;  // first element of each layer, then the final norm's
  std::vector<std::unique_ptr<comm::Work>> pending_;
  absl::Status hook_status_;  // the first failure inside the layer hook, returned by Reduce
  std::unique_ptr<Marks> marks_;
  Vec<G> packed_, other_;   // scratch: packed runs, the other stage's tied embedding
  Vec<double> scalar_;      // one reduced scalar
  Vec<double> squares_;     // CUDA: a run's sum of squares each
};

template <typename T>
using GradientSync = GradientSyncT<model::Cpu<T>>;

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_GRADIENT_SYNC_H_
