#include "model/cost_model.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/model.h"
#include "model/param_roles.h"

namespace satdar::model {

namespace {

constexpr int64_t kScalar = 8;  // a loss, a norm: one f64

// What rank 0's parameter table says for the reductions (param_roles.h, as the trainer's).
RankParameters ParametersOf(const ParamTable& table, bool tied, bool pipeline) {
  RankPlace rank0;
  rank0.pipeline = pipeline;
  const ParamRoles roles = RolesOf(table, rank0, tied);
  RankParameters r;
  r.total = table.size();
  r.tp_partial = RunElements(roles.tp_partial);
  r.pp_partial = RunElements(roles.pp_partial);
  r.experts = RunElements(roles.experts);
  r.embedding = roles.tied_embedding.second;
  r.vocabulary = RunElements(roles.vocabulary);
  return r;
}

// Elements one micro-batch of chunk [first_layer, end_layer) hands to the TP group, rank 0
// (branches.cc, decoder.cc): all-reduces count their n elements, all-gathers their own share,
// reduce-scatters their whole input.
int64_t TpElements(const ModelConfig& c, const MemoryShape& l, int first_layer, int end_layer,
                   bool embedding, bool head, int64_t n, int64_t lnc, int64_t nc) {
  const bool sp = l.sequence_parallel;
  const bool full = l.recompute == Recompute::kFull;
  const int64_t inputs = c.residual == Residual::kMuddFormer ? 3 : 1;
  int64_t e = 0;
  if (embedding) e += nc + (sp ? lnc : 0);  // the lookup's sum; under SP dh0 gathered back
  const int64_t attention_fwd = sp ? inputs * lnc + nc : nc;
  int64_t attention_bwd = sp ? inputs * lnc + lnc + inputs * nc : inputs * nc;
  if (full && sp) attention_bwd += inputs * lnc;  // the recomputed forward gathers again
  const bool dense = !c.moe.has_value();
  int64_t ffn_fwd = 0, ffn_bwd = 0;
  if (dense) {
    ffn_fwd = sp ? lnc + nc : nc;
    ffn_bwd = sp ? 2 * lnc + nc : nc;
  } else if (sp) {  // every TP rank runs every gathered row through the (replicated) MoE
    ffn_fwd = lnc;
    ffn_bwd = 2 * lnc;
  }
  if (full && sp) ffn_bwd += lnc;
  e += (end_layer - first_layer) * (attention_fwd + attention_bwd + ffn_fwd + ffn_bwd);
  if (head) e += (sp ? lnc : 0) + 3 * n + nc;  // final norm gathered, softmax sums, dnorm
  return e;
}

// Expected elements a micro-batch's MoE layers hand to the EP group, rank 0, when the router
// spreads the n x top_k slots evenly over the experts (variants/moe.cc: the per-expert counts,
// then the rows out and back, forward and backward, once more for a recomputed forward).
int64_t EpElements(const ModelConfig& c, const MemoryShape& l, int layers, int64_t n,
                   int64_t* count_bytes) {
  if (!c.moe.has_value() || l.ep == 1) return 0;
  const MoeConfig& m = *c.moe;
  const int64_t local = m.num_experts / l.ep;
  const int64_t away = n * m.top_k * (l.ep - 1) / l.ep;  // slots bound for other ranks
  const int passes = l.recompute == Recompute::kFull ? 2 : 1;  // forwards per micro-batch
  *count_bytes += static_cast<int64_t>(layers) * passes * local * (l.ep - 1) * kScalar;
  // Forward: rows out, outputs back; backward: output gradients out, input gradients back.
  return static_cast<int64_t>(layers) * (passes * 2 + 2) * away * c.hidden_size;
}

absl::Status Check(const ModelConfig& c, const MemoryShape& l) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.ep < 1 || l.virtual_stages < 1) {
    return bad("every layout size must be at least 1");
  }
  if (l.batch < 1 || l.seq_len < 1 || l.microbatches < 1 || l.batch % l.microbatches != 0) {
    return bad(absl::StrCat("batch size ", l.batch, " is not divisible by ", l.microbatches,
                            " micro-batches"));
  }
  if (l.mixed_precision ? l.dtype_bytes != 2 : l.dtype_bytes != 4 && l.dtype_bytes != 8) {
    return bad("dtype bytes must be 4 or 8 (2 with mixed precision)");
  }
  SATDAR_RETURN_IF_ERROR(ValidateSharding(c, l.tp, l.pp * l.virtual_stages, l.ep, LayoutNames(),
                                          l.vocab_multiple));
  if (l.sequence_parallel &&
      (l.tp < 2 || (l.batch / l.microbatches) * l.seq_len % l.tp != 0)) {
    return bad("sequence parallelism needs tp >= 2 dividing a micro-batch's tokens");
  }
  if (l.virtual_stages > 1 && (l.pp < 2 || l.microbatches % l.pp != 0)) {
    return bad("virtual stages need pp >= 2 and micro-batches a multiple of pp");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepCost> PredictStep(const ModelConfig& c, const MemoryShape& l) {
  SATDAR_RETURN_IF_ERROR(Check(c, l));
  const int stages = l.pp * l.virtual_stages, per_stage = c.num_hidden_layers / stages;
  const int64_t b = l.batch / l.microbatches, n = b * l.seq_len, nc = n * c.hidden_size;
  const int64_t lnc = (l.sequence_parallel ? n / l.tp : n) * c.hidden_size;
  const int64_t v1 = c.value_residual != ValueResidualKind::kNone
                         ? n * (c.num_key_value_heads / l.tp) * c.head_size()
                         : 0;
  const int64_t d = l.dtype_bytes, m = l.microbatches;
  const int64_t g = l.mixed_precision ? 4 : d;  // a gradient element

  // Rank 0's chunks: virtual stages 0, pp, 2 pp, ...; their tables back to back.
  ParamTable table;
  for (int v = 0; v < l.virtual_stages; ++v) {
    Sharding shard;
    shard.tp_size = l.tp;
    shard.ep_size = l.ep;
    shard.pp_rank = v * l.pp;
    shard.pp_size = stages;
    shard.vocab_multiple = l.vocab_multiple;
    shard.sequence_parallel = l.sequence_parallel;
    SATDAR_ASSIGN_OR_RETURN(ParamTable chunk, BuildParamTable(c, shard));
    table.Append(chunk);
  }
  StepCost cost;
  const RankParameters roles = ParametersOf(table, c.tie_word_embeddings, l.pp > 1);
  cost.parameters = roles;
  // The pipeline: what every virtual boundary carries (the topology's state, V1).
  auto boundary = [&](int j) {  // after virtual stage j
    const int after = 2 * (j + 1) * per_stage;
    return m * (TopologyBoundaryTensors(c, after) * lnc + v1) * d;
  };
  for (int j = 0; j + 1 < stages; ++j) cost.pp_boundary_bytes.push_back({boundary(j), boundary(j)});

  int64_t tp = 0, pp = 0, ep = 0, data = 0, mp = 0, ep_counts = 0;
  for (int v = 0; v < l.virtual_stages; ++v) {
    const int j = v * l.pp, first = j * per_stage;
    tp += m * TpElements(c, l, first, first + per_stage, j == 0, j == stages - 1, n, lnc, nc) * d;
    ep += m * EpElements(c, l, per_stage, n, &ep_counts) * d;
    if (l.pp > 1) {
      if (j + 1 < stages) pp += boundary(j);  // activations to the next virtual stage
      if (j > 0) pp += boundary(j - 1);       // gradients back to the previous one
    }
  }
  ep += m * ep_counts;
  if (l.tp > 1 && roles.tp_partial > 0) tp += roles.tp_partial * g;  // one packed all-reduce
  if (l.pp > 1) {
    pp += kScalar;                                   // the loss over the stages
    pp += roles.pp_partial * g;                      // learnable_plus's lambdas
    pp += roles.embedding * g;                       // the tied embedding's gradient
    pp += 2 * l.virtual_stages * kScalar;            // the boundary byte counts for the log
  }
  const int replicas = l.dp * l.ep;
  if (replicas > 1) {
    data += kScalar;  // the loss over the replicas
    const bool split = l.ep > 1 && roles.experts > 0;
    const int64_t dense = roles.total - (split ? roles.experts : 0);
    if (l.zero_stage == 1) {
      // runtime/zero_partition.h: the dense partition over the data group (reduce-scatter
      // counted whole, padded; the updated shard all-gathered; its norm part summed).
      const int64_t shard = (dense + replicas - 1) / replicas;
      // Mixed precision gathers the updated fp32 master slices (runtime/train_state.cc on Cuda<float>).
      data += shard * replicas * g + shard * g + kScalar;
    } else {
      data += dense * g;  // the average (experts go over the dp group, not logged)
    }
  }
  if (l.tp * l.pp * l.ep > 1) mp += kScalar;  // the gradient norm over the model's pieces

  if (l.tp > 1) cost.comm_bytes["tp"] = tp;
  if (l.pp > 1) cost.comm_bytes["pp"] = pp;
  if (l.ep > 1) cost.comm_bytes["ep"] = ep;
  if (replicas > 1) cost.comm_bytes["data"] = data;
  if (l.tp * l.pp * l.ep > 1) cost.comm_bytes["mp"] = mp;
  cost.ep_exact = !(c.moe.has_value() && l.ep > 1);

  SATDAR_ASSIGN_OR_RETURN(cost.memory, EstimateMemory(c, l));
  return cost;
}

}  // namespace satdar::model
