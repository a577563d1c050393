#include "model/step_time.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::model {

namespace {

constexpr double kTile = 128;  // the GEMM output tile a CTA computes (cuBLAS's common 128 x 128)

struct Link {
  double bandwidth = 0, latency = 0;
};

// The ops of one phase (a micro-batch's forward or backward on one rank), by name.
class Tally {
 public:
  Tally(const Hardware& hw, double share, double element) : hw_(hw), share_(share), e_(element) {
    flops_ = hw.peak_flops * share;
    bandwidth_ = hw.memory_bandwidth * hw.memory_efficiency * share;
  }

  double element() const { return e_; }
  // A tally of the same device and share, with no ops yet.
  Tally Empty() const { return Tally(hw_, share_, e_); }
  double seconds() const { return seconds_; }
  double comm_seconds(const std::string& group) const {
    auto it = ops_.find(group + ".collectives");
    return it == ops_.end() ? 0 : it->second.seconds;
  }
  const std::map<std::string, OpTime>& ops() const { return ops_; }

  // out [m, n] = a [m, k] x b [k, n], `groups` of them in one grouped call (the experts).
  void Gemm(const std::string& name, double m, double n, double k, double groups = 1) {
    if (m <= 0 || n <= 0 || k <= 0 || groups <= 0) return;
    const double flops = 2 * m * n * k * groups;
    const double bytes = (m * k + k * n + m * n) * groups * e_;
    double utilisation = 1;
    if (hw_.multiprocessors > 0) {  // the last wave of tiles leaves SMs idle
      const double tiles = std::ceil(m / kTile) * std::ceil(n / kTile) * groups;
      const double waves = std::ceil(tiles / hw_.multiprocessors);
      utilisation = tiles / (waves * hw_.multiprocessors);
      // A tile's rows beyond m are computed and thrown away.
      utilisation *= m * n * groups / (std::ceil(m / kTile) * std::ceil(n / kTile) * kTile * kTile * groups);
    }
    Add(name, flops, bytes,
        std::max(flops / (flops_ * hw_.gemm_efficiency * utilisation), bytes / bandwidth_) +
            hw_.op_overhead);
  }
  // A linear layer's forward (x [m, k] W^T -> [m, n]) here, its input and weight gradients in
  // `backward`.
  void Linear(Tally* backward, const std::string& name, double m, double n, double k,
              double groups = 1) {
    Gemm(name, m, n, k, groups);
    backward->Gemm(name, m, k, n, groups);  // dx = dout W
    backward->Gemm(name, n, k, m, groups);  // dW = dout^T x
  }
  // A memory-bound op reading and writing `elements` in all.
  void Stream(const std::string& name, double elements, double flops = 0) {
    const double bytes = elements * e_;
    Add(name, flops, bytes,
        std::max(bytes / bandwidth_, flops / (flops_ * hw_.gemm_efficiency)) + hw_.op_overhead);
  }
  // Work that runs as GEMMs without their operand traffic (the CPU attention's products, whose
  // probabilities Stream counts).
  void Products(const std::string& name, double flops) {
    Add(name, flops, 0, flops / (flops_ * hw_.gemm_efficiency) + hw_.op_overhead);
  }
  // A fused (flash-style) attention kernel.
  void Fused(const std::string& name, double flops, double elements) {
    const double bytes = elements * e_;
    Add(name, flops, bytes,
        std::max(flops / (flops_ * hw_.attention_efficiency), bytes / bandwidth_) +
            hw_.op_overhead);
  }
  // Collectives over `p` ranks of `bytes` each (the whole tensor): on a GPU as NCCL's rings
  // move them, on a CPU as satdar's communicators do (comm/mpi_communicator.h: each rank sends
  // its whole tensor to every peer and adds theirs in rank order).
  void AllReduce(const std::string& group, double bytes, int p, const Link& link, double times = 1) {
    if (p < 2 || bytes <= 0) return;
    const double seconds =
        hw_.gpu ? 2.0 * (p - 1) * link.latency + 2.0 * (p - 1) / p * bytes / link.bandwidth
                : link.latency + (p - 1) * bytes / link.bandwidth + (p - 1) * bytes / bandwidth_;
    Comm(group, times * bytes, times * seconds);
  }
  void Gather(const std::string& group, double bytes, int p, const Link& link, double times = 1) {
    if (p < 2 || bytes <= 0) return;  // an all-gather to, or a reduce-scatter of, `bytes`
    const double steps = hw_.gpu ? p - 1 : 1;  // ring steps, or one direct exchange
    Comm(group, times * bytes,
         times * (steps * link.latency + (p - 1.0) / p * bytes / link.bandwidth));
  }
  void AllToAll(const std::string& group, double away_bytes, int p, const Link& link,
                double times = 1) {
    if (p < 2 || away_bytes <= 0) return;
    const double steps = hw_.gpu ? p - 1 : 1;
    Comm(group, times * away_bytes, times * (steps * link.latency + away_bytes / link.bandwidth));
  }

