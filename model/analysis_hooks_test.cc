// The analysis entry points of Model (model.h: ResidualStreams, DepthStates, ForwardToState,
// ForwardFromState) for every design of model/registry_designs_testutil.h, in f64 on a tiny
// model with random weights:
//   - the pass split between any two layers and resumed from the state read out gives Forward's
//     loss (1e-12): the state is all that crosses the split, as at a pipeline boundary;
//   - each state tensor's owner is a stream of the design or -1 (shared);
//   - a state from other tokens changes the loss (the resumed pass reads it);
//   - DepthStates: DAR's history entries and HC/mHC's streams after each layer, equal to the
//     same tensors read at a split (and depth 0 to the embedding rows);
// and the error codes.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/ops/gemm.h"
#include "core/ops/gradcheck_testutil.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/registry_designs_testutil.h"

namespace satdar::model {
namespace {

using core::testing::RandomVector;
using testing::Design;

constexpr int kLayers = 3, kVocab = 11, kHidden = 8;

using testing::TinyConfig;

struct Fixture {
  ModelConfig config;
  std::unique_ptr<Model<double>> model;
  std::vector<double> params;
};

void Build(const std::string& json, core::ThreadPool* pool, Fixture* f) {
  core::cpu::InitBlas();
  auto config = ParseModelConfig(TinyConfig(json), "analysis_hooks_test");
  ASSERT_TRUE(config.ok()) << config.status();
  f->config = *config;
  auto model = CreateModel<double>(*config, pool);
  ASSERT_TRUE(model.ok()) << model.status();
  f->model = std::move(*model);
  f->params.resize(f->model->params().size());
  f->model->params().Initialize(f->params.data(), 5);
  const std::vector<double> noise = RandomVector(f->params.size(), 17, 0.3);
  for (size_t i = 0; i < f->params.size(); ++i) f->params[i] += noise[i];
}

std::vector<int32_t> Tokens(int b, int t, uint32_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(b) * (t + 1));
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + seed * 3 + i * i * seed) % kVocab);
  }
  return tokens;
}

double MaxDiff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

int ExpectedStreams(const ModelConfig& c) {
  if (c.residual == Residual::kDar) return 2;
  if (c.residual == Residual::kHc || c.residual == Residual::kMhc) return c.hc_streams;
  return 1;
}

class DesignAnalysis : public ::testing::TestWithParam<Design> {};

TEST_P(DesignAnalysis, SplitPassEqualsForward) {
  core::ThreadPool pool(2);
  Fixture f;
  Build(GetParam().json, &pool, &f);
  if (HasFatalFailure()) return;
  Model<double>* m = f.model.get();
  const int b = 2, t = 5;
  const std::vector<int32_t> tokens = Tokens(b, t, 1), other = Tokens(b, t, 4);
  auto forward = m->Forward(f.params.data(), tokens.data(), b, t);
  ASSERT_TRUE(forward.ok()) << forward.status();
  const double clean = m->last_cross_entropy();
  const int streams = m->ResidualStreams();
  EXPECT_EQ(streams, ExpectedStreams(f.config));
  const bool vr = f.config.value_residual != ValueResidualKind::kNone;
  for (int at = 2; at < 2 * kLayers; at += 2) {
    std::vector<std::vector<double>> state, changed;
    std::vector<int> owner, other_owner;
    std::vector<double> pos;
    ASSERT_TRUE(m->ForwardToState(f.params.data(), tokens.data(), b, t, at, &state, &owner).ok());
    ASSERT_EQ(state.size(), TopologyBoundaryTensors(f.config, at) + (vr ? 1u : 0u)) << at;
    ASSERT_EQ(owner.size(), state.size());
    for (int o : owner) EXPECT_TRUE(o >= -1 && o < streams) << at << " owner " << o;
    if (vr) {
      EXPECT_EQ(owner.back(), -1);
    }
    auto resumed = m->ForwardFromState(f.params.data(), tokens.data(), b, t, at, state, &pos);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_NEAR(*resumed, clean, 1e-12) << "split after sublayer " << at;
    ASSERT_EQ(pos.size(), static_cast<size_t>(b) * t);
    double sum = 0;
    for (double l : pos) sum += l;
    EXPECT_NEAR(sum / pos.size(), clean, 1e-12);
    // The state of other inputs, with this batch's targets: another loss.
    ASSERT_TRUE(
        m->ForwardToState(f.params.data(), other.data(), b, t, at, &changed, &other_owner).ok());
    EXPECT_EQ(owner, other_owner);
    auto patched = m->ForwardFromState(f.params.data(), tokens.data(), b, t, at, changed, nullptr);
    ASSERT_TRUE(patched.ok());
    EXPECT_GT(std::fabs(*patched - clean), 1e-6) << at;
  }
}

