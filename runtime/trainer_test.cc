// Training-loop tests: learning on real text, exact resume, micro-batch equivalence,
// checkpoint corruption, the learning-rate schedule and samples during training.
#include "runtime/trainer.h"

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint.h"
#include "runtime/decode_session.h"

namespace satdar::runtime {
namespace {

using core::testing::TestTmpDir;

model::ModelConfig SmallConfig() {
  model::ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  return c;
}

TrainOptions Options(const std::string& name) {
  TrainOptions o;
  o.config = SmallConfig();
  o.steps = 6;
  o.batch_size = 4;
  o.seq_len = 16;
  o.threads = 2;
  o.synthetic_data = true;
  o.quiet = true;
  o.log_jsonl = TestTmpDir(name) + "/log.jsonl";
  std::remove(o.log_jsonl.c_str());
  return o;
}

std::vector<nlohmann::json> ReadLog(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Trainer, LossFallsOnText) {
  std::string dir = TestTmpDir("text");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/a.txt", text).ok());
  TrainOptions o = Options("text_log");
  o.synthetic_data = false;
  o.data_dir = dir;
  o.steps = 30;
  o.lr = 1e-2;
  o.warmup_steps = 3;
  auto s = Train(o);
  ASSERT_TRUE(s.ok()) << s.status();
  auto log = ReadLog(o.log_jsonl);
  ASSERT_EQ(log.size(), 30u);
  for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_second"}) {
    EXPECT_TRUE(log[0].contains(key)) << key;
  }
  EXPECT_NEAR(log[0]["loss"].get<double>(), std::log(256.0), 0.3);
  EXPECT_LT(s->final_loss, 0.6 * log[0]["loss"].get<double>());
  EXPECT_GT(s->peak_rss_bytes, 0);
}

TEST(Trainer, ResumeReproducesLossesExactly) {
  TrainOptions full = Options("full");
  ASSERT_TRUE(Train(full).ok());
  auto expected = ReadLog(full.log_jsonl);

  TrainOptions part = Options("part");
  part.checkpoint_dir = TestTmpDir("ckpt");
  part.checkpoint_every = 3;
  ASSERT_TRUE(Train(part).ok());
  // Simulate a crash after step 3: the step-6 checkpoint never happened.
  ASSERT_EQ(std::remove(CheckpointPath(part.checkpoint_dir, 6).c_str()), 0);
  TrainOptions resumed = part;
  resumed.resume = true;
  resumed.log_jsonl = TestTmpDir("resumed") + "/log.jsonl";
  std::remove(resumed.log_jsonl.c_str());
  ASSERT_TRUE(Train(resumed).ok());
  auto got = ReadLog(resumed.log_jsonl);
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]["step"], expected[3 + i]["step"]);
    EXPECT_EQ(got[i]["loss"].get<double>(), expected[3 + i]["loss"].get<double>()) << i;
    EXPECT_EQ(got[i]["grad_norm"].get<double>(), expected[3 + i]["grad_norm"].get<double>());
  }
}

TEST(Trainer, ResumeRejectsChangedFlagsAndCorruption) {
  TrainOptions o = Options("guard");
  o.checkpoint_dir = TestTmpDir("guard_ckpt");
  o.steps = 2;
  ASSERT_TRUE(Train(o).ok());
  TrainOptions changed = o;
  changed.resume = true;
  changed.lr = 5e-3;
  auto s = Train(changed);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("was written with lr 0.001, this run has 0.005"),
            std::string::npos)
      << s.status();
  TrainOptions other_model = o;
  other_model.resume = true;
  other_model.config.intermediate_size = 96;
  s = Train(other_model);
  EXPECT_NE(s.status().message().find("different model config"), std::string::npos);
  // Flip one byte near the end (inside a tensor) and resume.
  std::string path = CheckpointPath(o.checkpoint_dir, 2);
  auto bytes = core::ReadFileToString(path, core::kNoSizeLimit);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - 5] ^= 0x40;
  ASSERT_TRUE(core::WriteFileAtomically(path, *bytes).ok());
  TrainOptions again = o;
  again.resume = true;
  s = Train(again);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("checksum mismatch"), std::string::npos) << s.status();
}

TEST(Trainer, MicrobatchesMatchOneBatch) {
  TrainOptions one = Options("mb1");
  one.f64 = true;
  one.steps = 3;
  ASSERT_TRUE(Train(one).ok());
  TrainOptions two = one;
  two.microbatches = 2;
  two.log_jsonl = TestTmpDir("mb2") + "/log.jsonl";
  std::remove(two.log_jsonl.c_str());
  ASSERT_TRUE(Train(two).ok());
  auto a = ReadLog(one.log_jsonl), b = ReadLog(two.log_jsonl);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-12);
    EXPECT_NEAR(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>(), 1e-12);
  }
}

TEST(Trainer, LearningRateSchedule) {
  TrainOptions o;
  o.steps = 110;
  o.warmup_steps = 10;
  o.lr = 1.0;
  o.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(o, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, 10), 1.0);
  EXPECT_NEAR(LearningRate(o, 60), 0.55, 1e-12);  // half way through the cosine
  EXPECT_NEAR(LearningRate(o, 110), 0.1, 1e-12);
}

