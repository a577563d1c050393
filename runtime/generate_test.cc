// Sampling (NextToken) against its definition, and Generate over the KV cache against greedy
// decoding by full forward passes (no cache) in f64, for a tiny model of several designs with
// random weights. The f64 session comes from DecodeSession::FromParams's std::vector<double>
// overload.
#include "runtime/generate.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/ops/gemm.h"
#include "core/ops/gradcheck_testutil.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "runtime/decode_session.h"

namespace satdar::runtime {
namespace {

using core::testing::RandomVector;

std::string TinyConfig(const std::string& extra) {
  return R"({"vocab_size": 11, "hidden_size": 8, "intermediate_size": 12,
             "num_hidden_layers": 3, "max_position_embeddings": 32, "num_attention_heads": 2,
             "num_key_value_heads": 1)" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

// Initial weights moved off their init values (no path switched off), as the gradient checks.
std::vector<double> NoisedParams(const model::ParamTable& table) {
  std::vector<double> params(table.size());
  table.Initialize(params.data(), 3);
  std::vector<double> noise = RandomVector(params.size(), 99, 0.5);
  for (size_t i = 0; i < params.size(); ++i) params[i] += noise[i];
  return params;
}

// ---- NextToken -------------------------------------------------------------------------------

TEST(NextToken, GreedyTakesTheLowestIdOnTies) {
  SamplingOptions o;
  std::mt19937_64 rng(1);
  const std::vector<double> l = {1, 3, 3, 2};
  EXPECT_EQ(NextToken(l.data(), 4, o, &rng), 1);
  const std::vector<double> first = {5, 5, -1};
  EXPECT_EQ(NextToken(first.data(), 3, o, &rng), 0);
  // Greedy draws nothing from the generator.
  std::mt19937_64 fresh(1);
  EXPECT_EQ(rng(), fresh());
}

TEST(NextToken, TopK1AndTinyTopPAreGreedy) {
  std::mt19937_64 rng(5);
  SamplingOptions greedy;
  SamplingOptions k1;
  k1.temperature = 1.5;
  k1.top_k = 1;
  SamplingOptions p0;
  p0.temperature = 1.5;
  p0.top_p = 1e-9;
  for (int row = 0; row < 50; ++row) {
    std::vector<double> l = RandomVector(13, 100 + row, 2.0);
    if (row % 5 == 0) l[7] = l[3] = 10;  // a tie at the top: the lower id
    const int32_t want = NextToken(l.data(), 13, greedy, &rng);
    EXPECT_EQ(NextToken(l.data(), 13, k1, &rng), want) << row;
    EXPECT_EQ(NextToken(l.data(), 13, p0, &rng), want) << row;
    if (row % 5 == 0) {
      EXPECT_EQ(want, 3);
    }
  }
}

TEST(NextToken, SeededDrawsRepeat) {
  SamplingOptions o;
  o.temperature = 1;
  const std::vector<double> l = RandomVector(20, 8, 1.0);
  std::mt19937_64 a = PromptRng(7, 3), b = PromptRng(7, 3), c = PromptRng(7, 4);
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 64; ++i) {
    da.push_back(NextToken(l.data(), 20, o, &a));
    db.push_back(NextToken(l.data(), 20, o, &b));
    dc.push_back(NextToken(l.data(), 20, o, &c));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);  // another prompt's stream
}

// Counts of `draws` samples, and the chi-square statistic against the expected probabilities.
double ChiSquare(const std::vector<double>& logits, const SamplingOptions& o,
                 const std::vector<double>& expected, int draws) {
  std::mt19937_64 rng = PromptRng(11, 0);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    ++counts[NextToken(logits.data(), static_cast<int>(logits.size()), o, &rng)];
  }
  double chi2 = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = expected[i] * draws;
    if (e == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

std::vector<double> Softmax(const std::vector<double>& l, double t, const std::vector<int>& keep) {
  std::vector<double> p(l.size(), 0.0);
  double sum = 0;
  for (int i : keep) sum += p[i] = std::exp(l[i] / t);
  for (double& v : p) v /= sum;
  return p;
}

TEST(NextToken, SampleFrequenciesFollowTheSoftmax) {
  const std::vector<double> l = {0.5, -1, 2, 0, 1};
  const int draws = 40000;
  SamplingOptions o;
  o.temperature = 0.8;
  // 4 degrees of freedom: 25 is beyond the 0.99995 quantile (the draws are deterministic).
  EXPECT_LT(ChiSquare(l, o, Softmax(l, 0.8, {0, 1, 2, 3, 4}), draws), 25);
  // top-k 2: ids 2 and 4 only, renormalised.
  o.top_k = 2;
  EXPECT_LT(ChiSquare(l, o, Softmax(l, 0.8, {2, 4}), draws), 12);
  // top-p: probabilities at T=0.8 are about .099, .015, .647, .053, .185 (ids 0..4): 0.6 needs
  // id 2 alone, 0.7 ids 2 and 4 (.832), 0.9 also id 0 (.931).
  o.top_k = 0;
  o.top_p = 0.6;
  EXPECT_EQ(ChiSquare(l, o, Softmax(l, 0.8, {2}), draws), 0);
  o.top_p = 0.7;
  EXPECT_LT(ChiSquare(l, o, Softmax(l, 0.8, {2, 4}), draws), 12);
  o.top_p = 0.9;
  EXPECT_LT(ChiSquare(l, o, Softmax(l, 0.8, {2, 4, 0}), draws), 15);
}

// ---- Generate --------------------------------------------------------------------------------

struct Design {
  std::string name;
  std::string json;
};

class GenerateDesign : public ::testing::TestWithParam<Design> {
 protected:
  void SetUp() override {
    core::cpu::InitBlas();
    auto config = model::ParseModelConfig(TinyConfig(GetParam().json), GetParam().name);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto m = model::CreateModel<double>(config_, &pool_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    params_ = NoisedParams(model_->params());
    auto s = DecodeSession::FromParams(config_, params_, 2);
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
  }

  // Greedy decoding without a cache: a full forward pass over the growing prefix each step.
  std::vector<int32_t> Reference(std::vector<int32_t> prefix, int n, int eos) {
    std::vector<int32_t> out, pred;
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> tokens = prefix;
      tokens.push_back(0);  // a target for the last position (its loss is not read)
      const int t = static_cast<int>(prefix.size());
      EXPECT_TRUE(model_->Forward(params_.data(), tokens.data(), 1, t).ok());
      model_->Predictions(&pred);
      const int32_t id = pred.back();
      out.push_back(id);
      prefix.push_back(id);
      if (id == eos) break;
    }
    return out;
  }

  core::ThreadPool pool_{2};
  model::ModelConfig config_;
  std::unique_ptr<model::Model<double>> model_;
  std::vector<double> params_;
  std::unique_ptr<DecodeSession> session_;
};

TEST_P(GenerateDesign, GreedyEqualsFullForwardPasses) {
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 6, 7, 1}, {3, 9, 4, 4}, {8}, {1, 2, 3, 4, 5, 6, 7}, {10, 0, 9, 6}};
  SamplingOptions o;
  o.max_new_tokens = 8;
  o.eos_id = -1;  // never stops early: every step is compared
  std::map<int, std::vector<int32_t>> streamed;
  auto r = Generate(session_.get(), prompts, o,
                    [&](int p, int32_t id) { streamed[p].push_back(id); });
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->ids.size(), prompts.size());
  EXPECT_EQ(r->new_tokens, 8 * static_cast<int64_t>(prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(r->ids[i], Reference(prompts[i], 8, -1)) << "prompt " << i;
    EXPECT_EQ(streamed[static_cast<int>(i)], r->ids[i]) << "prompt " << i;
    // The same alone (a batch of one) as among prompts of equal and other lengths.
    auto alone = Generate(session_.get(), {prompts[i]}, o, nullptr);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(alone->ids[0], r->ids[i]) << "prompt " << i;
  }
}

