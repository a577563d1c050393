// Every design split over tensor-parallel ranks (threads over the in-process communicator)
// and pipeline stages (the boundary buffers copied from stage to stage, as the 1F1B schedule
// sends them), with sequence parallelism (the residual stream's rows split over the TP
// ranks), and with activation recomputation (selective, full), gives the whole model's
// loss and every parameter's gradient within 1e-10 in f64, on random (not initial) weights,
// with a vocabulary that no TP size divides; recomputation also leaves the statistics as
// they were (a recomputed forward counts nothing twice). The
// multi-process runs over MPI and Gloo (tests/parallel_equivalence_test.sh) check whole
// training runs of some of these pairs; this test checks every pair in seconds.
#include <cmath>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/local_communicator.h"
#include "core/ops/gemm.h"
#include "core/random.h"
#include "gtest/gtest.h"
#include "model/model.h"

namespace satdar::model {
namespace {

struct Design {
  std::string name;
  std::string json;  // fields added to the base config
};

// vocab 13: no TP size divides it (the embedding and head are padded inside the model).
std::string Config(const std::string& extra) {
  return R"({"vocab_size": 13, "hidden_size": 8, "intermediate_size": 12,
             "num_hidden_layers": 4, "max_position_embeddings": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2)" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

// Loss and the gradient of every parameter by name, in its global shape.
struct Result {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
  nlohmann::json stats;  // one rank, one stage: the model's statistics after the step
};

constexpr int kB = 2, kT = 5;

std::vector<int32_t> Tokens(int vocab) {
  std::vector<int32_t> tokens(kB * (kT + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % vocab);
  return tokens;
}

// Initial values moved by noise that is a function of (name, global index), so every layout
// holds the same weights; padded rows stay 0.
std::vector<double> Params(const ParamTable& table) {
  std::vector<double> p(table.size());
  table.Initialize(p.data(), 3);
  for (const ParamSpec& spec : table.specs()) {
    const uint64_t stream = core::HashString(spec.name);
    for (int64_t i = 0; i < spec.numel; ++i) {
      const int64_t g = spec.GlobalIndex(i);
      if (g >= 0) p[spec.offset + i] += 0.3 * core::RandomNormal(99, stream, g);
    }
  }
  return p;
}

// Adds this piece's gradients into r->grads (global shapes): TP slices to their places,
// TP-partial sums from every TP rank, replicated ones from TP rank 0; copies on several
// pipeline stages (a tied embedding, stage-partial sums) are added.
void Gather(const ParamTable& table, const std::vector<double>& g, int tp_rank, Result* r) {
  for (const ParamSpec& spec : table.specs()) {
    std::vector<double>& out = r->grads[spec.name];
    out.resize(core::NumElements(spec.global_shape), 0.0);
    if (!spec.sharded() && !spec.tp_partial_grad && tp_rank != 0) continue;
    for (int64_t i = 0; i < spec.numel; ++i) {
      const int64_t gi = spec.GlobalIndex(i);
      if (gi < 0) {
        EXPECT_EQ(g[spec.offset + i], 0.0) << spec.name << " padding element " << i;
        continue;
      }
      out[gi] += g[spec.offset + i];
    }
  }
}

Result RunWhole(const ModelConfig& c, bool stats = true) {
  core::ThreadPool pool(1);
  auto model = CreateModel<double>(c, &pool);
  EXPECT_TRUE(model.ok()) << model.status();
  Result r;
  if (!model.ok()) return r;
  (*model)->SetStatsEnabled(stats);
  std::vector<double> p = Params((*model)->params()), g(p.size(), 0.0);
  const std::vector<int32_t> tokens = Tokens(c.vocab_size);
  r.loss = (*model)->Forward(p.data(), tokens.data(), kB, kT).value();
  EXPECT_TRUE((*model)->Backward(p.data(), g.data(), 1.0).ok());
  Gather((*model)->params(), g, 0, &r);
  (*model)->AppendStats(&r.stats);
  return r;
}

// tp ranks as threads; each runs the pp stages in order, forward then backward.
Result RunSplit(const ModelConfig& c, int tp, int pp, Recompute recompute, bool sp) {
  std::vector<std::vector<std::unique_ptr<comm::Communicator>>> comms;
  for (int s = 0; s < pp; ++s) comms.push_back(comm::MakeLocalCommunicators(tp));
  std::vector<Result> results(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      core::ThreadPool pool(1);
      std::vector<std::unique_ptr<Model<double>>> stages;
      std::vector<std::vector<double>> params, grads;
      for (int s = 0; s < pp; ++s) {
        Sharding shard;
        shard.tp = tp > 1 ? comms[s][r].get() : nullptr;
        shard.tp_rank = r;
        shard.tp_size = tp;
        shard.pp_rank = s;
        shard.pp_size = pp;
        shard.recompute = recompute;
        shard.sequence_parallel = sp;
        auto m = CreateModel<double>(c, shard, &pool);
        ASSERT_TRUE(m.ok()) << m.status();
        params.push_back(Params((*m)->params()));
        grads.emplace_back(params.back().size(), 0.0);
        stages.push_back(std::move(*m));
      }
      const std::vector<int32_t> tokens = Tokens(c.vocab_size);
      std::vector<StageBuffers<double>*> buffers;
      for (int s = 0; s < pp; ++s) {
        StageBuffers<double>* b = stages[s]->PrepareStage(kB, kT);
        if (s > 0) {
          ASSERT_EQ(b->in.size(), buffers[s - 1]->out.size()) << "stage " << s;
          for (size_t k = 0; k < b->in.size(); ++k) b->in[k] = buffers[s - 1]->out[k];
        }
        buffers.push_back(b);
        auto v = stages[s]->Forward(params[s].data(), tokens.data(), kB, kT);
        ASSERT_TRUE(v.ok()) << v.status();
        results[r].loss += *v;
      }
      for (int s = pp - 1; s >= 0; --s) {
        if (s + 1 < pp) {
          for (size_t k = 0; k < buffers[s]->dout.size(); ++k) {
            buffers[s]->dout[k] = buffers[s + 1]->din[k];
          }
        }
        ASSERT_TRUE(stages[s]->Backward(params[s].data(), grads[s].data(), 1.0).ok());
      }
      for (int s = 0; s < pp; ++s) Gather(stages[s]->params(), grads[s], r, &results[r]);
      if (tp == 1 && pp == 1) stages[0]->AppendStats(&results[r].stats);
    });
  }
  for (auto& t : threads) t.join();
  Result all = results[0];
  for (int r = 1; r < tp; ++r) {
    EXPECT_NEAR(results[r].loss, all.loss, 1e-12) << "TP rank " << r << "'s loss";
    for (auto& [name, g] : results[r].grads) {
      for (size_t i = 0; i < g.size(); ++i) all.grads[name][i] += g[i];
    }
  }
  return all;
}

struct Case {
  Design design;
  int tp, pp;
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;
};

class LayoutSplit : public ::testing::TestWithParam<Case> {};

TEST_P(LayoutSplit, EqualsWholeModel) {
  core::cpu::InitBlas();
  const Case& k = GetParam();
  auto config = ParseModelConfig(Config(k.design.json), k.design.name);
  ASSERT_TRUE(config.ok()) << config.status();
  const Result whole = RunWhole(*config);
  const Result split = RunSplit(*config, k.tp, k.pp, k.recompute, k.sequence_parallel);
  if (k.tp == 1 && k.pp == 1) {
    EXPECT_EQ(split.stats.dump(), whole.stats.dump());
  }
  EXPECT_NEAR(split.loss, whole.loss, 1e-10 * std::abs(whole.loss));
  ASSERT_EQ(split.grads.size(), whole.grads.size());
  for (const auto& [name, g] : whole.grads) {
    auto it = split.grads.find(name);
    ASSERT_NE(it, split.grads.end()) << name << " is in no piece";
    ASSERT_EQ(it->second.size(), g.size()) << name;
    double scale = 1e-30, worst = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      scale = std::max(scale, std::abs(g[i]));
      worst = std::max(worst, std::abs(it->second[i] - g[i]));
    }
    EXPECT_LE(worst, 1e-10 * std::max(1.0, scale)) << name;
  }
}

