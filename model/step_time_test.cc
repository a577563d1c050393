// The step-time model (model/step_time.h), the hardware table and files (model/hardware.h) and
// the layout search (model/layout_search.h): FLOP counts against the model FLOPs formula,
// the schedule's terms (recomputation, bubble, overlap, shared CPU cores, links across nodes)
// and the search's ranking and refusals.
#include "model/step_time.h"

#include <string>

#include "gtest/gtest.h"
#include "core/check.h"
#include "model/config.h"
#include "model/cost_model.h"
#include "model/flops.h"
#include "model/hardware.h"
#include "model/layout_check.h"
#include "model/layout_search.h"

namespace satdar::model {
namespace {

ModelConfig Load(const std::string& name) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig("configs/" + name);
  SATDAR_CHECK(c.ok()) << c.status();
  return *c;
}

Hardware Table(const std::string& name) {
  absl::StatusOr<Hardware> h = FindHardware(name);
  SATDAR_CHECK(h.ok()) << h.status();
  return *h;
}

// A measured-looking two-core CPU (bench/cpu_hardware's fields).
Hardware Cpu() {
  absl::StatusOr<Hardware> h = ParseHardware(R"({
    "name": "cpu", "description": "two cores", "peak_flops": 7e10, "gemm_efficiency": 1,
    "attention_efficiency": 1, "memory_bandwidth": 1.5e10, "memory_efficiency": 1,
    "memory_bytes": 2.4e10, "multiprocessors": 0, "intra_node_bandwidth": 3.6e9,
    "inter_node_bandwidth": 3.6e9, "intra_node_latency": 6e-5, "inter_node_latency": 6e-5,
    "op_overhead": 2e-7, "cores": 2, "gpu": false})",
                                              "cpu.json");
  SATDAR_CHECK(h.ok()) << h.status();
  return *h;
}

MemoryShape Shape(int dp, int tp, int pp, int ep, int64_t batch, int64_t seq, int64_t m,
                  bool gpu) {
  MemoryShape l;
  l.dp = dp;
  l.tp = tp;
  l.pp = pp;
  l.ep = ep;
  l.batch = batch;
  l.seq_len = seq;
  l.microbatches = m;
  l.mixed_precision = gpu;
  l.flash_attention = gpu;
  l.dtype_bytes = gpu ? 2 : 4;
  return l;
}

StepTime Time(const ModelConfig& c, const MemoryShape& l, const Hardware& hw, int per_node = 8,
              int threads = 1) {
  absl::StatusOr<StepCost> cost = PredictStep(c, l);
  SATDAR_CHECK(cost.ok()) << cost.status();
  absl::StatusOr<StepTime> t = PredictStepTime(c, l, *cost, hw, {per_node, threads});
  SATDAR_CHECK(t.ok()) << t.status();
  return *t;
}

double FullParameters(const ModelConfig& c) {
  absl::StatusOr<StepCost> cost = PredictStep(c, Shape(1, 1, 1, 1, 1, 16, 1, false));
  SATDAR_CHECK(cost.ok()) << cost.status();
  return static_cast<double>(cost->parameters.total);
}

TEST(StepTime, ExecutedFlopsAreTheModelFlopsOfMfu) {
  // Without recomputation the GEMMs and attention products a CPU step runs are the 6 N + 6 L T C
  // per token that MFU counts (norms and elementwise ops add well under 1%); a GPU's flash
  // backward recomputes the scores (7 L T C instead of 6).
  const ModelConfig c = Load("transformer-1.3b.json");
  const double tokens = 4.0 * 2048;
  const double model = FlopsPerToken(static_cast<int64_t>(FullParameters(c)), c, 2048) * tokens;
  const StepTime cpu = Time(c, Shape(1, 1, 1, 1, 4, 2048, 1, false), Cpu(), 1);
  EXPECT_NEAR(cpu.executed_flops / model, 1.0, 0.01);
  const StepTime gpu = Time(c, Shape(1, 1, 1, 1, 4, 2048, 1, true), Table("h100"));
  const double attention_extra = 1.0 * c.num_hidden_layers * 2048 * c.hidden_size * tokens;
  EXPECT_NEAR(gpu.executed_flops / (model + attention_extra), 1.0, 0.01);
}

