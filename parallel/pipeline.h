// parallel/pipeline.h: the 1F1B pipeline schedule (PipeDream-Flush, as in Megatron-LM), plain
// or interleaved, for model stages on any device.
//
// Plain (one model chunk per rank): stage s of P runs min(P - s - 1, M) warm-up forwards, then
// alternates one forward and one backward, then drains the remaining backwards.
// Interleaved (--virtual-stages V > 1, Megatron-LM's schedule): rank s holds V chunks, chunk v
// being virtual stage v*P + s of P*V (L / (P*V) layers each); micro-batches go through the
// chunks in groups of P, so the bubble is (P - 1) / (V M) of the step instead of (P - 1) / M,
// at V times the stage boundaries. Rank s runs min((P - s - 1) * 2 + (V - 1) * P, V M)
// warm-up forwards, then one forward and one backward alternately, then the drain.
//
// Each chunk keeps one model instance (a PipelineStage) per micro-batch it can have in flight,
// all reading the same parameters and adding into the same gradients; the engines adapt their
// models (runtime/cpu_engine.cc: Model<T> on the CPU; runtime/cuda_engine.cc: DeviceModel on a
// GPU). What crosses a boundary is the model's StageBuffers (model.h): the hidden state (or a
// depth history's entries and partial sums, the HC streams, DenseFormer's sources), and V1;
// backward sends their gradients. The schedule sees them as untyped views, so on a device the
// communicator moves device memory.
//
// Message order. Every rank runs its forwards (and its backwards) in one global order, and the
// messages one rank sends another, activations and gradients interleaved, are received in the
// order they were sent, even with 2 stages, where one pair of ranks carries both kinds both
// ways (pipeline_test checks it for every layout of up to 4 stages, 4 virtual stages and 16
// micro-batches over a communicator that ignores tags, as NCCL's does). Tags (the receiving
// chunk) are there for communicators that use them.
//
// Where the messages travel. On the CPU one communicator carries them all: a Send returns
// before its Recv is posted. NCCL's Send completes only once its Recv is posted, and the calls
// of one communicator run in order on its stream, so a rank's receive can queue behind its own
// send whose receiver is waiting for that very receive (the interleaved schedule hangs so with
// 2 stages and 4 micro-batches). On a device the messages therefore go over PipelineLinks:
// one two-rank communicator per directed link, on which one rank only sends (each Send
// enqueued at once) and the other only receives, in the same order; a rank waits for a send
// only before it overwrites the buffer sent. The boundary tensors of one message are sent (and
// received) as one group.
//
//   PipelineSchedule pipe(pp, {{&slot0, &slot1}});   // one chunk, 2 instances
//   SATDAR_ASSIGN_OR_RETURN(double sum, pipe.Step(tokens_of, M, b, t));
#ifndef SATDAR_PARALLEL_PIPELINE_H_
#define SATDAR_PARALLEL_PIPELINE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "model/model.h"

namespace satdar::parallel {

// A pipeline group's point-to-point traffic as directed links: each a two-rank communicator on
// which the sender (its rank 0) only sends and the receiver (its rank 1) only receives:
// activations to the next stage and from the previous one, gradients to the previous stage
// and from the next one (with 2 stages, four communicators over the same two ranks).
struct PipelineLinks {
  std::unique_ptr<comm::Communicator> to_next, from_prev, to_prev, from_next;
};
// The links of this rank of `pp` (2 or more ranks), split from it: every rank of pp calls it
// (4 Splits, 6 for an odd number of stages). probe: one double in the communicator's memory
// (device memory for a device's), sent once over each new link so that its connection is set
// up here; null sends nothing.
absl::StatusOr<PipelineLinks> MakePipelineLinks(comm::Communicator* pp,
                                                const comm::CollectiveOptions& options,
                                                double* probe);

// Model instances one chunk needs: the micro-batches it can have in flight.
int PipelineSlots(int stages, int stage, int chunks, int microbatches);

// One model instance of a pipeline chunk, as the schedule runs it.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Sizes the instance's boundary buffers for (b, t) micro-batches (an allocation failure is
  // returned); their views stay valid until the next Prepare.
  virtual absl::StatusOr<model::StageViews> Prepare(int b, int t) = 0;
  // A training forward pass over one micro-batch's tokens (b, t+1), once `in` holds what the
  // previous stage sent; its loss counts loss_scale times in the step. Returns what Step adds
  // up: the CPU's models their Forward value, a device's 0 (its loss stays on the device).
  virtual absl::StatusOr<double> Forward(const int32_t* tokens, int b, int t,
                                         double loss_scale) = 0;
  // A validation forward pass. Returns what ForwardOnly adds up: the CPU's models their
  // cross-entropy (0 on a stage without the head), a device's 0.
  virtual absl::StatusOr<double> Evaluate(const int32_t* tokens, int b, int t) = 0;
  // The backward pass of the instance's last Forward, once `dout` holds the next stage's
  // gradients; loss_scale is that Forward's.
  virtual absl::Status Backward(double loss_scale) = 0;
  // Returns once the work the instance enqueued is done, so that its boundary buffers may be
  // sent or received into: a device stream's wait (NCCL's point-to-point neither waits for
  // the compute stream nor is waited on by it); nothing on the CPU.
  virtual absl::Status Synchronize() = 0;
};

