// model/sharding.h: which piece of a model this rank holds in the dp x tp x pp x ep mesh.
//
//   Sharding s;                        // one rank: the whole model
//   s.tp = tp_comm; s.tp_rank = 1; s.tp_size = 2;   // Megatron tensor parallelism
//   s.pp_rank = 0; s.pp_size = 2;      // layers [0, L/2) plus the embedding
//   s.ep = ep_comm; ...                // experts [ep_rank*E/ep, (ep_rank+1)*E/ep)
//
// Tensor parallelism (tp): attention heads and KV groups, SATFormer's gate rows (one per KV
// head) and V1's heads, the SwiGLU intermediate dimension and the vocabulary are split into
// tp contiguous pieces; each block all-reduces its attention and MLP outputs (forward) and its
// input gradients (backward). Everything of width C (norms, the residual topologies' depth
// retrievals and mixes, the MoE router and experts) is replicated and computed redundantly.
// Pipeline parallelism (pp): stage s holds layers [s*L/pp, (s+1)*L/pp); the first also the
// embedding, the last the final norm and head (both, with tied embeddings). Expert
// parallelism (ep): the routed experts of every MoE layer are split into ep contiguous
// ranges; tokens travel to their experts and back by all-to-all.
// Sequence parallelism (Megatron-LM's, with tp > 1): everything of width C between the blocks'
// TP regions (the residual topology's state and retrievals, the pre-norms, the final norm) is
// split along the B*T token rows instead of replicated: TP rank r holds rows
// [r*B*T/tp, (r+1)*B*T/tp). Each branch all-gathers its normed input before the
// column-parallel projections and reduce-scatters its row-parallel output (all-gather /
// reduce-scatter instead of all-reduce); the embedding reduce-scatters, the head all-gathers.
// The replicated parameters of those regions then get partial gradients, summed over TP.
// Models reach the other ranks only through these communicators (comm/communicator.h).
#ifndef SATDAR_MODEL_SHARDING_H_
#define SATDAR_MODEL_SHARDING_H_

#include <memory>
#include <utility>

#include <vector>

#include "absl/status/status.h"
#include "model/config.h"
#include "model/layout_check.h"
#include "comm/communicator.h"

struct CUstream_st;  // cudaStream_t

namespace satdar::model {

// Collectives inside Forward/Backward cannot return a Status: the first failure (a dead peer,
// a timeout) is recorded here, later collectives are skipped, and the trainer checks it after
// every pass. Without a sink a failure aborts with its message.
class CommErrors {
 public:
  void Record(absl::Status s) {
    if (status_.ok()) status_ = std::move(s);
  }
  bool failed() const { return !status_.ok(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

struct Sharding {
  comm::Communicator* tp = nullptr;  // null when tp_size == 1
  int tp_rank = 0, tp_size = 1;
  comm::Communicator* ep = nullptr;  // null when ep_size == 1
  int ep_rank = 0, ep_size = 1;
  int pp_rank = 0, pp_size = 1;
  // The embedding and head are padded to PaddedVocab(vocab_size, tp_size, vocab_multiple)
  // rows (layout_check.h); each TP rank holds an equal slice of the padded rows.
  int vocab_multiple = 1;
  bool sequence_parallel = false;  // with tp_size > 1; B*T divisible by tp_size
  // Not a piece of the model but how this rank runs it: the activations it keeps.
  Recompute recompute = Recompute::kNone;
  CommErrors* errors = nullptr;
  // Every collective of the model (TP all-reduces, EP all-to-alls) runs with these: a peer
  // that does not answer within the run's --comm-timeout fails the step.
  comm::CollectiveOptions collective;
  // A device model's: its buffers are written by work enqueued on `stream`, so each TP
  // collective first records an event there for the communicator to wait on (CUDA builds).
  bool on_device = false;
  CUstream_st* stream = nullptr;  // nullptr: the legacy default stream

  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp_size - 1; }
  // Layers [first_layer, end_layer) of this pipeline stage.
  int first_layer(const ModelConfig& c) const { return pp_rank * (c.num_hidden_layers / pp_size); }
  int end_layer(const ModelConfig& c) const { return first_layer(c) + c.num_hidden_layers / pp_size; }
  bool OwnsLayer(const ModelConfig& c, int i) const {
    return i >= first_layer(c) && i < end_layer(c);
  }
  // This rank's slice [first, first + count) of `total` units split tp ways.
  int TpCount(int total) const { return total / tp_size; }
  int TpFirst(int total) const { return tp_rank * (total / tp_size); }
  // Token rows of a (B*T, C) residual-stream tensor this rank holds, of `rows`.
  int StreamRows(int rows) const { return sequence_parallel ? rows / tp_size : rows; }
  int PaddedVocab(const ModelConfig& c) const {
    return model::PaddedVocab(c.vocab_size, tp_size, vocab_multiple);
  }
};

// Runs a collective of the model to completion; false (and the error recorded) when it or an
// earlier one failed.
bool Collective(const Sharding& s, std::unique_ptr<comm::Work> work);
// In-place sum (or max) over the tensor-parallel group; nothing when tp_size == 1.
template <typename T>
void TpAllReduce(const Sharding& s, T* data, size_t n,
                 comm::ReduceOp op = comm::ReduceOp::kSum);
// Sequence parallelism: full (tp x n elements, rank order) <- every rank's local (n); and
// local (n) <- this rank's slice of the sum over TP of full (tp x n). Copies when tp_size == 1.
template <typename T>
void TpAllGather(const Sharding& s, const T* local, T* full, size_t n);
template <typename T>
void TpReduceScatter(const Sharding& s, const T* full, T* local, size_t n);
// Expert parallelism's exchange: in's send_counts[q] elements to EP rank q, out's
// recv_counts[q] from rank q (AllToAllV over s.ep, waiting on s.stream on a device).
template <typename T>
void EpAllToAllV(const Sharding& s, const T* in, const std::vector<size_t>& send_counts, T* out,
                 const std::vector<size_t>& recv_counts);


}  // namespace satdar::model

#endif  // SATDAR_MODEL_SHARDING_H_