TEST_P(GenerateDesign, StopsAfterEos) {
  const std::vector<int32_t> prompt = {4, 7, 2, 9};
  const std::vector<int32_t> full = Reference(prompt, 6, -1);
  SamplingOptions o;
  o.max_new_tokens = 6;
  o.eos_id = full[2];  // stops at its first occurrence, which it keeps
  std::vector<int32_t> want;
  for (int32_t id : full) {
    want.push_back(id);
    if (id == o.eos_id) break;
  }
  auto r = Generate(session_.get(), {prompt, {3, 3, 3, 3}}, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ids[0], want);
  EXPECT_EQ(r->ids[1], Reference({3, 3, 3, 3}, 6, o.eos_id));
}

TEST_P(GenerateDesign, SamplingDoesNotDependOnTheBatch) {
  SamplingOptions o;
  o.max_new_tokens = 10;
  o.temperature = 1.3;
  o.top_k = 8;
  o.top_p = 0.95;
  o.seed = 42;
  o.eos_id = -1;
  const std::vector<int32_t> a = {5, 6, 7}, b = {1, 9, 4}, c = {2, 8, 3, 3, 0};
  auto together = Generate(session_.get(), {a, b}, o, nullptr);  // a batch of two
  auto apart = Generate(session_.get(), {a, c}, o, nullptr);     // two batches of one
  ASSERT_TRUE(together.ok()) << together.status();
  ASSERT_TRUE(apart.ok()) << apart.status();
  EXPECT_EQ(together->ids[0], apart->ids[0]);
  auto again = Generate(session_.get(), {a, b}, o, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ids, together->ids);
  o.seed = 43;
  auto other = Generate(session_.get(), {a, b}, o, nullptr);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->ids, together->ids);
}

