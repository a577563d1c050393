// parallel/pipeline.h: the 1F1B pipeline schedule (PipeDream-Flush, as in Megatron-LM), plain
// or interleaved.
//
// Plain (one model chunk per rank): stage s of P runs min(P - s - 1, M) warm-up forwards, then
// alternates one forward and one backward, then drains the remaining backwards.
// Interleaved (--virtual-stages V > 1, Megatron-LM's schedule): rank s holds V chunks, chunk v
// being virtual stage v*P + s of P*V (L / (P*V) layers each); micro-batches go through the
// chunks in groups of P, so the bubble is (P - 1) / (V M) of the step instead of (P - 1) / M,
// at V times the stage boundaries. Rank s runs min((P - s - 1) * 2 + (V - 1) * P, V M)
// warm-up forwards, then one forward and one backward alternately, then the drain.
//
// Each chunk keeps one model instance per micro-batch it can have in flight, all reading the
// same parameters (the chunk's slice of the rank's flat buffer) and adding into the same
// gradients. What crosses a boundary is the model's StageBuffers: the hidden state (or a depth
// history's entries and partial sums, the HC streams, DenseFormer's sources), and V1; backward
// sends their gradients. Messages are tagged by direction and receiving chunk, so each
// (peer, tag) stream is in micro-batch order on both sides.
//
//   PipelineSchedule<float> pipe(pp_comm, {{m0.get(), m1.get()}}, {0});   // one chunk
//   SATDAR_ASSIGN_OR_RETURN(double loss_sum, pipe.Step(params, grads, tokens_of, M, b, t));
#ifndef SATDAR_PARALLEL_PIPELINE_H_
#define SATDAR_PARALLEL_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "comm/communicator.h"

namespace satdar::parallel {

// Model slots one chunk needs: the micro-batches it can have in flight.
int PipelineSlots(int stages, int stage, int chunks, int microbatches);

template <typename T>
class PipelineSchedule {
 public:
  // chunks[v]: chunk v's model instances (PipelineSlots of them); offsets[v]: where chunk v's
  // parameters (and gradients) start in the rank's flat buffers.
  PipelineSchedule(comm::Communicator* pp, std::vector<std::vector<model::Model<T>*>> chunks,
                   std::vector<int64_t> offsets, comm::CollectiveOptions options = {});

  // One optimizer step's forward and backward passes over m micro-batches of (b, t);
  // tokens(mb) gives micro-batch mb's (b, t+1) tokens. Gradients are added into grads with
  // loss scale 1/m. Returns the sum over micro-batches of this rank's Forward values (the
  // losses on the last virtual stage, the auxiliary losses of its layers elsewhere).
  absl::StatusOr<double> Step(const T* params, T* grads,
                              const std::function<const int32_t*(int mb)>& tokens, int m, int b,
                              int t);
  // Forward passes only (validation): the sum of the last virtual stage's cross-entropies (0
  // elsewhere).
  absl::StatusOr<double> ForwardOnly(const T* params,
                                     const std::function<const int32_t*(int mb)>& tokens, int m,
                                     int b, int t);

  // Bytes chunk v sent in the last Step: activations to the next virtual stage, gradients to
  // the previous one.
  int64_t forward_bytes(int chunk) const { return forward_bytes_[chunk]; }
  int64_t backward_bytes(int chunk) const { return backward_bytes_[chunk]; }
  int chunks() const { return static_cast<int>(chunks_.size()); }

 private:
  int Virtual(int chunk) const { return chunk * stages_ + stage_; }
  bool FirstVirtual(int chunk) const { return Virtual(chunk) == 0; }
  bool LastVirtual(int chunk) const { return Virtual(chunk) == stages_ * chunks() - 1; }
  absl::Status Forward(int chunk, int mb, const T* params, const int32_t* tokens, int b, int t,
                       double* value);
  absl::Status Backward(int chunk, int mb, const T* params, T* grads, double loss_scale);
  absl::Status WaitSends(int chunk, int slot);
  absl::Status WaitAllSends();

  comm::Communicator* pp_;
  std::vector<std::vector<model::Model<T>*>> chunks_;
  std::vector<int64_t> offsets_;
  comm::CollectiveOptions options_;
  int stage_, stages_;
  int b_ = 0, t_ = 0;
  // Per chunk and slot: sends still in flight.
  std::vector<std::vector<std::vector<std::unique_ptr<comm::Work>>>> sends_;
  std::vector<int64_t> forward_bytes_, backward_bytes_;
};

}  // namespace satdar::parallel

#endif  // SATDAR_PARALLEL_PIPELINE_H_