  // Adds another tally's ops; compute_only: not its collectives (a recomputed forward).
  void Merge(const Tally& other, bool compute_only) {
    for (const auto& [name, op] : other.ops_) {
      if (!compute_only || name.find(".collectives") == std::string::npos) {
        Add(name, op.flops, op.bytes, op.seconds);
      }
    }
  }

 private:
  void Comm(const std::string& group, double bytes, double seconds) {
    Add(group + ".collectives", 0, bytes, seconds);
  }
  void Add(const std::string& name, double flops, double bytes, double seconds) {
    OpTime& op = ops_[name];
    op.name = name;
    op.flops += flops;
    op.bytes += bytes;
    op.seconds += seconds;
    seconds_ += seconds;
  }

  const Hardware& hw_;
  double share_, e_, flops_, bandwidth_;
  double seconds_ = 0;
  std::map<std::string, OpTime> ops_;
};

// The sizes every op below is written in (one micro-batch on one TP rank).
struct Dims {
  double b, t, n, ln, C, nh, nkv, hs, qd, kd;
  int tp;
};

// The residual topology's reads and writes around sublayers [first, end) (depth retrievals,
// streams, weighted averages), `readout` with the final one.
void TopologyOps(const ModelConfig& c, const Dims& d, int first, int end, bool readout,
                 Tally* fwd, Tally* bwd) {
  const double lnc = d.ln * d.C;
  auto both = [&](double elements, double flops) {
    fwd->Stream("residual.topology", elements, flops);
    bwd->Stream("residual.topology", 2 * elements, 2 * flops);
  };
  const Residual r = c.residual;
  const int last = readout ? end + 1 : end;
  for (int i = first; i < last; ++i) {
    if (r == Residual::kAttnRes || r == Residual::kDar) {
      // Retrieval before sublayer i: keys and values from 1 + ceil(i / block) sources per
      // stream (the embedding and the blocks begun before it), then the block's partial sum.
      const int block = c.block_size > 0 ? c.block_size : (r == Residual::kDar ? 2 : 1);
      const double sources = 1 + (i + block - 1) / block, streams = r == Residual::kDar ? 2 : 1;
      both(streams * (2 * sources + 4) * lnc, streams * 4 * sources * lnc);
    } else if (r == Residual::kTransparent) {
      // AttnRes' sources mixed with static weights: each read once, a multiply-add per
      // element (the backward: the sources' gradients and a dot per source), then the
      // block's partial sum.
      const int block = c.block_size > 0 ? c.block_size : 1;
      const double sources = 1 + (i + block - 1) / block;
      both((sources + 4) * lnc, 2 * sources * lnc);
    } else if (r == Residual::kHc || r == Residual::kMhc) {
      const double ns = c.hc_streams;  // width and depth connections over ns streams
      both((3 * ns + 2) * lnc, 2 * d.ln * ns * d.C * (ns + 2) + (r == Residual::kMhc ? 40 * ns * ns * d.ln : 0));
    } else {
      both(3 * lnc, 0);  // x + branch(x)
      // DenseFormer and MUDDFormer: after each layer, weighted averages of X_0 .. X_k.
      if (i % 2 == 1 && i < end && (r == Residual::kDenseFormer || r == Residual::kMuddFormer)) {
        const double k = (i + 1) / 2, outputs = r == Residual::kMuddFormer ? 4 : 1;
        both(outputs * (k + 2) * lnc, 2 * outputs * (k + 1) * lnc);
        if (r == Residual::kMuddFormer) fwd->Linear(bwd, "residual.topology", d.ln, 4 * (k + 1), d.C);
      }
    }
  }
}

// One layer's attention and FFN branches: compute ops and the TP and EP collectives.
void LayerOps(const ModelConfig& c, const MemoryShape& l, const Hardware& hw, const Dims& d,
              const Link& tp_link, const Link& ep_link, bool first_layer, Tally* fwd,
              Tally* bwd) {
  const double n = d.n, ln = d.ln, C = d.C, e = fwd->element(), nc = n * C;
  const bool sp = l.sequence_parallel, full = l.recompute == Recompute::kFull;
  const double inputs = c.residual == Residual::kMuddFormer ? 3 : 1;
  // Attention: the pre-norm(s), QKV, q/k norm and RoPE, the value residual, the core, output.
  fwd->Stream("norms", 2 * inputs * ln * C);
  bwd->Stream("norms", 3 * inputs * ln * C);
  fwd->Linear(bwd, "attention.qkv", n, d.qd + 2 * d.kd, C);
  fwd->Stream("attention.qk_norm_rope", 4 * n * (d.qd + d.kd));
  bwd->Stream("attention.qk_norm_rope", 6 * n * (d.qd + d.kd));
  if (c.value_residual == ValueResidualKind::kSatFormer && !first_layer) {
    fwd->Linear(bwd, "value_residual", n, c.num_key_value_heads / d.tp, C);
  }
  if (c.value_residual != ValueResidualKind::kNone && !first_layer) {
    fwd->Stream("value_residual", 4 * n * d.kd);
    bwd->Stream("value_residual", 6 * n * d.kd);
  }
  const double core = 2 * d.b * d.nh * d.t * d.t * d.hs;  // QK^T and PV over the causal half
  const double io = n * (2 * d.qd + 2 * d.kd);
  if (hw.gpu) {  // flash-style: the backward's five products, the probabilities recomputed
    fwd->Fused("attention.core", core, io);
    bwd->Fused("attention.core", 2.5 * core, 2 * io);
  } else {  // the CPU keeps the (B, NH, T, T) probabilities: scores, softmax, products
    const double probs = d.b * d.nh * d.t * d.t / 2;
    fwd->Products("attention.core", core);
    fwd->Stream("attention.core", 4 * probs + io);
    bwd->Products("attention.core", 2 * core);
    bwd->Stream("attention.core", 6 * probs + 2 * io);
    if (l.recompute == Recompute::kSelective) {
      bwd->Products("attention.core", core / 2);
      bwd->Stream("attention.core", 3 * probs);
    }
  }
  fwd->Linear(bwd, "attention.out", n, C, d.qd);
  // TP: the output's sum (under SP a reduce-scatter after an all-gather of the input: the same
  // wire bytes), the input gradients' sums; SP's backward gathers the inputs again.
  fwd->AllReduce("tp", nc * e, d.tp, tp_link);
  bwd->AllReduce("tp", nc * e, d.tp, tp_link, inputs);
  if (sp) bwd->Gather("tp", nc * e, d.tp, tp_link, inputs * (full ? 2 : 1));

  fwd->Stream("norms", 2 * ln * C);
  bwd->Stream("norms", 3 * ln * C);
  if (!c.moe.has_value()) {
    const double f = static_cast<double>(c.intermediate_size) / d.tp;
    fwd->Linear(bwd, "ffn.up", n, 2 * f, C);
    fwd->Stream("ffn.swiglu", 3 * n * f);
    bwd->Stream("ffn.swiglu", 5 * n * f);
    fwd->Linear(bwd, "ffn.down", n, C, f);
    fwd->AllReduce("tp", nc * e, d.tp, tp_link);
    bwd->AllReduce("tp", nc * e, d.tp, tp_link);
    if (sp) bwd->Gather("tp", nc * e, d.tp, tp_link, full ? 2 : 1);
    return;
  }
  // MoE (every TP rank runs every row): router, dispatch to the experts' ranks, the experts as
  // grouped GEMMs over the rows each receives (uniform routing), the way back, the combine.
  const MoeConfig& m = *c.moe;
  const double k = m.top_k, fe = m.expert_intermediate_size, local = m.num_experts / l.ep;
  const double rows = n * k / local;  // per local expert: n k slots arrive at each EP rank
  if (sp) {
    fwd->Gather("tp", nc * e, d.tp, tp_link);
    bwd->Gather("tp", nc * e, d.tp, tp_link, full ? 3 : 2);
  }
  fwd->Linear(bwd, "moe.router", n, m.num_experts, C);
  fwd->Stream("moe.route", 3 * n * m.num_experts);
  bwd->Stream("moe.route", 3 * n * m.num_experts);
  fwd->Stream("moe.permute", 2 * n * k * C + 2 * n * k * C);
  bwd->Stream("moe.permute", 2 * n * k * C + 3 * n * k * C);
  const double away = n * k * (l.ep - 1) / l.ep * C * e;
  fwd->AllToAll("ep", away, l.ep, ep_link, 2);
  bwd->AllToAll("ep", away, l.ep, ep_link, full ? 4 : 2);  // a recomputed forward's too
  fwd->Linear(bwd, "moe.experts", rows, 2 * fe, C, local);
  fwd->Stream("moe.swiglu", 3 * n * k * fe);
  bwd->Stream("moe.swiglu", 5 * n * k * fe);
  fwd->Linear(bwd, "moe.experts", rows, C, fe, local);
  if (m.num_shared_experts > 0) {
    const double fs = fe * m.num_shared_experts;
    fwd->Linear(bwd, "moe.shared", n, 2 * fs, C);
    fwd->Stream("moe.swiglu", 3 * n * fs);
    bwd->Stream("moe.swiglu", 5 * n * fs);
    fwd->Linear(bwd, "moe.shared", n, C, fs);
  }
}

// One micro-batch of pipeline rank s: its chunks' (virtual stages s, s + pp, ...) layers,
// residual topology, embedding and head, forward into `fwd` and backward into `bwd`.
void StageOps(const ModelConfig& c, const MemoryShape& l, const Hardware& hw, const Dims& d,
              const Link& tp_link, const Link& ep_link, int s, Tally* fwd, Tally* bwd) {
  const int stages = l.pp * l.virtual_stages, per_stage = c.num_hidden_layers / stages;
  const double e = fwd->element(), g = l.mixed_precision ? 4 : e;
  const double vocab = static_cast<double>(PaddedVocab(c.vocab_size, l.tp, l.vocab_multiple)) / l.tp;
  for (int v = 0; v < l.virtual_stages; ++v) {
    const int j = v * l.pp + s, first = j * per_stage;
    Tally layers_fwd = fwd->Empty(), layers_bwd = fwd->Empty();
    for (int layer = first; layer < first + per_stage; ++layer) {
      LayerOps(c, l, hw, d, tp_link, ep_link, layer == 0, &layers_fwd, &layers_bwd);
    }
    TopologyOps(c, d, 2 * first, 2 * (first + per_stage), j == stages - 1, &layers_fwd,
                &layers_bwd);
    if (l.recompute == Recompute::kFull) layers_bwd.Merge(layers_fwd, /*compute_only=*/true);
    fwd->Merge(layers_fwd, false);
    bwd->Merge(layers_bwd, false);
    if (j == 0) {  // the embedding's lookup and its gradient's scatter
      fwd->Stream("embedding", 2 * d.n * d.C);
      bwd->Stream("embedding", 2 * d.n * d.C * g / e);
      fwd->AllReduce("tp", d.n * d.C * e, l.tp, tp_link);
    }
    if (j == stages - 1) {  // final norm, logits, cross-entropy
      fwd->Stream("head", 2 * d.ln * d.C);
      bwd->Stream("head", 3 * d.ln * d.C);
      fwd->Linear(bwd, "head", d.n, vocab, d.C);
      fwd->Stream("head.cross_entropy", 3 * d.n * vocab);
      bwd->Stream("head.cross_entropy", 2 * d.n * vocab);
      fwd->AllReduce("tp", 3 * d.n * 8, l.tp, tp_link);
      bwd->AllReduce("tp", d.n * d.C * e, l.tp, tp_link);
    }
  }
}

// Which link a group spans: a group whose ranks lie within `extent` consecutive ranks stays
// inside a node when such blocks tile the node (extent divides it); otherwise some group
// straddles two nodes, and the slowest group sets the pace.
Link LinkFor(const Hardware& hw, int extent, int ranks_per_node) {
  if (extent <= ranks_per_node && ranks_per_node % extent == 0) {
    return {hw.intra_node_bandwidth, hw.intra_node_latency};
  }
  return {hw.inter_node_bandwidth, hw.inter_node_latency};
}

}  // namespace