// DepthStates equal the same tensors read at a split, and depth 0 is the embedding.
TEST_P(DesignAnalysis, DepthStates) {
  core::ThreadPool pool(1);
  Fixture f;
  Build(GetParam().json, &pool, &f);
  if (HasFatalFailure()) return;
  Model<double>* m = f.model.get();
  const int b = 2, t = 4, n = b * t;
  const std::vector<int32_t> tokens = Tokens(b, t, 2);
  std::vector<DepthState> states;
  EXPECT_EQ(m->DepthStates(&states).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->Forward(f.params.data(), tokens.data(), b, t).ok());
  ASSERT_TRUE(m->DepthStates(&states).ok());
  const ModelConfig& c = f.config;
  const bool dar = c.residual == Residual::kDar;
  const bool hc = c.residual == Residual::kHc || c.residual == Residual::kMhc;
  const int block = c.block_size > 0 ? c.block_size : 2;
  size_t expected = 0;
  if (dar) expected = 2 * (1 + 2 * kLayers / block);
  if (hc) expected = static_cast<size_t>(c.hc_streams) * (kLayers + 1);
  ASSERT_EQ(states.size(), expected);
  // The embedding rows of the inputs.
  const double* embed = f.params.data() + m->params().Offset("model.embed_tokens.weight");
  std::vector<double> h0(static_cast<size_t>(n) * kHidden);
  for (int bi = 0; bi < b; ++bi) {
    for (int ti = 0; ti < t; ++ti) {
      const int id = tokens[bi * (t + 1) + ti];
      for (int k = 0; k < kHidden; ++k) h0[(bi * t + ti) * kHidden + k] = embed[id * kHidden + k];
    }
  }
  for (const DepthState& s : states) {
    ASSERT_EQ(s.values.size(), h0.size());
    EXPECT_EQ(s.sublayer, dar ? s.depth * block : 2 * s.depth);
    if (s.depth == 0) {
      EXPECT_LT(MaxDiff(s.values, h0), 1e-15) << "stream " << s.stream;
      continue;
    }
    // The last depth has no split after it; DAR's block ends inside a layer at odd sublayers.
    if (s.sublayer >= 2 * kLayers || s.sublayer % 2 != 0) continue;
    std::vector<std::vector<double>> state;
    std::vector<int> owner;
    ASSERT_TRUE(
        m->ForwardToState(f.params.data(), tokens.data(), b, t, s.sublayer, &state, &owner).ok());
    // DAR: h0, stream 0's entries 1..m-1, stream 1's, (no partial at a block boundary);
    // HC: stream j is tensor j.
    const int index = dar ? 1 + s.stream * s.depth + (s.depth - 1) : s.stream;
    EXPECT_EQ(owner[index], s.stream);
    EXPECT_LT(MaxDiff(s.values, state[index]), 1e-15)
        << "stream " << s.stream << " depth " << s.depth;
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, DesignAnalysis, ::testing::ValuesIn(testing::RegistryDesigns()),
                         [](const ::testing::TestParamInfo<Design>& info) {
                           return info.param.name;
                         });

TEST(Analysis, ErrorCodes) {
  core::ThreadPool pool(1);
  Fixture f;
  Build(R"("residual": "dar")", &pool, &f);
  if (HasFatalFailure()) return;
  Model<double>* m = f.model.get();
  const std::vector<int32_t> tokens = Tokens(1, 4, 3);
  std::vector<std::vector<double>> state;
  std::vector<int> owner;
  for (int at : {0, 1, 3, 2 * kLayers, -2}) {
    EXPECT_EQ(m->ForwardToState(f.params.data(), tokens.data(), 1, 4, at, &state, &owner).code(),
              absl::StatusCode::kInvalidArgument)
        << at;
  }
  ASSERT_TRUE(m->ForwardToState(f.params.data(), tokens.data(), 1, 4, 2, &state, &owner).ok());
  // A state of another sublayer's shape (3 tensors after sublayer 2, 5 after 4), or a tensor
  // of the wrong size.
  EXPECT_EQ(m->ForwardFromState(f.params.data(), tokens.data(), 1, 4, 4, state, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::vector<double>> short_state = state;
  short_state[1].pop_back();
  EXPECT_EQ(
      m->ForwardFromState(f.params.data(), tokens.data(), 1, 4, 2, short_state, nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> bad = tokens;
  bad[2] = kVocab;
  EXPECT_EQ(m->ForwardToState(f.params.data(), bad.data(), 1, 4, 2, &state, &owner).code(),
            absl::StatusCode::kInvalidArgument);
  // Shards and stages: the analyses read the whole model.
  auto config = ParseModelConfig(TinyConfig(R"("residual": "dar")"), "analysis_hooks_test");
  ASSERT_TRUE(config.ok());
  Sharding shard;
  shard.pp_size = 3;
  auto staged = CreateModel<double>(*config, shard, &pool);
  ASSERT_TRUE(staged.ok()) << staged.status();
  std::vector<double> params((*staged)->params().size(), 0.01);
  EXPECT_EQ((*staged)->ForwardToState(params.data(), tokens.data(), 1, 4, 2, &state, &owner).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<DepthState> states;
  EXPECT_EQ((*staged)->DepthStates(&states).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace satdar::model