// Every sample_every-th step and the last: the sampler gets a copy of the whole model's weights,
// the log line carries its text, and the run computes bit for bit what it computes without.
TEST(Trainer, SamplesAtTheirStepsWithoutChangingTheRun) {
  TrainOptions plain = Options("sample_plain");
  plain.steps = 5;
  ASSERT_TRUE(Train(plain).ok());
  TrainOptions sampled = Options("sample_on");
  sampled.steps = 5;
  sampled.sample_every = 2;
  std::vector<int64_t> steps;
  std::vector<std::vector<float>> weights;
  sampled.sample = [&](int64_t step, std::vector<float> w) -> absl::StatusOr<std::string> {
    steps.push_back(step);
    weights.push_back(std::move(w));
    return absl::StrCat("text of step ", step);
  };
  auto s = Train(sampled);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 5}));
  auto table = model::BuildParamTable(sampled.config, model::Sharding{});
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(weights.size(), 3u);
  for (const std::vector<float>& w : weights) {
    ASSERT_EQ(static_cast<int64_t>(w.size()), table->size());
    for (float v : w) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_NE(weights[0], weights[1]);  // two steps trained in between
  const auto a = ReadLog(plain.log_jsonl), b = ReadLog(sampled.log_jsonl);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << i;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << i;
    const int64_t step = b[i]["step"].get<int64_t>();
    const bool due = step == 2 || step == 4 || step == 5;
    ASSERT_EQ(b[i].contains("sample"), due) << step;
    if (due) {
      EXPECT_EQ(b[i]["sample"], absl::StrCat("text of step ", step));
    }
  }
  EXPECT_EQ(s->final_loss, a.back()["loss"].get<double>());
}

// The weights handed over are the step's, in the layout a decode session takes, also when the
// run pads the vocabulary (vocab_multiple): they equal what the step's checkpoint holds.
TEST(Trainer, SampledWeightsAreTheCheckpointsAndDecode) {
  for (int multiple : {1, 3}) {
    SCOPED_TRACE(multiple);
    TrainOptions o = Options(absl::StrCat("sample_ckpt", multiple));
    o.config.max_position_embeddings = 16;  // the decode cache's room
    o.steps = 3;
    o.vocab_multiple = multiple;  // 256 rows padded to 258 inside the model
    o.checkpoint_dir = TestTmpDir(absl::StrCat("sample_ckpt_dir", multiple));
    o.sample_every = 3;
    std::vector<float> last;
    o.sample = [&](int64_t, std::vector<float> w) -> absl::StatusOr<std::string> {
      last = std::move(w);
      return std::string("x");
    };
    ASSERT_TRUE(Train(o).ok());
    auto table = model::BuildParamTable(o.config, model::Sharding{});
    ASSERT_TRUE(table.ok());
    std::vector<float> stored(table->size());
    auto info = LoadCheckpoint<float>(CheckpointPath(o.checkpoint_dir, 3),
                                      model::ModelConfigToJson(o.config), *table,
                                      {&stored, nullptr, nullptr});
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(last, stored);
    auto session = DecodeSession::FromParams(o.config, last, 1);
    ASSERT_TRUE(session.ok()) << session.status();
    const std::vector<int32_t> prompt = {116, 104, 101};
    const absl::Status begun = (*session)->Begin(1, 4);
    ASSERT_TRUE(begun.ok()) << begun;
    std::vector<double> logits;
    const absl::Status stepped = (*session)->Step(prompt.data(), 1, 3, false, &logits);
    ASSERT_TRUE(stepped.ok()) << stepped;
    ASSERT_EQ(logits.size(), 256u);
    for (double v : logits) EXPECT_TRUE(std::isfinite(v));
  }
}

// A sample that fails is reported in the log; the training goes on.
TEST(Trainer, AFailedSampleDoesNotStopTheRun) {
  TrainOptions o = Options("sample_fails");
  o.steps = 2;
  o.sample_every = 1;
  o.sample = [](int64_t, std::vector<float>) -> absl::StatusOr<std::string> {
    return absl::InternalError("the tokenizer's process is gone");
  };
  ASSERT_TRUE(Train(o).ok());
  const auto log = ReadLog(o.log_jsonl);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1]["sample_error"], "the tokenizer's process is gone");
  EXPECT_FALSE(log[1].contains("sample"));
}

// Rank 0 of a tensor-parallel run holds a slice of every matrix: refused before any rank talks.
TEST(Trainer, SamplesNeedRankZeroToHoldTheWholeModel) {
  TrainOptions o = Options("sample_tp");
  o.mesh.tp = 2;
  o.sample_every = 1;
  o.sample = [](int64_t, std::vector<float>) -> absl::StatusOr<std::string> { return ""; };
  auto s = Train(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("sample_every decodes the whole model"), std::string::npos)
      << s.status();
  EXPECT_NE(s.status().message().find("tp 2"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace satdar::runtime