INSTANTIATE_TEST_SUITE_P(
    Designs, GenerateDesign,
    ::testing::Values(Design{"transformer", ""},
                      Design{"satformer", R"("value_residual": "satformer")"},
                      Design{"dar", R"("residual": "dar")"}),
    [](const ::testing::TestParamInfo<Design>& info) { return info.param.name; });

TEST(Generate, RefusesBadPrompts) {
  core::cpu::InitBlas();
  auto config = model::ParseModelConfig(TinyConfig(""), "tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  auto table = model::BuildParamTable(*config, model::Sharding{});
  ASSERT_TRUE(table.ok()) << table.status();
  auto session = DecodeSession::FromParams(*config, NoisedParams(*table), 1);
  ASSERT_TRUE(session.ok()) << session.status();
  SamplingOptions o;
  o.max_new_tokens = 4;
  auto expect = [&](const std::vector<std::vector<int32_t>>& prompts, const std::string& text) {
    int calls = 0;
    auto r = Generate(session->get(), prompts, o, [&](int, int32_t) { ++calls; });
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(std::string(r.status().message()).find(text), std::string::npos) << r.status();
    EXPECT_EQ(calls, 0);  // refused before any decoding
  };
  expect({{1, 2}, {}}, "prompt 1: empty");
  expect({{1, 11}}, "prompt 0: id 11 at position 1 is outside [0, 11)");
  expect({{4}, {-1}}, "prompt 1: id -1");
  // window 32: 28 + 4 fits, 29 + 4 does not.
  EXPECT_TRUE(Generate(session->get(), {std::vector<int32_t>(28, 3)}, o, nullptr).ok());
  expect({{5}, std::vector<int32_t>(29, 3)}, "prompt 1: 29 tokens and max_new_tokens 4 pass");
  o.top_p = 0;
  expect({{5}}, "top_p");
  o.top_p = 1;
  o.temperature = -1;
  expect({{5}}, "temperature");
  // The parameter count is checked.
  auto bad = DecodeSession::FromParams(*config, std::vector<float>(3, 0.f), 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Generate, NothingToGenerate) {
  auto config = model::ParseModelConfig(TinyConfig(""), "tiny");
  ASSERT_TRUE(config.ok());
  auto table = model::BuildParamTable(*config, model::Sharding{});
  ASSERT_TRUE(table.ok());
  std::vector<double> p = NoisedParams(*table);
  auto session = DecodeSession::FromParams(*config, std::vector<float>(p.begin(), p.end()), 1);
  ASSERT_TRUE(session.ok()) << session.status();
  SamplingOptions o;
  o.max_new_tokens = 0;
  auto r = Generate(session->get(), {{1, 2, 3}}, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ids[0].empty());
  EXPECT_EQ(r->new_tokens, 0);
  // And in f32: one greedy token of a prompt.
  o.max_new_tokens = 1;
  r = Generate(session->get(), {{1, 2, 3}}, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ids[0].size(), 1u);
}

}  // namespace
}  // namespace satdar::runtime
