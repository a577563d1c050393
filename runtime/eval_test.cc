// satdar eval: the gate ablations and the analysis statistics.
#include "runtime/eval.h"

#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "core/safetensors.h"
#include "core/testing/tmp_dir.h"
#include "data/shard.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "runtime/trainer.h"

namespace satdar::runtime {
namespace {

using core::testing::TestTmpDir;

model::ModelConfig SatConfig() {
  auto c = model::ParseModelConfig(
      R"({"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "max_position_embeddings": 512,
          "num_attention_heads": 4, "num_key_value_heads": 2, "value_residual": "satformer",
          "residual": "dar", "block_size": 4})",
      "test");
  SATDAR_CHECK(c.ok()) << c.status();
  return *c;
}

// Writes the model's initial weights, with every SATFormer gate weight scaled by `gate_scale`.
std::string WriteWeights(const model::ModelConfig& c, double gate_scale, const std::string& name) {
  core::ThreadPool pool(1);
  auto model = model::CreateModel<float>(c, &pool);
  SATDAR_CHECK(model.ok());
  const model::ParamTable& t = (*model)->params();
  std::vector<float> p(t.size());
  t.Initialize(p.data(), 7);
  std::vector<core::TensorRef> refs;
  for (const auto& spec : t.specs()) {
    if (spec.name.find("value_gate") != std::string::npos) {
      for (int64_t i = 0; i < spec.numel; ++i) p[spec.offset + i] *= static_cast<float>(gate_scale);
    }
    refs.push_back({spec.name, core::DType::kF32, spec.shape, p.data() + spec.offset});
  }
  std::string path = TestTmpDir("eval") + "/" + name;
  SATDAR_CHECK(core::WriteSafetensors(path, refs, {}).ok());
  return path;
}

EvalOptions Options(const std::string& weights) {
  EvalOptions o;
  o.config = SatConfig();
  o.weights = weights;
  o.synthetic_data = true;
  o.batch_size = 2;
  o.seq_len = 16;
  o.batches = 3;
  o.threads = 2;
  o.f64 = true;
  return o;
}

// A prepared dataset (data/dataset.h) of random ids in [1, 64) with `val_tokens` validation
// tokens, one document per split (ending with the EOS id 0).
std::string WriteDataset(const std::string& name, int val_tokens) {
  const std::string dir = TestTmpDir(name);
  std::mt19937 gen(3);
  auto ids = [&](int n) {
    std::vector<uint32_t> t(n);
    for (uint32_t& x : t) x = 1 + gen() % 63;
    t.back() = 0;
    return t;
  };
  SATDAR_CHECK(data::WriteShard(dir + "/train_00000.bin", ids(500), {0}, 2, 64).ok());
  SATDAR_CHECK(data::WriteShard(dir + "/val_00000.bin", ids(val_tokens), {0}, 2, 64).ok());
  SATDAR_CHECK(core::WriteFileAtomically(dir + "/tokenizer.model", "not read by eval").ok());
  const nlohmann::json manifest = {
      {"version", 1}, {"tokenizer", "tokenizer.model"}, {"vocab_size", 64}, {"token_bytes", 2},
      {"eos_id", 0},
      {"shards",
       {{{"file", "train_00000.bin"}, {"split", "train"}, {"tokens", 500}, {"documents", 1}},
        {{"file", "val_00000.bin"}, {"split", "val"}, {"tokens", val_tokens}, {"documents", 1}}}}};
  SATDAR_CHECK(core::WriteFileAtomically(dir + "/manifest.json", manifest.dump()).ok());
  return dir;
}

// `satdar eval --data DATASET` scores each sequence of the validation split at most once:
// --batches beyond the split is capped (and says how much it scored) unless repeat is asked.
TEST(Eval, AValidationSplitIsScoredAtMostOnceUnlessRepeated) {
  EvalOptions o = Options(WriteWeights(SatConfig(), 1.0, "split.safetensors"));
  o.synthetic_data = false;
  o.data_dir = WriteDataset("eval_split", 107);  // (107 - 1) / 16 = 6 windows of 16 + 1 tokens
  o.batch_size = 4;
  o.batches = 8;  // asks for 32 sequences
  auto r = Evaluate(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["sequences"], 6);
  EXPECT_EQ((*r)["batches"], 2);  // 4 + a last batch of 2
  EXPECT_EQ((*r)["tokens"], 6 * 16);
  EXPECT_EQ((*r)["split_tokens"], 107);
  EXPECT_EQ((*r)["split_sequences"], 6);
  // The short last batch weighs what it holds: the loss of one sequence at a time.
  EvalOptions single = o;
  single.batch_size = 1;
  single.batches = 1000;
  auto one = Evaluate(single);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)["sequences"], 6);
  EXPECT_NEAR((*one)["loss"].get<double>(), (*r)["loss"].get<double>(), 1e-12);
  // Fewer batches than the split holds: exactly those.
  o.batches = 1;
  auto part = Evaluate(o);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ((*part)["sequences"], 4);
  EXPECT_EQ((*part)["tokens"], 4 * 16);
  // Asked to repeat: 12 sequences are the split twice, so the same mean.
  o.batches = 3;
  o.repeat = true;
  auto twice = Evaluate(o);
  ASSERT_TRUE(twice.ok()) << twice.status();
  EXPECT_EQ((*twice)["sequences"], 12);
  EXPECT_EQ((*twice)["tokens"], 12 * 16);
  EXPECT_NEAR((*twice)["loss"].get<double>(), (*r)["loss"].get<double>(), 1e-12);
}