class PipelineSchedule {
 public:
  // pp: this rank's pipeline group (rank = stage), carrying every message (a communicator
  // whose Send returns before its Recv is posted: the CPU's). chunks[v]: chunk v's instances
  // (PipelineSlots of them), each outliving the schedule.
  PipelineSchedule(comm::Communicator* pp, std::vector<std::vector<PipelineStage*>> chunks,
                   comm::CollectiveOptions options = {});
  // The same over `links` (MakePipelineLinks of the pipeline group), for NCCL's semantics;
  // host or device memory as the stages' views are.
  PipelineSchedule(PipelineLinks links, int stage, int stages,
                   std::vector<std::vector<PipelineStage*>> chunks,
                   comm::CollectiveOptions options = {});

  // One optimizer step's forward and backward passes over m micro-batches of (b, t);
  // tokens(mb) gives micro-batch mb's (b, t+1) tokens. Losses scale by 1/m. Returns the sum of
  // the stages' Forward values (the CPU's: the losses on the last virtual stage, the auxiliary
  // losses of its layers elsewhere).
  absl::StatusOr<double> Step(const std::function<const int32_t*(int mb)>& tokens, int m, int b,
                              int t);
  // Forward passes only (validation): the sum of the stages' Evaluate values.
  absl::StatusOr<double> ForwardOnly(const std::function<const int32_t*(int mb)>& tokens, int m,
                                     int b, int t);

  // Bytes chunk v sent in the last Step: activations to the next virtual stage, gradients to
  // the previous one.
  int64_t forward_bytes(int chunk) const { return forward_bytes_[chunk]; }
  int64_t backward_bytes(int chunk) const { return backward_bytes_[chunk]; }
  int chunks() const { return static_cast<int>(chunks_.size()); }
  int stages() const { return stages_; }

  // After a failed Step or ForwardOnly: waits for the sends still in flight (each completes,
  // fails or times out), so none reads a buffer after the engine frees it.
  void Abandon();

 private:
  int Virtual(int chunk) const { return chunk * stages_ + stage_; }
  // The instance of `chunk` that runs micro-batch mb, with its boundary views.
  struct Slot {
    PipelineStage* stage;
    model::StageViews* views;
    int slot;
  };
  absl::StatusOr<Slot> Take(int chunk, int mb);
  // Checks the chunks and sizes the per-instance state (both constructors).
  void InitSlots();
  // Where a message goes or comes from: the communicator and the peer's rank in it.
  std::pair<comm::Communicator*, int> Route(bool send, bool forward) const;
  // The options of call k of a message of n calls.
  comm::CollectiveOptions OptionsFor(size_t k, size_t n) const;
  absl::Status Receive(const std::vector<model::BoundaryView>& into, core::DType dtype,
                       bool forward, int chunk, int mb);
  void SendAll(const std::vector<model::BoundaryView>& from, core::DType dtype, bool forward,
               int chunk, int to_chunk, int mb);
  absl::Status Forward(int chunk, int mb, const int32_t* tokens, int b, int t, bool train,
                       double loss_scale, double* value);
  absl::Status Backward(int chunk, int mb, double loss_scale);
  // Waits for the sends of the instance's last forward (activations) or backward (gradients).
  absl::Status WaitSends(int chunk, int slot, bool forward);
  absl::Status WaitAllSends();

  comm::Communicator* pp_;  // null over links
  PipelineLinks links_;
  std::vector<std::vector<PipelineStage*>> chunks_;
  comm::CollectiveOptions options_;
  int stage_, stages_;
  int b_ = 0, t_ = 0;
  // Per chunk and instance: the boundary views of the last Prepare, and sends in flight (of
  // activations [0] and of gradients [1]).
  std::vector<std::vector<model::StageViews>> views_;
  std::vector<std::vector<std::array<std::vector<std::unique_ptr<comm::Work>>, 2>>> sends_;
  std::vector<int64_t> forward_bytes_, backward_bytes_;
};

// The bytes each virtual stage boundary carried in the last Step, in stage order: {activations
// forward, gradients back} for boundaries 0|1, 1|2, ... Gathered over `pp` (the schedule's
// pipeline group; every rank of it calls this).
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> BoundaryBytes(
    const PipelineSchedule& pipe, comm::Communicator* pp, const comm::CollectiveOptions& options);

}  // namespace satdar::parallel

#endif  // SATDAR_PARALLEL_PIPELINE_H_
