#include "model/layout_search.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "model/flops.h"
#include "model/layout_check.h"
#include "model/model.h"

namespace satdar::model {

namespace {

std::vector<int> Divisors(int64_t n, int64_t at_most) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n && d <= at_most; ++d) {
    if (n % d == 0) out.push_back(static_cast<int>(d));
  }
  return out;
}

absl::StatusOr<int64_t> FullParameters(const ModelConfig& c) {
  SATDAR_ASSIGN_OR_RETURN(ParamTable table, BuildParamTable(c, Sharding{}));
  return table.size();
}

absl::StatusOr<Candidate> Predict(const ModelConfig& c, const MemoryShape& l, const Hardware& hw,
                                  const Placement& p, int64_t full_parameters) {
  Candidate out;
  out.layout = l;
  SATDAR_ASSIGN_OR_RETURN(out.cost, PredictStep(c, l));
  SATDAR_ASSIGN_OR_RETURN(out.time, PredictStepTime(c, l, out.cost, hw, p));
  const double world = static_cast<double>(l.dp) * l.tp * l.pp * l.ep;
  const double tokens = static_cast<double>(l.batch) * l.seq_len * l.dp * l.ep;
  out.tokens_per_second = tokens / out.time.step_seconds;
  const double peak = hw.peak_flops * (hw.cores > 0 ? p.threads : 1);
  out.mfu = FlopsPerToken(full_parameters, c, static_cast<int>(l.seq_len)) *
            out.tokens_per_second / world / peak;
  // A CPU's ranks share the machine's memory.
  const double sharing = hw.cores > 0 ? std::min<double>(world, p.ranks_per_node) : 1;
  out.fits = static_cast<double>(out.cost.memory.total()) <= kUsableMemory * hw.memory_bytes / sharing;
  return out;
}

}  // namespace

absl::StatusOr<Candidate> PredictLayout(const ModelConfig& c, const MemoryShape& l,
                                        const Hardware& hw, const Placement& p) {
  SATDAR_ASSIGN_OR_RETURN(int64_t full, FullParameters(c));
  return Predict(c, l, hw, p, full);
}