// The sum of |x| over every number in j.
double AbsSum(const nlohmann::json& j) {
  if (j.is_number()) return std::abs(j.get<double>());
  double s = 0;
  if (j.is_array() || j.is_object()) {
    for (const auto& e : j) s += AbsSum(e);
  }
  return s;
}

// Model::SetStatsEnabled(false): the same loss and gradients bit for bit, and none of the
// statistics that read activations gathered.
TEST(ModelStats, OffGathersNothingAndChangesNothing) {
  core::cpu::InitBlas();
  for (const char* extra :
       {R"("residual": "dar", "block_size": 4, "value_residual": "satformer")",
        R"("residual": "attnres", "value_residual": "satformer")",
        R"("residual": "transparent", "block_size": 2, "value_residual": "satformer")"}) {
    auto config = ParseModelConfig(Config(extra), "stats");
    ASSERT_TRUE(config.ok()) << config.status();
    const Result on = RunWhole(*config, true), off = RunWhole(*config, false);
    EXPECT_EQ(on.loss, off.loss) << extra;
    EXPECT_EQ(on.grads, off.grads) << extra;
    int checked = 0;
    for (const char* key : {"satformer_gate_mean", "dar_depth_weights", "attnres_depth_weights",
                            "transparent_depth_weights"}) {
      if (!on.stats.contains(key)) continue;
      ++checked;
      EXPECT_GT(AbsSum(on.stats[key]), 0.0) << extra << " " << key;
      EXPECT_EQ(AbsSum(off.stats[key]), 0.0) << extra << " " << key;
    }
    EXPECT_EQ(checked, 2) << extra;
  }
}

