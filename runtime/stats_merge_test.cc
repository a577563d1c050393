#include "runtime/stats_merge.h"

#include "gtest/gtest.h"

namespace satdar::runtime {
namespace {

using Json = nlohmann::json;

TEST(MergeStats, OneRankIsItself) {
  const Json s = Json::parse(R"({"satformer_gate_mean": [[0.5, 0.25]], "dar_mix": [[0.5, 0.5]],
                                 "moe_expert_load": [[1, 2]], "other": 7})");
  EXPECT_EQ(MergeStats({{0, 0, 0, s}}), s);
  EXPECT_EQ(MergeStats({}), Json::object());
}

TEST(MergeStats, PipelineStagesConcatenateRetrievalsAndAddLayers) {
  // Two stages of a 3-layer model: stage 0 owns layer 1's gates, stage 1 layer 2's; depth
  // retrievals 0..2 on stage 0, 3..6 on stage 1.
  StatsPiece s0{0, 0, 0, Json::parse(R"({
      "satformer_gate_mean": [[0.5, 0.25], [0, 0]],
      "dar_depth_weights": [[[1.0], [1.0]], [[0.5, 0.5], [0.9, 0.1]], [[0.4, 0.6], [0.3, 0.7]]],
      "moe_expert_load": [[3, 1], [0, 0], [0, 0]], "moe_dropped_tokens": 0,
      "resformer_lambda1": [0.5, null]})")};
  StatsPiece s1{0, 1, 0, Json::parse(R"({
      "satformer_gate_mean": [[0, 0], [0.75, 0.125]],
      "dar_depth_weights": [[[0.2, 0.8], [0.1, 0.9]], [[0.3, 0.3, 0.4], [0.2, 0.2, 0.6]]],
      "moe_expert_load": [[0, 0], [2, 2], [4, 0]], "moe_dropped_tokens": 0,
      "resformer_lambda1": [null, 0.25]})")};
  const Json m = MergeStats({s1, s0});  // any order
  EXPECT_EQ(m["satformer_gate_mean"], Json::parse("[[0.5, 0.25], [0.75, 0.125]]"));
  ASSERT_EQ(m["dar_depth_weights"].size(), 5u);
  EXPECT_EQ(m["dar_depth_weights"][3], Json::parse("[[0.2, 0.8], [0.1, 0.9]]"));
  EXPECT_EQ(m["moe_expert_load"], Json::parse("[[3, 1], [2, 2], [4, 0]]"));
  EXPECT_EQ(m["moe_dropped_tokens"], 0);
  EXPECT_EQ(m["resformer_lambda1"], Json::parse("[0.5, 0.25]"));
}

TEST(MergeStats, TensorParallelRanksHoldTheirKvHeads) {
  StatsPiece a{0, 0, 0, Json::parse(R"({"satformer_gate_zero_fraction": [[0.1], [0.2]],
                                         "dar_mix": [[0.5, 0.5]], "moe_expert_load": [[1, 1]]})")};
  StatsPiece b{1, 0, 0, Json::parse(R"({"satformer_gate_zero_fraction": [[0.3], [0.4]],
                                         "dar_mix": [[0.5, 0.5]], "moe_expert_load": [[1, 1]]})")};
  const Json m = MergeStats({b, a});
  EXPECT_EQ(m["satformer_gate_zero_fraction"], Json::parse("[[0.1, 0.3], [0.2, 0.4]]"));
  EXPECT_EQ(m["dar_mix"], Json::parse("[[0.5, 0.5]]"));  // replicated: once, not twice
  EXPECT_EQ(m["moe_expert_load"], Json::parse("[[1, 1]]"));  // the same tokens: counted once
}

TEST(MergeStats, ExpertParallelRanksAddTheirTokens) {
  StatsPiece a{0, 0, 0, Json::parse(R"({"moe_expert_load": [[1, 2]], "satformer_gate_mean": [[0.5]]})")};
  StatsPiece b{0, 0, 1, Json::parse(R"({"moe_expert_load": [[3, 4]], "satformer_gate_mean": [[0.7]]})")};
  const Json m = MergeStats({a, b});
  EXPECT_EQ(m["moe_expert_load"], Json::parse("[[4, 6]]"));
  EXPECT_EQ(m["satformer_gate_mean"], Json::parse("[[0.5]]"));  // EP rank 0's tokens
}

TEST(MergeInstanceStats, WeightsMeansByMicroBatchesAndAddsCounts) {
  // Three micro-batches over two instances: instance 0 ran two, instance 1 one.
  const Json a = Json::parse(R"({"satformer_gate_mean": [[0.3]], "moe_expert_load": [[4, 2]],
                                 "resformer_lambda1": [null, 0.5]})");
  const Json b = Json::parse(R"({"satformer_gate_mean": [[0.6]], "moe_expert_load": [[1, 1]],
                                 "resformer_lambda1": [null, 0.5]})");
  const Json m = MergeInstanceStats({a, b}, {2, 1});
  EXPECT_DOUBLE_EQ(m["satformer_gate_mean"][0][0].get<double>(), (2 * 0.3 + 0.6) / 3);
  EXPECT_EQ(m["moe_expert_load"], Json::parse("[[5, 3]]"));
  EXPECT_TRUE(m["resformer_lambda1"][0].is_null());
  EXPECT_DOUBLE_EQ(m["resformer_lambda1"][1].get<double>(), 0.5);
  EXPECT_EQ(MergeInstanceStats({a}, {1}), a);
}

}  // namespace
}  // namespace satdar::runtime