TEST(StepTime, ExecutedFlopsCountActiveExpertsGatesAndDepthRetrievals) {
  // The MoE's top_k experts as grouped GEMMs and its router, SATFormer's gate, the DAR and
  // AttnRes depth retrievals: what MFU's formula counts for them, on every layout's rank 0
  // An untied input embedding is a lookup, not a GEMM: MFU's 6 per parameter counts it anyway
  // (as nanoGPT's estimate does), the roofline does not.
  for (const char* name : {"dar-moe-7b.json", "satformer-1.3b.json", "dar-1.3b.json",
                           "attnres-1.3b.json", "dar-full-1.3b.json"}) {
    const ModelConfig c = Load(name);
    const double lookup = c.tie_word_embeddings ? 0 : 6.0 * c.vocab_size * c.hidden_size;
    const double model =
        (FlopsPerToken(static_cast<int64_t>(FullParameters(c)), c, 256) - lookup) * 2.0 * 256;
    const StepTime t = Time(c, Shape(1, 1, 1, 1, 2, 256, 1, false), Cpu(), 1);
    EXPECT_NEAR(t.executed_flops / model, 1.0, 0.01) << name;
  }
}

TEST(StepTime, FullRecomputationRunsTheForwardAgain) {
  const ModelConfig c = Load("transformer-1.3b.json");
  MemoryShape l = Shape(1, 1, 1, 1, 4, 2048, 1, false);
  const StepTime none = Time(c, l, Cpu(), 1);
  l.recompute = Recompute::kFull;
  const StepTime full = Time(c, l, Cpu(), 1);
  // Forward is a third of forward + backward; the head and embedding are not recomputed.
  EXPECT_GT(full.executed_flops / none.executed_flops, 1.31);
  EXPECT_LT(full.executed_flops / none.executed_flops, 1.3334);
  EXPECT_GT(full.step_seconds, none.step_seconds);
}

TEST(StepTime, BubbleIsPipelineMinusOneOverVirtualStages) {
  const ModelConfig c = Load("transformer-1.3b.json");
  MemoryShape l = Shape(1, 1, 4, 1, 16, 2048, 8, true);
  const StepTime v1 = Time(c, l, Table("h200"));
  EXPECT_NEAR(v1.bubble_seconds, 3.0 * v1.compute_seconds / 8, 1e-12);
  l.virtual_stages = 2;
  const StepTime v2 = Time(c, l, Table("h200"));
  EXPECT_NEAR(v2.bubble_seconds, 1.5 * v2.compute_seconds / 8, 1e-12);
  EXPECT_LT(v2.bubble_seconds, 0.55 * v1.bubble_seconds);
  // More micro-batches: the same compute in smaller pieces, a smaller share of bubble.
  l.virtual_stages = 1;
  l.microbatches = 16;
  const StepTime m16 = Time(c, l, Table("h200"));
  EXPECT_LT(m16.bubble_seconds / m16.compute_seconds, v1.bubble_seconds / v1.compute_seconds);
  // A CPU's sends wait for the sender's next MPI call: two hops per stage boundary.
  const StepTime cpu = Time(c, Shape(1, 1, 4, 1, 16, 2048, 8, false), Cpu(), 4);
  EXPECT_NEAR(cpu.bubble_seconds, 2 * 3.0 * cpu.compute_seconds / 8, 1e-9);
}

TEST(StepTime, AGpuHidesThePlainGradientAllReduceBehindTheLastBackward) {
  const ModelConfig c = Load("transformer-1.3b.json");
  const MemoryShape l = Shape(8, 1, 1, 1, 8, 2048, 1, true);
  const StepTime overlapped = Time(c, l, Table("h100"));
  Hardware serial = Table("h100");
  serial.gpu = false;  // the same links, nothing overlapped
  const StepTime exposed = Time(c, l, serial);
  EXPECT_GT(exposed.data_seconds, 0.005);
  // Only what is reduced after the backward shows: the embedding with layer 0 (tied head)
  // and the final norm, about 1/8 of the 1.3B model's gradients here.
  EXPECT_GT(overlapped.data_seconds, 0);
  EXPECT_LT(overlapped.data_seconds, exposed.data_seconds / 4);
  // ZeRO-1's reduce-scatter and gather run after the backward (runtime/gradient_sync.cc).
  MemoryShape zero = l;
  zero.zero_stage = 1;
  EXPECT_GT(Time(c, zero, Table("h100")).data_seconds, 0.005);
}

TEST(StepTime, ExpertParallelismAcrossNodesIsSlowerThanInsideOne) {
  const ModelConfig c = Load("dar-moe-7b.json");
  const StepTime inside = Time(c, Shape(1, 1, 1, 8, 8, 4096, 4, true), Table("h200"));
  const StepTime across = Time(c, Shape(1, 1, 1, 16, 8, 4096, 4, true), Table("h200"));
  EXPECT_GT(inside.ep_seconds, 0);
  // NVLink 360 GB/s against InfiniBand 45 GB/s per GPU, for about the same bytes.
  EXPECT_GT(across.ep_seconds / inside.ep_seconds, 6);
}