std::vector<Case> Cases() {
  const std::vector<Design> designs = {
      {"baseline", ""},
      {"untied", R"("tie_word_embeddings": false)"},
      {"satformer", R"("value_residual": "satformer")"},
      {"resformer_fixed", R"("value_residual": "resformer")"},
      {"resformer_learnable_plus",
       R"("value_residual": "resformer", "resformer_mode": "learnable_plus")"},
      {"attnres_full", R"("residual": "attnres")"},
      {"attnres_block4", R"("residual": "attnres", "block_size": 4)"},
      {"transparent_full", R"("residual": "transparent")"},
      {"transparent_block4_moe", R"("residual": "transparent", "block_size": 4,
                     "moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 6})"},
      {"dar_full", R"("residual": "dar")"},
      {"dar_block4_satformer",
       R"("residual": "dar", "block_size": 4, "value_residual": "satformer")"},
      {"dar_moe", R"("residual": "dar", "block_size": 4,
                     "moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 6})"},
      {"hc4", R"("residual": "hc")"},
      {"hc2_satformer", R"("residual": "hc", "hc_streams": 2, "value_residual": "satformer")"},
      {"mhc4", R"("residual": "mhc")"},
      {"denseformer", R"("residual": "denseformer")"},
      {"denseformer_resformer", R"("residual": "denseformer", "value_residual": "resformer",
                                   "resformer_mode": "learnable_plus")"},
      {"muddformer", R"("residual": "muddformer")"},
      {"muddformer_satformer", R"("residual": "muddformer", "value_residual": "satformer")"},
  };
  std::vector<Case> cases;
  for (const Design& d : designs) {
    for (auto [tp, pp] : {std::pair{2, 1}, {1, 2}, {1, 4}, {2, 2}}) cases.push_back({d, tp, pp});
    cases.push_back({d, 1, 1, Recompute::kSelective});
    cases.push_back({d, 1, 1, Recompute::kFull});
    cases.push_back({d, 2, 2, Recompute::kFull});
    cases.push_back({d, 2, 1, Recompute::kNone, true});
    cases.push_back({d, 2, 2, Recompute::kNone, true});
    cases.push_back({d, 2, 2, Recompute::kFull, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Registry, LayoutSplit, ::testing::ValuesIn(Cases()),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Recompute r = info.param.recompute;
      return info.param.design.name + "_tp" + std::to_string(info.param.tp) + "_pp" +
             std::to_string(info.param.pp) +
             (r == Recompute::kFull ? "_recompute_full"
              : r == Recompute::kSelective ? "_recompute_selective" : "") +
             (info.param.sequence_parallel ? "_sp" : "");
    });

}  // namespace
}  // namespace satdar::model
