// RolesOf (param_roles.h) on real rank tables: what each rank reduces, exchanges and counts in
// the gradient norm, at align 1 (the CPU) and 32 (the GPU).
#include "model/param_roles.h"

#include <string>

#include "gtest/gtest.h"
#include "model/config.h"
#include "model/model.h"

namespace satdar::model {
namespace {

ModelConfig Config(const std::string& extra) {
  const std::string json =
      R"({"vocab_size": 13, "hidden_size": 16, "intermediate_size": 12,
          "num_hidden_layers": 4, "max_position_embeddings": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2)" +
      (extra.empty() ? std::string() : ", " + extra) + "}";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(json, "roles");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

ParamTable Table(const ModelConfig& c, const Sharding& shard, int64_t align = 1) {
  absl::StatusOr<ParamTable> t = BuildParamTable(c, shard, align);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : ParamTable();
}

template <typename Pred>
int64_t Sum(const ParamTable& t, Pred pred) {
  int64_t n = 0;
  for (const ParamSpec& s : t.specs()) n += pred(s) ? s.numel : 0;
  return n;
}

// The dense and expert runs tile the flat buffer: every element is reduced exactly once.
void ExpectTiles(const ParamTable& t, const ParamRoles& r) {
  std::vector<int> seen(t.size(), 0);
  for (const Runs* runs : {&r.dense, &r.experts}) {
    for (auto [offset, length] : *runs) {
      for (int64_t e = offset; e < offset + length; ++e) ++seen[e];
    }
  }
  for (int64_t e = 0; e < t.size(); ++e) ASSERT_EQ(seen[e], 1) << "element " << e;
}

TEST(RolesOf, OneRankReducesAndCountsEverythingOnce) {
  const ModelConfig c = Config(R"("tie_word_embeddings": false)");
  for (int64_t align : {1, 32}) {
    const ParamTable t = Table(c, Sharding{}, align);
    const ParamRoles r = RolesOf(t, RankPlace{}, /*tied=*/false);
    ExpectTiles(t, r);
    ASSERT_EQ(r.dense.size(), 1u);  // maximal: one run over the whole buffer
    EXPECT_EQ(r.dense[0], std::make_pair(int64_t{0}, t.size()));
    EXPECT_TRUE(r.experts.empty());
    EXPECT_EQ(r.in_norm, r.dense);
    EXPECT_EQ(r.in_norm_zero, r.dense);
    EXPECT_TRUE(r.tp_partial.empty());
    EXPECT_TRUE(r.pp_partial.empty());
    EXPECT_EQ(r.tied_embedding.first, -1);
    EXPECT_EQ(RunElements(r.vocabulary), 2 * 13 * 16);  // embedding and head
  }
}

TEST(RolesOf, TensorParallelRanksCountReplicatedWeightsOnRankZeroOnly) {
  const ModelConfig c = Config("");
  Sharding shard;
  shard.tp_size = 2;
  shard.tp_rank = 1;
  const ParamTable t = Table(c, shard);
  RankPlace place;
  place.tp = 1;
  const ParamRoles r = RolesOf(t, place, c.tie_word_embeddings);
  ExpectTiles(t, r);
  EXPECT_EQ(RunElements(r.in_norm), Sum(t, [](const ParamSpec& s) { return s.sharded(); }));
  EXPECT_EQ(RunElements(r.tp_partial), Sum(t, [](const ParamSpec& s) { return s.tp_partial_grad; }));
  EXPECT_GT(RunElements(r.tp_partial), 0);  // the q/k norms
  // Padded vocabulary: 13 rows over 2 ranks, 7 each.
  EXPECT_EQ(RunElements(r.vocabulary), 7 * 16);
  place.tp = 0;
  EXPECT_EQ(RunElements(RolesOf(t, place, c.tie_word_embeddings).in_norm), t.size());
}

TEST(RolesOf, ATiedEmbeddingIsExchangedAndCountedOnTheFirstStage) {
  const ModelConfig c = Config("");  // tied
  for (int stage : {0, 1}) {
    Sharding shard;
    shard.pp_size = 2;
    shard.pp_rank = stage;
    const ParamTable t = Table(c, shard);
    RankPlace place;
    place.pp = stage;
    place.pipeline = true;
    const ParamRoles r = RolesOf(t, place, /*tied=*/true);
    ExpectTiles(t, r);
    const ParamSpec* embed = t.Find("model.embed_tokens.weight");
    ASSERT_NE(embed, nullptr) << "stage " << stage;
    EXPECT_EQ(r.tied_embedding, std::make_pair(embed->offset, embed->numel)) << "stage " << stage;
    EXPECT_EQ(RunElements(r.in_norm), t.size() - (stage == 0 ? 0 : embed->numel))
        << "stage " << stage;
    // Without a pipeline the same table exchanges nothing.
    EXPECT_EQ(RolesOf(t, RankPlace{}, true).tied_embedding.first, -1);
  }
}

TEST(RolesOf, LearnablePlusLambdasAreSummedOverTheStages) {
  const ModelConfig c = Config(R"("value_residual": "resformer", "resformer_mode": "learnable_plus")");
  Sharding shard;
  shard.pp_size = 2;
  shard.pp_rank = 1;
  const ParamTable t = Table(c, shard);
  RankPlace place;
  place.pp = 1;
  place.pipeline = true;
  const ParamRoles r = RolesOf(t, place, c.tie_word_embeddings);
  const int64_t shared = Sum(t, [](const ParamSpec& s) { return s.pp_partial_grad; });
  EXPECT_GT(shared, 0);
  EXPECT_EQ(RunElements(r.pp_partial), shared);
  // Counted on stage 0 only (with the tied embedding's copy).
  const int64_t embed = t.Find("model.embed_tokens.weight")->numel;
  EXPECT_EQ(RunElements(r.in_norm), t.size() - shared - embed);
}

TEST(RolesOf, ExpertsAreTheirOwnRunsAndCountedOnEveryExpertRank) {
  const ModelConfig c = Config(R"("moe": {"num_experts": 4, "top_k": 2,
                                          "expert_intermediate_size": 6})");
  for (int64_t align : {1, 32}) {
    Sharding shard;
    shard.ep_size = 2;
    shard.ep_rank = 1;
    const ParamTable t = Table(c, shard, align);
    RankPlace place;
    place.ep = 1;
    const ParamRoles r = RolesOf(t, place, c.tie_word_embeddings);
    ExpectTiles(t, r);
    const int64_t experts = Sum(t, [](const ParamSpec& s) { return s.expert; });
    EXPECT_GT(experts, 0);
    int64_t expert_strides = 0;
    for (const ParamSpec& s : t.specs()) expert_strides += s.expert ? s.stride : 0;
    EXPECT_EQ(RunElements(r.experts), expert_strides) << "align " << align;
    EXPECT_EQ(RunElements(r.in_norm), expert_strides) << "align " << align;  // dense: EP rank 0
    EXPECT_EQ(RunElements(r.in_norm_zero), t.size()) << "align " << align;
    if (align == 1) {
      EXPECT_EQ(expert_strides, experts);
    }
  }
}

}  // namespace
}  // namespace satdar::model