TEST(StepTime, FullRecomputationRepeatsTheForwardsAllToAlls) {
  const ModelConfig c = Load("dar-moe-7b.json");
  MemoryShape l = Shape(1, 1, 1, 8, 8, 4096, 4, true);
  const StepTime none = Time(c, l, Table("h200"));
  l.recompute = Recompute::kFull;
  const StepTime full = Time(c, l, Table("h200"));
  EXPECT_NEAR(full.ep_seconds / none.ep_seconds, 1.5, 1e-9);  // 2 + 2 all-to-alls, then 2 + 4
}

TEST(StepTime, AGroupThatStraddlesNodesUsesTheSlowerLink) {
  // pp = 3 over 8-GPU nodes: stage blocks of 3 ranks do not tile a node, so some boundary
  // crosses InfiniBand; with 24 ranks a node (one node) every boundary stays on NVLink.
  const ModelConfig c = Load("dar-1.3b.json");
  const MemoryShape l = Shape(8, 1, 3, 1, 8, 4096, 8, true);
  const StepTime straddles = Time(c, l, Table("h200"), 8);
  const StepTime inside = Time(c, l, Table("h200"), 24);
  EXPECT_GT(straddles.pp_seconds, 5 * inside.pp_seconds);
}

TEST(StepTime, CpuRanksShareTheMachinesCores) {
  const ModelConfig c = Load("bench/transformer.json");
  const StepTime two = Time(c, Shape(2, 1, 1, 1, 4, 256, 1, false), Cpu(), 2);
  const StepTime four = Time(c, Shape(4, 1, 1, 1, 4, 256, 1, false), Cpu(), 4);
  EXPECT_NEAR(four.compute_seconds / two.compute_seconds, 2.0, 0.01);
  const StepTime threads = Time(c, Shape(1, 1, 1, 1, 4, 256, 1, false), Cpu(), 1, 2);
  const StepTime one = Time(c, Shape(1, 1, 1, 1, 4, 256, 1, false), Cpu(), 1, 1);
  EXPECT_LT(threads.compute_seconds, 0.51 * one.compute_seconds);
}

TEST(StepTime, RefusesTensorParallelismAcrossNodes) {
  const ModelConfig c = Load("transformer-1.3b.json");
  const MemoryShape l = Shape(1, 16, 1, 1, 4, 2048, 1, true);
  absl::StatusOr<StepCost> cost = PredictStep(c, l);
  ASSERT_TRUE(cost.ok()) << cost.status();
  absl::StatusOr<StepTime> t = PredictStepTime(c, l, *cost, Table("h100"), {8, 1});
  ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "tp 16 spans more than the 8 ranks of a node");
  t = PredictStepTime(c, Shape(12, 1, 1, 1, 4, 2048, 1, true), *cost, Table("h100"), {8, 1});
  EXPECT_EQ(t.status().message(), "12 ranks do not fill nodes of 8");
  const ModelConfig c24 = Load("dar-1.3b.json");  // 32 heads: tp 4 divides them, not a 6-GPU node
  absl::StatusOr<StepCost> c24_cost = PredictStep(c24, Shape(3, 4, 1, 1, 4, 2048, 1, true));
  ASSERT_TRUE(c24_cost.ok()) << c24_cost.status();
  t = PredictStepTime(c24, Shape(3, 4, 1, 1, 4, 2048, 1, true), *c24_cost, Table("h100"), {6, 1});
  EXPECT_EQ(t.status().message(),
            "tp 4 does not divide the 6 ranks of a node (a TP group would straddle two nodes)");
}

