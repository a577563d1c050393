#include "model/memory_estimate.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "model/model.h"

namespace satdar::model {

namespace {

// Elements one model instance keeps for a micro-batch of b sequences of t tokens on a rank
// holding `layers` layers (of `total_layers`) with tp-way split heads and FFN. Each term
// mirrors the buffers its component sizes in Resize (attention.cc, mlp.cc, branches.cc,
// decoder.cc, the topologies in variants/).
double ActivationElements(const ModelConfig& c, double b, double t, int layers, bool last_stage,
                          int tp, int vocab_multiple, Recompute recompute, bool sp, bool flash) {
  const double n = b * t, C = c.hidden_size, hs = c.head_size();
  // Sequence parallelism: the residual stream, its norms and the topology's state are this
  // rank's share of the rows (ln of n).
  const double ln = sp ? n / tp : n, lnc = ln * C;
  const double nh = c.num_attention_heads / tp, nkv = c.num_key_value_heads / tp;
  const double L = c.num_hidden_layers, nc = n * C;
  const bool vr = c.value_residual != ValueResidualKind::kNone;
  // Decoder: inputs, h0, final state and their gradients; the head's logits on the last stage.
  const double vocab = PaddedVocab(c.vocab_size, tp, vocab_multiple) / tp;
  double e = 4 * lnc + 2 * nc + (last_stage ? 2 * nc + n * vocab + 4 * n : 0);
  // Per layer: the two pre-norm inputs, attention's saved tensors and (B, NH, T, T)
  // probabilities, the value mix, and the FFN.
  // Flash-style attention keeps its (B, NH, T) log-sum-exp instead of the probabilities.
  const double probs = flash ? n * nh : b * nh * t * t;
  const double attention = n * (3 * nh * hs + 3 * nkv * hs + nh + nkv) + probs;
  double ffn = 0, ffn_scratch = 0;
  if (c.moe.has_value()) {
    const MoeConfig& m = *c.moe;
    const double k = m.top_k, fe = m.expert_intermediate_size;
    ffn = n * (2.0 * m.num_experts + 1 + 2 * k) + n * k * (2 * C + 3 * fe) +
          m.num_shared_experts * 3 * n * fe;
    ffn_scratch = n * (m.num_experts + k) + nc + n * k * 2 * C;
  } else {
    const double f = c.intermediate_size / tp;
    ffn = 3 * n * f;
    ffn_scratch = 3 * n * f;
  }
  // What each layer's branches keep (branches.cc): with full recomputation one shared set
  // (the MoE keeps its own per layer), plus layer 1's V and a discarded output; with selective
  // recomputation the probabilities once.
  const double branch = 2 * lnc + 2 * ln + attention + (vr ? 2 * n * nkv * hs : 0);
  const double moe = c.moe.has_value() ? ffn : 0;
  if (recompute == Recompute::kFull) {
    e += branch + (ffn - moe) + layers * moe + nc + (vr ? n * nkv * hs : 0);
  } else if (recompute == Recompute::kSelective) {
    e += layers * (branch - probs + ffn) + probs + nc;
  } else {
    e += layers * (branch + ffn);
  }
  // Scratch shared by the layers: projections and their gradients, the FFN's.
  e += n * (nh + 2 * nkv) * hs + 3 * n * nh * hs + 4 * n * nkv * hs + nc + ffn_scratch;
  // The residual topology's state for the sublayers this rank runs (its rows under SP).
  const double steps = 2.0 * layers + 1;
  const Residual r = c.residual;
  if (r == Residual::kAttnRes || r == Residual::kDar) {
    const int block = c.block_size > 0 ? c.block_size : (r == Residual::kDar ? 2 : 1);
    const double sources = 2 * L / block + 2;
    const double streams = r == Residual::kDar ? 2 : 1;
    e += steps * streams * (3 * lnc + ln * sources) + streams * sources * lnc + 6 * lnc;
  } else if (r == Residual::kTransparent) {
    // AttnRes' entries and gradients without the retrieval's keys: per step u and the partial
    // (the depth weights are a few scalars).
    const int block = c.block_size > 0 ? c.block_size : 1;
    const double sources = 2 * L / block + 2;
    e += steps * 2 * lnc + sources * lnc + 6 * lnc;
  } else if (r == Residual::kHc || r == Residual::kMhc) {
    const double ns = c.hc_streams;
    // HC per token: hbar (n C), u and y (C), rstd, ta, tb and the coefficients (2 n(n+2)).
    const double per_step = r == Residual::kHc ? ns * lnc + 2 * lnc + 2 * ln * ns * (ns + 2)
                                      : 2 * lnc + ln * (ns * ns + 4 * ns + 1 + 20 * ns * ns);
    e += steps * ns * lnc + steps * per_step + 3 * ns * lnc + 2 * lnc;
  } else if (r == Residual::kDenseFormer) {
    // Every source's gradient (up to the last stage's L + 1), this stage's sources, block
    // inputs and midpoints.
    e += (L + 1) * lnc + 3 * layers * lnc + 5 * lnc;
  } else if (r == Residual::kMuddFormer) {
    const double k = std::ceil(4 * (L + 1) / 64.0) * 64;
    e += 2 * (L + 1) * lnc + layers * (14 * lnc + ln * (2 * k + 4 * (L + 1))) + 8 * lnc;
  }
  return e;
}

// Parameter elements of the rank at pipeline stage `stage` (TP and EP rank 0), and how many
// of them are embedding or head rows.
absl::Status CountParameters(const ModelConfig& c, const MemoryShape& s, int stage,
                             int64_t* params, int64_t* embedding, int64_t* experts) {
  Sharding shard;
  shard.tp_size = s.tp;
  shard.pp_size = s.pp;
  shard.pp_rank = stage;
  shard.ep_size = s.ep;
  shard.vocab_multiple = s.vocab_multiple;
  SATDAR_ASSIGN_OR_RETURN(ParamTable table, BuildParamTable(c, shard));
  *params = table.size();
  *embedding = 0;
  *experts = 0;
  for (const ParamSpec& spec : table.specs()) {
    if (spec.role == ParamRole::kEmbedding || spec.role == ParamRole::kHead) {
      *embedding += spec.numel;
    }
    if (spec.expert) *experts += spec.numel;
  }
  return absl::OkStatus();
}

// Byte counts are computed in double and kept below 2^60, so that their sums stay in range
// whatever the config asks for.
int64_t Bytes(double v) { return static_cast<int64_t>(std::min(v, 1152921504606846976.0)); }

}  // namespace

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024 * 1024) return absl::StrFormat("%.1f TiB", b / (1ull << 40));
  if (b >= 1024.0 * 1024 * 1024) return absl::StrFormat("%.1f GiB", b / (1ull << 30));
  return absl::StrFormat("%.1f MiB", b / (1ull << 20));
}

