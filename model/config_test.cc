#include "model/config.h"

#include "gtest/gtest.h"

namespace satdar::model {
namespace {

const char* kGood = R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4})";

TEST(Config, DefaultsFilledIn) {
  auto c = ParseModelConfig(kGood, "c.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->rope_theta, 1e4);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->initializer_range, 0.02);
  EXPECT_EQ(c->value_residual, ValueResidualKind::kNone);
  EXPECT_EQ(c->residual, Residual::kStandard);
  EXPECT_FALSE(c->moe.has_value());
  EXPECT_EQ(c->head_size(), 16);
  // Round trip through the canonical JSON.
  auto again = ParseModelConfig(ModelConfigToJson(*c), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ModelConfigToJson(*again), ModelConfigToJson(*c));
}

TEST(Config, AMoeConfigWithoutADenseWidthRoundTrips) {
  // The experts have their own width; the canonical JSON (what the coordinator stores for a
  // job and the rank parses) writes intermediate_size 0 for it.
  auto c = ParseModelConfig(R"({"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
      "max_position_embeddings": 64, "num_attention_heads": 4,
      "moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 32}})", "c.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->intermediate_size, 0);
  auto again = ParseModelConfig(ModelConfigToJson(*c), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ModelConfigToJson(*again), ModelConfigToJson(*c));
  // A dense model still needs its width, also when it is written as 0.
  auto dense = ParseModelConfig(R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 0,
      "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4})", "d.json");
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(std::string(dense.status().message()).find("intermediate_size"), std::string::npos)
      << dense.status();
}

struct BadConfig {
  std::string json;
  std::string message;
};

TEST(Config, RejectsBadInputNamingTheField) {
  std::vector<BadConfig> cases = {
      {"{", "c.json: not valid JSON"},
      {"[1]", "config must be a JSON object"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4})",
       "field \"max_position_embeddings\" is required"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "max_position_embeddings": 64, "num_attention_heads": 4, "hidden_size": 32})",
       "c.json: not valid JSON: duplicate key \"hidden_size\""},
      {R"({"vocab_size": 4294967298, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4})",
       "field \"vocab_size\" must be in [2, 16777216], got 4294967298"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4,
         "rms_norm_eps": 2})",
       "field \"rms_norm_eps\" must be > 0 and <= 1, got 2"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4, "colour": 1})",
       "field \"colour\" is not a known config field"},
      {R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "max_position_embeddings": 64,
         "num_attention_heads": 4})",
       "field \"vocab_size\" is required"},
      {R"({"vocab_size": "256", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4})",
       "field \"vocab_size\" must be an integer"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 5})",
       "field \"num_attention_heads\" must divide hidden_size (64 % 5 != 0)"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4, "num_key_value_heads": 3})",
       "field \"num_key_value_heads\" must divide num_attention_heads"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4, "residual": "dar", "block_size": 3})",
       "field \"block_size\" must be even and >= 2 for dar"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4, "residual": "attnres", "block_size": 3})",
       "field \"block_size\" must be 1 (full) or even for attnres"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 1, "max_position_embeddings": 64, "num_attention_heads": 4, "value_residual": "satformer"})",
       "field \"value_residual\" needs at least 2 layers"},
      {R"({"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 64,
         "num_attention_heads": 4, "moe": {"num_experts": 4, "top_k": 5,
         "expert_intermediate_size": 32}})",
       "field \"moe.top_k\" (5) must not exceed moe.num_experts (4)"},
      {R"({"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 64,
         "num_attention_heads": 4, "moe": {"num_experts": 4, "top_k": 2,
         "expert_intermediate_size": 32, "capacity": 2}})",
       "field \"moe.capacity\" is not a known config field"},
      {R"({"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 64,
         "num_attention_heads": 4})",
       "field \"intermediate_size\" is required for a dense MLP"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4, "residual": "sideways"})",
       "field \"residual\" must be one of"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4, "rms_norm_eps": -1})",
       "field \"rms_norm_eps\" must be > 0"},
      {R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "max_position_embeddings": 64, "num_attention_heads": 4, "qk_norm": 1})",
       "field \"qk_norm\" must be true or false"},
  };
  for (const BadConfig& b : cases) {
    auto c = ParseModelConfig(b.json, "c.json");
    ASSERT_FALSE(c.ok()) << b.json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(b.message), std::string::npos)
        << "want: " << b.message << "\ngot: " << c.status();
  }
}

TEST(Config, MissingFile) {
  auto c = LoadModelConfig("/nonexistent/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("/nonexistent/config.json"), std::string::npos);
}

}  // namespace
}  // namespace satdar::model