TEST(StepTime, MemoryByKindIsTheGpuTrainersUnderZero) {
  // The GPU trainer (runtime/engine.h on Cuda<float>) under ZeRO-1: bf16 weights, fp32
  // gradients in full plus the replica's slice, fp32 master weights in full, the moments
  // sharded over the 8 replicas.
  const ModelConfig c = Load("dar-1.3b.json");
  MemoryShape l = Shape(8, 1, 1, 1, 8, 4096, 8, true);
  l.zero_stage = 1;
  absl::StatusOr<StepCost> cost = PredictStep(c, l);
  ASSERT_TRUE(cost.ok()) << cost.status();
  const double p = static_cast<double>(cost->memory.parameters);
  EXPECT_EQ(cost->memory.parameter_bytes, static_cast<int64_t>(2 * p));
  EXPECT_EQ(cost->memory.gradient_bytes, static_cast<int64_t>(4 * p + 4 * p / 8));
  EXPECT_EQ(cost->memory.optimizer_bytes, static_cast<int64_t>(4 * p + 8 * p / 8));
  // The CPU's ZeRO-1 with EP (runtime/zero_partition.h): dense moments over dp x ep, the
  // experts' over dp.
  const ModelConfig moe = Load("dar-moe-7b.json");
  MemoryShape e = Shape(2, 1, 1, 4, 8, 64, 1, false);
  e.zero_stage = 1;
  absl::StatusOr<StepCost> ec = PredictStep(moe, e);
  ASSERT_TRUE(ec.ok()) << ec.status();
  const double total = static_cast<double>(ec->parameters.total);
  const double experts = static_cast<double>(ec->parameters.experts);
  EXPECT_EQ(ec->memory.optimizer_bytes,
            static_cast<int64_t>(((total - experts) / 8 + experts / 2) * 2 * 4));
}

TEST(Hardware, TableAndFiles) {
  const Hardware h200 = Table("h200");
  EXPECT_EQ(h200.peak_flops, 989e12);
  EXPECT_EQ(h200.memory_bytes, 143771.0 * 1048576);
  EXPECT_GT(h200.memory_bandwidth, Table("h100").memory_bandwidth);
  absl::StatusOr<Hardware> none = FindHardware("b200");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(none.status().message(), "no hardware named 'b200' (known: a100, h100, h200)");
  // A file round-trips every field.
  absl::StatusOr<Hardware> back = ParseHardware(HardwareToJson(h200), "h200.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(HardwareToJson(*back), HardwareToJson(h200));
  // Each bad field is named.
  auto error = [](const std::string& from, const std::string& to) {
    std::string text = HardwareToJson(Cpu());
    const size_t at = text.find(from);
    SATDAR_CHECK(at != std::string::npos) << from;
    text.replace(at, from.size(), to);
    absl::StatusOr<Hardware> h = ParseHardware(text, "cpu.json");
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << to;
    return std::string(h.status().message());
  };
  EXPECT_EQ(error("\"peak_flops\"", "\"peak_tflops\""), "cpu.json: field \"peak_flops\" is missing");
  EXPECT_EQ(error("\"gpu\": false", "\"gpu\": false, \"nvlink\": 1"), "cpu.json: unknown field \"nvlink\"");
  EXPECT_EQ(error("\"gemm_efficiency\": 1.0", "\"gemm_efficiency\": 1.5"),
            "cpu.json: field \"gemm_efficiency\" must be in (0, 1], got 1.5");
  EXPECT_EQ(error("\"memory_bandwidth\": 15000000000.0", "\"memory_bandwidth\": 0"),
            "cpu.json: field \"memory_bandwidth\" must be > 0, got 0");
  EXPECT_EQ(error("\"op_overhead\": 2e-07", "\"op_overhead\": -1"),
            "cpu.json: field \"op_overhead\" must be >= 0, got -1");
  EXPECT_EQ(error("\"gpu\": false", "\"gpu\": 0"), "cpu.json: field \"gpu\" must be true or false");
  EXPECT_EQ(error("\"cores\": 2", "\"cores\": 2.5"),
            "cpu.json: field \"cores\" must be an integer from 0 to 1048576");
  EXPECT_EQ(error("\"name\": \"cpu\"", "\"name\": \"\""),
            "cpu.json: field \"name\" must be a non-empty string");
}

Cluster OneNodeOfEightH200() {
  Cluster cluster;
  cluster.nodes = 1;
  cluster.ranks_per_node = 8;
  cluster.hardware = Table("h200");
  return cluster;
}

TEST(LayoutSearch, RanksFittingLayoutsOfTheClusterFastestFirst) {
  const ModelConfig c = Load("dar-1.3b.json");
  const Cluster cluster = OneNodeOfEightH200();
  SearchRequest request;
  request.global_batch = 64;
  request.seq_len = 4096;
  request.top = 1000;
  absl::StatusOr<SearchResult> r = SearchLayouts(c, cluster, request);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->best.empty());
  EXPECT_EQ(r->fitting, static_cast<int64_t>(r->best.size()));
  EXPECT_GE(r->tried, r->fitting);
  for (size_t i = 0; i < r->best.size(); ++i) {
    const MemoryShape& l = r->best[i].layout;
    EXPECT_EQ(l.dp * l.tp * l.pp * l.ep, 8);
    EXPECT_EQ(l.batch * l.dp * l.ep, 64);  // the same run for every layout
    EXPECT_TRUE(r->best[i].fits);
    EXPECT_LE(r->best[i].cost.memory.total(), kUsableMemory * cluster.hardware.memory_bytes);
    if (l.sequence_parallel) {
      EXPECT_GT(l.tp, 1);
    }
    if (l.dp * l.ep == 1) {
      EXPECT_EQ(l.zero_stage, 0);
    }
    if (i > 0) {
      EXPECT_GE(r->best[i - 1].tokens_per_second, r->best[i].tokens_per_second);
    }
    EXPECT_GT(r->best[i].mfu, 0.05);
    EXPECT_LT(r->best[i].mfu, 0.8);
  }
  // The winner beats a layout users would try by hand, predicted the same way.
  MemoryShape manual = Shape(8, 1, 1, 1, 8, 4096, 8, true);
  manual.zero_stage = 1;
  absl::StatusOr<Candidate> by_hand = PredictLayout(c, manual, cluster.hardware, {8, 1});
  ASSERT_TRUE(by_hand.ok()) << by_hand.status();
  EXPECT_GE(r->best[0].tokens_per_second, by_hand->tokens_per_second);
  // Top keeps the fastest.
  request.top = 3;
  absl::StatusOr<SearchResult> top = SearchLayouts(c, cluster, request);
  ASSERT_TRUE(top.ok());
  ASSERT_EQ(top->best.size(), 3u);
  EXPECT_EQ(top->best[0].tokens_per_second, r->best[0].tokens_per_second);
}