std::string MemoryEstimate::Breakdown() const {
  std::string out = absl::StrCat("parameters ", FormatBytes(parameter_bytes));
  if (gradient_bytes > 0) absl::StrAppend(&out, ", gradients ", FormatBytes(gradient_bytes));
  if (optimizer_bytes > 0) {
    absl::StrAppend(&out, mixed_precision ? ", fp32 master weights and AdamW moments "
                                          : ", AdamW moments ",
                    FormatBytes(optimizer_bytes));
  }
  if (activation_bytes > 0) absl::StrAppend(&out, ", activations ", FormatBytes(activation_bytes));
  return out;
}

std::string MemoryEstimate::Largest(const BatchNames& names) const {
  if (activation_bytes >= total() / 2) {
    return absl::StrCat(names.batch, " or ", names.seq_len, " (activations), or raise ",
                        names.microbatches);
  }
  if (embedding_parameters >= parameters / 2) return "config field \"vocab_size\" (embedding)";
  return "config fields \"hidden_size\", \"intermediate_size\" or \"num_hidden_layers\"";
}

absl::StatusOr<MemoryEstimate> EstimateMemory(const ModelConfig& c, const MemoryShape& s) {
  SATDAR_CHECK(s.tp >= 1 && s.pp >= 1 && s.ep >= 1 && s.dp >= 1 && s.microbatches >= 1);
  MemoryEstimate best;
  const int layers = c.num_hidden_layers / s.pp;
  const double b = static_cast<double>(s.batch) / s.microbatches;
  const double replicas = static_cast<double>(s.dp) * s.ep;
  // The first stage keeps the most micro-batches in flight, the last holds the head: check both.
  for (int stage : {0, s.pp - 1}) {
    MemoryEstimate e;
    e.mixed_precision = s.mixed_precision;
    int64_t experts = 0;
    SATDAR_RETURN_IF_ERROR(
        CountParameters(c, s, stage, &e.parameters, &e.embedding_parameters, &experts));
    const double params = static_cast<double>(e.parameters);
    // ZeRO-1 shards the AdamW moments (runtime/zero_partition.h): the dense ones over the
    // dp x ep replicas, the experts' over dp (the ranks holding the same experts).
    const double expert_share = s.ep > 1 ? static_cast<double>(experts) : 0;
    const double sharded = s.zero_stage == 1 ? (params - expert_share) / replicas +
                                                    expert_share / s.dp
                                             : params;
    e.parameter_bytes = Bytes(params * s.dtype_bytes);
    if (s.mixed_precision) {
      // The GPU trainer (runtime/engine.h on Cuda<float>, train_state.cc): a bf16 compute copy, fp32 gradients (and
      // under ZeRO-1 the replica's reduce-scattered slice), fp32 master weights in full and the
      // fp32 moments.
      if (s.use == MemoryUse::kGradient || s.use == MemoryUse::kTraining) {
        e.gradient_bytes = Bytes(params * 4 + (s.zero_stage == 1 ? sharded * 4 : 0));
      }
      if (s.use == MemoryUse::kTraining) e.optimizer_bytes = Bytes(params * 4 + sharded * 8);
    } else {
      if (s.use == MemoryUse::kGradient || s.use == MemoryUse::kTraining) {
        e.gradient_bytes = e.parameter_bytes;
      }
      if (s.use == MemoryUse::kTraining) e.optimizer_bytes = Bytes(sharded * 2 * s.dtype_bytes);
    }
    if (s.use != MemoryUse::kWeights) {
      // Micro-batches in flight on this rank (parallel/pipeline.h): each holds every layer of
      // the rank's chunks once (with virtual stages, V chunks of L / (pp V) layers).
      int64_t warmup = s.pp - stage - 1;
      if (s.virtual_stages > 1) {
        warmup = std::min<int64_t>((s.pp - stage - 1) * 2 + (s.virtual_stages - 1) * s.pp,
                                   s.virtual_stages * s.microbatches);
      }
      const int instances =
          s.pp > 1 ? static_cast<int>(std::min<int64_t>(warmup + 1, s.microbatches)) : 1;
      const double elements = ActivationElements(c, b, static_cast<double>(s.seq_len), layers,
                                                 stage == s.pp - 1, s.tp, s.vocab_multiple,
                                                 s.recompute, s.sequence_parallel,
                                                 s.flash_attention);
      e.activation_bytes = Bytes(elements * instances * s.dtype_bytes);
    }
    if (e.total() > best.total()) best = e;
  }
  return best;
}

