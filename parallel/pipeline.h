// parallel/pipeline.h: the 1F1B pipeline schedule (PipeDream-Flush, as in Megatron-LM).
//
// Stage s of P runs min(P - s - 1, M) warm-up forwards, then alternates one forward and one
// backward, then drains the remaining backwards. Each stage keeps one model instance per
// micro-batch in flight (at most P - s), all reading the same parameters and adding into the
// same gradient buffer. What crosses a boundary is the model's StageBuffers: the hidden state
// (or a depth history's entries and partial sums), and V1; backward sends their gradients.
//
//   PipelineSchedule<float> pipe(pp_comm, {m0.get(), m1.get()});
//   SATDAR_ASSIGN_OR_RETURN(double loss_sum, pipe.Step(params, grads, tokens_of, M, b, t));
#ifndef SATDAR_PARALLEL_PIPELINE_H_
#define SATDAR_PARALLEL_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "comm/communicator.h"

namespace satdar::parallel {

template <typename T>
class PipelineSchedule {
 public:
  // slots: one model per micro-batch this stage can have in flight (min(P - stage, M)).
  PipelineSchedule(comm::Communicator* pp, std::vector<model::Model<T>*> slots,
                   comm::CollectiveOptions options = {});

  // One optimizer step's forward and backward passes over m micro-batches of (b, t);
  // tokens(mb) gives micro-batch mb's (b, t+1) tokens. Gradients are added into grads with
  // loss scale 1/m. Returns the sum over micro-batches of this stage's Forward values (the
  // losses on the last stage, the auxiliary losses of its layers elsewhere).
  absl::StatusOr<double> Step(const T* params, T* grads,
                              const std::function<const int32_t*(int mb)>& tokens, int m, int b,
                              int t);
  // Forward passes only (validation): the sum of the last stage's cross-entropies (0
  // elsewhere).
  absl::StatusOr<double> ForwardOnly(const T* params,
                                     const std::function<const int32_t*(int mb)>& tokens, int m,
                                     int b, int t);

  // Bytes this stage sent in the last Step: activations to the next stage, gradients to the
  // previous one.
  int64_t forward_bytes() const { return forward_bytes_; }
  int64_t backward_bytes() const { return backward_bytes_; }

 private:
  absl::Status Forward(int mb, const T* params, const int32_t* tokens, int b, int t,
                       double* value);
  absl::Status Backward(int mb, const T* params, T* grads, double loss_scale);
  absl::Status WaitSends(int slot);

  comm::Communicator* pp_;
  std::vector<model::Model<T>*> slots_;
  comm::CollectiveOptions options_;
  int stage_, stages_;
  int b_ = 0, t_ = 0;
  std::vector<std::vector<std::unique_ptr<comm::Work>>> sends_;  // per slot, still in flight
  int64_t forward_bytes_ = 0, backward_bytes_ = 0;
};

}  // namespace satdar::parallel

#endif  // SATDAR_PARALLEL_PIPELINE_H_