// The search proposes only what `satdar train --device cuda` runs: here a tp=8 rank would
// hold (8 / 8) x 48 = 48 elements of gate_proj, not a multiple of the device table's 32.
TEST(LayoutSearch, LeavesOutSplitsTheGpuKernelsRefuse) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      R"({"vocab_size": 64, "hidden_size": 48, "intermediate_size": 8,
          "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8,
          "max_position_embeddings": 128})",
      "tiny.json");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(CheckDeviceSupport(*c, 4).ok());
  ASSERT_FALSE(CheckDeviceSupport(*c, 8).ok());
  const Cluster cluster = OneNodeOfEightH200();
  SearchRequest request;
  request.global_batch = 8;
  request.seq_len = 64;
  request.top = 1000;
  absl::StatusOr<SearchResult> r = SearchLayouts(*c, cluster, request);
  ASSERT_TRUE(r.ok()) << r.status();
  bool tp4 = false;
  for (const Candidate& k : r->best) {
    EXPECT_NE(k.layout.tp, 8);
    tp4 |= k.layout.tp == 4;
  }
  EXPECT_TRUE(tp4);  // the rule leaves the other splits
  // One sequence per step over 8 ranks of a one-layer model leaves only tp=8: nothing runs,
  // and the error says why.
  request.global_batch = 1;
  absl::StatusOr<SearchResult> none = SearchLayouts(*c, cluster, request);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << none.status();
  EXPECT_NE(none.status().message().find(
                "the GPU kernels cannot take tp=8: device cuda: (intermediate_size / "
                "tensor-parallel size) x hidden_size = (8 / 8) x 48 must be a multiple of 32"),
            std::string::npos)
      << none.status();
}

TEST(LayoutSearch, SaysWhatDoesNotFitOrCannotRun) {
  const ModelConfig c = Load("dar-moe-7b.json");
  Cluster one_gpu;
  one_gpu.nodes = 1;
  one_gpu.ranks_per_node = 1;
  one_gpu.hardware = Table("a100");
  SearchRequest request;
  request.global_batch = 8;
  request.seq_len = 4096;
  absl::StatusOr<SearchResult> r = SearchLayouts(c, one_gpu, request);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("layouts fits in 72.0 GiB per GPU (90% of NVIDIA A100 SXM4 80 GB)"),
            std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("use more nodes or a smaller batch or sequence"),
            std::string::npos);
  request.batch_per_replica = 4;  // both batches
  EXPECT_EQ(SearchLayouts(c, one_gpu, request).status().message(),
            "give either the global batch or the batch per replica");
  // 3 GPUs: no tp, pp or ep of this config uses them all but dp = 3, and 8 sequences do not
  // divide over 3 replicas.
  request.batch_per_replica = 0;
  one_gpu.ranks_per_node = 3;
  r = SearchLayouts(c, one_gpu, request);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no layout of 1 x 3 ranks can run this config"),
            std::string::npos) << r.status();
}

}  // namespace
}  // namespace satdar::model