int64_t AvailableMemoryBytes() {
  int64_t best = -1;
  auto take = [&](int64_t v) {
    if (v >= 0 && (best < 0 || v < best)) best = v;
  };
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") take(kib * 1024);
  }
  // cgroup v2: the limit of this process's group (containers, Slurm, Kubernetes).
  std::ifstream group_file("/proc/self/cgroup");
  std::string line, group;
  while (std::getline(group_file, line)) {
    if (line.rfind("0::", 0) == 0) group = line.substr(3);
  }
  if (!group.empty()) {
    const std::string dir = "/sys/fs/cgroup" + (group == "/" ? std::string() : group);
    std::ifstream max_file(dir + "/memory.max"), current_file(dir + "/memory.current");
    std::string max_text, current_text;
    int64_t max_v, current_v;
    if (max_file >> max_text && current_file >> current_text &&
        absl::SimpleAtoi(max_text, &max_v) && absl::SimpleAtoi(current_text, &current_v)) {
      take(std::max<int64_t>(0, max_v - current_v));
    }
  }
  struct rlimit rl;
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    take(static_cast<int64_t>(rl.rlim_cur));
  }
  return best;
}

absl::Status CheckFitsInMemory(const ModelConfig& config, const MemoryShape& shape, int ranks,
                               const std::string& what, const BatchNames& names) {
  SATDAR_ASSIGN_OR_RETURN(MemoryEstimate e, EstimateMemory(config, shape));
  const int64_t available = AvailableMemoryBytes();
  const double need = static_cast<double>(e.total()) * ranks;
  if (available < 0 || need <= static_cast<double>(available)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " needs about ", FormatBytes(e.total()), ranks > 1 ? " per rank" : "", " (",
      e.Breakdown(), ")", ranks > 1 ? absl::StrCat(" for ", ranks, " ranks on this machine") : "",
      ", more than the ", FormatBytes(available), " of memory available; reduce ", e.Largest(names)));
}

}  // namespace satdar::model