absl::StatusOr<StepTime> PredictStepTime(const ModelConfig& c, const MemoryShape& l,
                                         const StepCost& cost, const Hardware& hw,
                                         const Placement& p) {
  if (p.ranks_per_node < 1 || p.threads < 1) {
    return absl::InvalidArgumentError("ranks per node and threads must be at least 1");
  }
  const int64_t world = static_cast<int64_t>(l.dp) * l.tp * l.pp * l.ep;
  if (l.tp > p.ranks_per_node) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", l.tp, " spans more than the ",
                                                   p.ranks_per_node, " ranks of a node"));
  }
  if (p.ranks_per_node % l.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tp ", l.tp, " does not divide the ",
                                                   p.ranks_per_node,
                                                   " ranks of a node (a TP group would "
                                                   "straddle two nodes)"));
  }
  if (world > p.ranks_per_node && world % p.ranks_per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat(world, " ranks do not fill nodes of ",
                                                   p.ranks_per_node));
  }
  // A CPU rank gets its threads' cores, or its share of the node's cores when they are fewer.
  const double share =
      hw.cores > 0 ? std::min<double>(p.threads, static_cast<double>(hw.cores) /
                                                      std::min<int64_t>(world, p.ranks_per_node))
                   : 1.0;
  const double e = static_cast<double>(l.dtype_bytes), g = l.mixed_precision ? 4 : e;
  const int stages = l.pp * l.virtual_stages, per_stage = c.num_hidden_layers / stages;
  Dims d;
  d.b = static_cast<double>(l.batch) / l.microbatches;
  d.t = static_cast<double>(l.seq_len);
  d.n = d.b * d.t;
  d.ln = l.sequence_parallel ? d.n / l.tp : d.n;
  d.C = c.hidden_size;
  d.tp = l.tp;
  d.nh = static_cast<double>(c.num_attention_heads) / l.tp;
  d.nkv = static_cast<double>(c.num_key_value_heads) / l.tp;
  d.hs = c.head_size();
  d.qd = d.nh * d.hs;
  d.kd = d.nkv * d.hs;
  const Link tp_link = LinkFor(hw, l.tp, p.ranks_per_node);
  const Link ep_link = LinkFor(hw, l.tp * l.ep, p.ranks_per_node);
  const Link pp_link = LinkFor(hw, l.tp * l.ep * l.pp, p.ranks_per_node);
  const int span = static_cast<int>(std::min<int64_t>(world, 1 << 30));
  const Link dp_link = LinkFor(hw, span, p.ranks_per_node);
  const Link data_link = LinkFor(hw, l.dp > 1 ? span : l.tp * l.ep, p.ranks_per_node);

  // Each pipeline rank's micro-batch: its chunks' forward and backward.
  StepTime out;
  double slowest = -1, slowest_bwd = 0;
  std::map<std::string, OpTime> slowest_ops;
  for (int s = 0; s < l.pp; ++s) {
    Tally fwd(hw, share, e), bwd(hw, share, e);
    StageOps(c, l, hw, d, tp_link, ep_link, s, &fwd, &bwd);
    const double total = fwd.seconds() + bwd.seconds();
    if (total > slowest) {
      slowest = total;
      slowest_bwd = bwd.seconds();
      out.tp_seconds = (fwd.comm_seconds("tp") + bwd.comm_seconds("tp")) * l.microbatches;
      out.ep_seconds = (fwd.comm_seconds("ep") + bwd.comm_seconds("ep")) * l.microbatches;
      slowest_ops.clear();
      for (const Tally* t : {&fwd, &bwd}) {
        for (const auto& [name, op] : t->ops()) {
          OpTime& o = slowest_ops[name];
          o.name = name;
          o.flops += op.flops * l.microbatches;
          o.bytes += op.bytes * l.microbatches;
          o.seconds += op.seconds * l.microbatches;
        }
      }
    }
  }
  const double m = static_cast<double>(l.microbatches);
  out.compute_seconds = m * slowest;
  // 1F1B's fill and drain: (pp - 1) / V of a micro-batch on the slowest stage. On a CPU a
  // rank's non-blocking sends progress only inside its next MPI call (comm/mpi_communicator.h:
  // no progress thread), so each hop of the fill and drain also waits for the sender's next op.
  const double hops = hw.gpu ? 1.0 : 2.0;
  out.bubble_seconds = l.pp > 1 ? hops * (l.pp - 1.0) / l.virtual_stages * slowest : 0;
  for (const auto& [name, op] : slowest_ops) out.executed_flops += op.flops;

  // The pipeline's sends: a micro-batch's share of each boundary's bytes.
  if (l.pp > 1) {
    double largest = 0;
    for (const auto& [fwd_bytes, bwd_bytes] : cost.pp_boundary_bytes) {
      largest = std::max<double>(largest, std::max(fwd_bytes, bwd_bytes) / m);
    }
    const double send = pp_link.latency + largest / pp_link.bandwidth;
    // GPU: sends run beside compute but the fill and drain wait for them; CPU: every send waits.
    const double sends = hw.gpu ? 2.0 * (l.pp - 1) : 2.0 * m * l.virtual_stages;
    out.pp_seconds = sends * send;
    OpTime& op = slowest_ops["pp.sends"];
    op.name = "pp.sends";
    op.bytes = 2 * m * l.virtual_stages * largest;
    op.seconds = out.pp_seconds;
  }
  // Gradients: TP and stage partial sums, then the replicas (ZeRO-1: reduce-scatter and gather).
  const RankParameters& r = cost.parameters;
  const int replicas = l.dp * l.ep;
  const bool split = l.ep > 1 && r.experts > 0;
  const double dense = static_cast<double>(r.total - (split ? r.experts : 0));
  // As satdar's GPU trainer runs it (runtime/engine.h, runtime/gradient_sync.cc): without
  // pipeline stages or expert parallelism the all-reduce of each layer's gradients starts as
  // the last micro-batch's backward finishes that layer, so the backward hides it, but for the
  // embedding with the first layer and the final norm with the head, reduced after the
  // backward; with them (the 1F1B schedule's last backward is not one pass), and ZeRO-1's
  // reduce-scatter and gather, the reductions run after the backward.
  Tally reduce(hw, share, e), tail(hw, share, e), gather(hw, share, e), exchange(hw, share, e);
  exchange.AllReduce("tp", r.tp_partial * g, l.tp, tp_link);
  exchange.AllReduce("pp", (r.pp_partial + r.embedding) * g, l.pp > 1 ? 2 : 1, pp_link);
  const bool overlap = hw.gpu && l.zero_stage == 0 && l.pp == 1 && l.ep == 1;
  if (l.zero_stage == 1 && replicas > 1) {
    reduce.Gather("data", dense * g, replicas, data_link);
    gather.Gather("data", dense * g, replicas, data_link);  // the updated master slices
  } else {
    const double layers_here = static_cast<double>(per_stage) * l.virtual_stages;
    const double last = overlap ? r.vocabulary + (dense - r.vocabulary) / layers_here : 0;
    reduce.AllReduce("data", (dense - last) * g, replicas, data_link);
    tail.AllReduce("data", last * g, replicas, data_link);
  }
  if (split) reduce.AllReduce("data", r.experts * g, l.dp, dp_link);
  const double hidden_reduce = overlap ? std::min(reduce.seconds(), slowest_bwd) : 0;
  out.data_seconds = reduce.seconds() - hidden_reduce + tail.seconds() + gather.seconds() +
                     exchange.seconds();
  if (reduce.seconds() + tail.seconds() + gather.seconds() + exchange.seconds() > 0) {
    OpTime& op = slowest_ops["data.collectives"];
    op.name = "data.collectives";
    op.bytes = dense * g + (l.zero_stage == 1 ? dense * g : 0) + (split ? r.experts * g : 0);
    op.seconds = out.data_seconds;
  }
  // AdamW over the rank's state and the gradient norm (mixed precision: fp32 master weights,
  // moments and gradients read, written back, the bf16 copy refreshed).
  // ZeRO-1 updates the replica's slice: dense state over dp x ep, experts' over dp.
  const double updated =
      l.zero_stage == 1 ? dense / replicas + (split ? static_cast<double>(r.experts) / l.dp : 0)
                        : r.total;
  const double state_bytes = l.mixed_precision ? 28 : 7 * e;
  Tally optimizer(hw, share, 1);
  optimizer.Stream("optimizer", updated * state_bytes + r.total * (g + (l.mixed_precision ? 2 : 0)),
                   12 * updated);
  out.optimizer_seconds = optimizer.seconds();
  slowest_ops["optimizer"] = optimizer.ops().at("optimizer");
  out.step_seconds = out.compute_seconds + out.bubble_seconds + out.pp_seconds +
                     out.data_seconds + out.optimizer_seconds;
  for (const auto& [name, op] : slowest_ops) out.ops.push_back(op);
  std::sort(out.ops.begin(), out.ops.end(),
            [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return out;
}

}  // namespace satdar::model