absl::StatusOr<SearchResult> SearchLayouts(const ModelConfig& c, const Cluster& cluster,
                                           const SearchRequest& request) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (cluster.nodes < 1 || cluster.ranks_per_node < 1) return bad("the cluster needs a node and a rank");
  if ((request.global_batch > 0) == (request.batch_per_replica > 0)) {
    return bad("give either the global batch or the batch per replica");
  }
  if (request.seq_len < 1 || request.top < 1) return bad("sequence length and top must be >= 1");
  const Hardware& hw = cluster.hardware;
  const int64_t world = static_cast<int64_t>(cluster.nodes) * cluster.ranks_per_node;
  const Placement placement{cluster.ranks_per_node, cluster.threads};
  SATDAR_ASSIGN_OR_RETURN(int64_t full, FullParameters(c));
  const int layers = c.num_hidden_layers;
  const int experts = c.moe.has_value() ? c.moe->num_experts : 1;

  SearchResult result;
  std::vector<Candidate> fitting;
  Candidate smallest;  // the least memory of all, for the error when nothing fits
  bool any = false;
  std::string why_none;
  // Plain data parallelism and ZeRO-1; recomputation only when the layout does not fit
  // without it (it costs time): none, selective (a CPU's probabilities; a GPU's flash
  // attention never keeps them), full.
  std::vector<Recompute> modes = {Recompute::kNone, Recompute::kFull};
  if (!hw.gpu) modes.insert(modes.begin() + 1, Recompute::kSelective);
  if (request.recompute_fixed) modes = {request.recompute};
  auto try_modes = [&](MemoryShape l, int64_t replicas) {
    for (int zero = 0; zero <= (replicas > 1 ? 1 : 0); ++zero) {
      if (request.zero_stage >= 0 && zero != request.zero_stage) continue;
      l.zero_stage = zero;
      for (Recompute mode : modes) {
        l.recompute = mode;
        absl::StatusOr<Candidate> cand = Predict(c, l, hw, placement, full);
        if (!cand.ok()) {
          why_none = std::string(cand.status().message());
          return;
        }
        ++result.tried;
        if (!any || cand->cost.memory.total() < smallest.cost.memory.total()) {
          smallest = *cand;
          any = true;
        }
        if (cand->fits) {
          fitting.push_back(*std::move(cand));
          break;
        }
      }
    }
  };
  for (int tp : Divisors(cluster.ranks_per_node, cluster.ranks_per_node)) {
    for (int pp : Divisors(layers, layers)) {
      for (int ep : Divisors(experts, experts)) {
        if (world % (static_cast<int64_t>(tp) * pp * ep) != 0) continue;
        const int dp = static_cast<int>(world / (static_cast<int64_t>(tp) * pp * ep));
        const int64_t replicas = static_cast<int64_t>(dp) * ep;
        int64_t batch = request.batch_per_replica;
        if (request.global_batch > 0) {
          if (request.global_batch % replicas != 0) {
            why_none = absl::StrCat("the global batch ", request.global_batch,
                                    " does not divide over ", replicas, " replicas");
            continue;
          }
          batch = request.global_batch / replicas;
        }
        const absl::Status shardable = ValidateSharding(c, tp, pp, ep, LayoutNames(),
                                                        request.vocab_multiple);
        if (!shardable.ok()) {
          why_none = std::string(shardable.message());
          continue;
        }
        // What `satdar train --device cuda` refuses for this split (a TP rank's FFN rows).
        const absl::Status runs = CheckDeviceSupport(c, tp);
        if (!runs.ok()) {
          why_none = absl::StrCat("the GPU kernels cannot take tp=", tp, ": ", runs.message());
          continue;
        }
        if (request.microbatches > 0 && batch % request.microbatches != 0) {
          why_none = absl::StrCat("the replica's batch of ", batch, " (dp=", dp, " ep=", ep,
                                  ") is not divisible by ", request.microbatches,
                                  " micro-batches");
          continue;
        }
        for (int v : Divisors(layers / pp, 64)) {
          if (request.virtual_stages > 0 ? v != request.virtual_stages : v > 8) continue;
          if (v > 1 && pp < 2) break;
          for (int m : Divisors(batch, std::max<int64_t>(256, request.microbatches))) {
            if (request.microbatches > 0 && m != request.microbatches) continue;
            if (v > 1 && m % pp != 0) continue;
            MemoryShape l;
            l.dp = dp;
            l.tp = tp;
            l.pp = pp;
            l.ep = ep;
            l.batch = batch;
            l.seq_len = request.seq_len;
            l.microbatches = m;
            l.virtual_stages = v;
            l.vocab_multiple = request.vocab_multiple;
            l.mixed_precision = hw.gpu;
            l.flash_attention = hw.gpu;
            l.dtype_bytes = hw.gpu ? 2 : cluster.dtype_bytes;
            l.sequence_parallel = false;
            if (request.sequence_parallel != 1) try_modes(l, replicas);
            if (request.sequence_parallel != 0 && tp > 1 &&
                (batch / m) * request.seq_len % tp == 0) {
              l.sequence_parallel = true;
              try_modes(l, replicas);
            }
          }
        }
      }
    }
  }
  if (!any) {
    return bad(absl::StrCat("no layout of ", cluster.nodes, " x ", cluster.ranks_per_node,
                            " ranks can run this config (last reason: ", why_none, ")"));
  }
  result.fitting = static_cast<int64_t>(fitting.size());
  if (fitting.empty()) {
    const MemoryShape& s = smallest.layout;
    // A CPU's ranks share the machine's memory.
    const double per_rank = kUsableMemory * hw.memory_bytes /
                            (hw.cores > 0 ? std::min<int64_t>(world, cluster.ranks_per_node) : 1);
    return absl::InvalidArgumentError(absl::StrCat(
        "none of the ", result.tried, " layouts fits in ", FormatBytes(static_cast<int64_t>(
            per_rank)), " per ", hw.gpu ? "GPU" : "rank", " (",
        kUsableMemory * 100, "% of ", hw.description, hw.gpu ? "" : " shared by its ranks",
        "); the smallest, dp=", s.dp, " tp=", s.tp,
        " pp=", s.pp, " ep=", s.ep, " with ", s.microbatches, " micro-batches and recompute ",
        Name(s.recompute), ", needs ", FormatBytes(smallest.cost.memory.total()), " (",
        smallest.cost.memory.Breakdown(), "); use more nodes or a smaller batch or sequence"));
  }
  std::stable_sort(fitting.begin(), fitting.end(), [](const Candidate& a, const Candidate& b) {
    return a.tokens_per_second > b.tokens_per_second;
  });
  if (fitting.size() > static_cast<size_t>(request.top)) fitting.resize(request.top);
  result.best = std::move(fitting);
  return result;
}

}  // namespace satdar::model