TEST(Eval, ZeroAblationEqualsClosedGates) {
  const model::ModelConfig c = SatConfig();
  EvalOptions o = Options(WriteWeights(c, 10.0, "open.safetensors"));
  o.gate_ablation = "zero";
  auto ablated = Evaluate(o);
  ASSERT_TRUE(ablated.ok()) << ablated.status();
  // With W_alpha = 0 every gate is ReLU(0) = 0: the same as zeroing them.
  EvalOptions closed = Options(WriteWeights(c, 0.0, "closed.safetensors"));
  auto reference = Evaluate(closed);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_NEAR((*ablated)["ablated_loss"].get<double>(), (*reference)["loss"].get<double>(), 1e-12);
  EXPECT_GT(std::fabs((*ablated)["loss_change"].get<double>()), 1e-6);
  // The statistics of the live gates: mean and fraction of exact zeros per layer and KV head.
  const auto& stats = (*ablated)["stats"];
  ASSERT_EQ(stats["satformer_gate_mean"].size(), 2u);     // layers 2..L
  ASSERT_EQ(stats["satformer_gate_mean"][0].size(), 2u);  // KV heads
  for (const auto& layer : stats["satformer_gate_zero_fraction"]) {
    for (const auto& z : layer) {
      EXPECT_GT(z.get<double>(), 0.1);  // ReLU closes part of the gates
      EXPECT_LT(z.get<double>(), 0.9);
    }
  }
  EXPECT_TRUE(stats.contains("dar_depth_weights"));
  EXPECT_TRUE(stats.contains("dar_mix"));
}

TEST(Eval, MeanAblationChangesTheLossAndKeepsTheMean) {
  EvalOptions o = Options(WriteWeights(SatConfig(), 10.0, "mean.safetensors"));
  o.gate_ablation = "mean";
  auto r = Evaluate(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE((*r)["ablated_loss"].get<double>(), (*r)["loss"].get<double>());
  EXPECT_TRUE(std::isfinite((*r)["ablated_loss"].get<double>()));
}

TEST(Eval, AblationNeedsGates) {
  model::ModelConfig c = SatConfig();
  c.value_residual = model::ValueResidualKind::kNone;
  EvalOptions o = Options(WriteWeights(c, 1.0, "nogates.safetensors"));
  o.config = c;
  o.gate_ablation = "zero";
  auto r = Evaluate(o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("gates exist only with \"satformer\""), std::string::npos);
}

// Weights holding NaN are refused before any batch runs, naming the first tensor that holds one.
TEST(Eval, WeightsThatAreNotFiniteAreRefused) {
  const std::string path = WriteWeights(SatConfig(), std::nan(""), "nan.safetensors");
  core::ThreadPool pool(1);
  auto model = model::CreateModel<float>(SatConfig(), &pool);
  ASSERT_TRUE(model.ok());
  std::string first_gate;
  for (const auto& spec : (*model)->params().specs()) {
    if (spec.name.find("value_gate") != std::string::npos) {
      first_gate = spec.name;
      break;
    }
  }
  ASSERT_FALSE(first_gate.empty());
  auto r = Evaluate(Options(path));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "weights: " + path + ": tensor '" + first_gate +
                                      "' holds NaN (element 0); weights must be finite numbers");
}

TEST(Eval, TrainerLogsStatistics) {
  TrainOptions o;
  o.config = SatConfig();
  o.config.moe = model::MoeConfig{4, 2, 16, 0, 0.01, 0.001, false};
  o.steps = 4;
  o.batch_size = 2;
  o.seq_len = 8;
  o.threads = 2;
  o.synthetic_data = true;
  o.quiet = true;
  o.stats_every = 2;
  o.log_jsonl = TestTmpDir("stats") + "/log.jsonl";
  std::remove(o.log_jsonl.c_str());
  ASSERT_TRUE(Train(o).ok());
  std::ifstream in(o.log_jsonl);
  std::string line;
  int with_stats = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("stats")) continue;
    ++with_stats;
    const auto& s = j["stats"];
    for (const char* key : {"satformer_gate_mean", "dar_depth_weights", "dar_transport",
                            "dar_write", "moe_expert_load", "moe_dropped_tokens"}) {
      EXPECT_TRUE(s.contains(key)) << key;
    }
    // Two steps of 16 tokens, top-2: 64 assignments per layer since the last report.
    int64_t routed = 0;
    for (const auto& e : s["moe_expert_load"][0]) routed += e.get<int64_t>();
    EXPECT_EQ(routed, 2 * 16 * 2);
  }
  EXPECT_EQ(with_stats, 2);
}

}  // namespace
}  // namespace satdar::runtime
