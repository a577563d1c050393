#include "model/memory_estimate.h"

#include <malloc.h>

#include <vector>

#include "gtest/gtest.h"
#include "model/model.h"

namespace satdar::model {
namespace {

// Bytes the heap holds now (small blocks and mmapped large ones).
int64_t HeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

struct Design {
  const char* name;
  const char* fields;
};

class MemoryEstimateTest : public testing::TestWithParam<Design> {};

// What one forward and backward pass of the CPU model allocates, against the estimate's
// activations: within a factor of two for every design.
TEST_P(MemoryEstimateTest, ActivationsWithinTwiceOfWhatTheModelAllocates) {
  const std::string json = std::string(R"({"vocab_size": 512, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 4, "max_position_embeddings": 256,
      "num_attention_heads": 4, "num_key_value_heads": 2)") + GetParam().fields + "}";
  absl::StatusOr<ModelConfig> config = ParseModelConfig(json, GetParam().name);
  ASSERT_TRUE(config.ok()) << config.status();
  const int b = 4, t = 64;
  MemoryShape shape;
  shape.use = MemoryUse::kGradient;
  shape.batch = b;
  shape.seq_len = t;
  absl::StatusOr<MemoryEstimate> e = EstimateMemory(*config, shape);
  ASSERT_TRUE(e.ok()) << e.status();

  core::ThreadPool pool(1);
  auto model = CreateModel<float>(*config, &pool);
  ASSERT_TRUE(model.ok()) << model.status();
  const ParamTable& table = (*model)->params();
  EXPECT_EQ(e->parameters, table.size());
  EXPECT_EQ(e->parameter_bytes, table.size() * 4);
  std::vector<float> params(table.size()), grads(table.size(), 0.0f);
  table.Initialize(params.data(), 0);
  std::vector<int32_t> tokens(static_cast<size_t>(b) * (t + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37) % 512);
  const int64_t before = HeapBytes();
  ASSERT_TRUE((*model)->Forward(params.data(), tokens.data(), b, t).ok());
  ASSERT_TRUE((*model)->Backward(params.data(), grads.data(), 1.0).ok());
  const int64_t allocated = HeapBytes() - before;
  EXPECT_GT(e->activation_bytes, allocated / 2) << GetParam().name << ": allocated " << allocated;
  EXPECT_LT(e->activation_bytes, allocated * 2) << GetParam().name << ": allocated " << allocated;
}

INSTANTIATE_TEST_SUITE_P(
    Designs, MemoryEstimateTest,
    testing::Values(Design{"transformer", ""},
                    Design{"satformer", R"(, "value_residual": "satformer")"},
                    Design{"resformer", R"(, "value_residual": "resformer")"},
                    Design{"attnres_full", R"(, "residual": "attnres")"},
                    Design{"attnres_block", R"(, "residual": "attnres", "block_size": 4)"},
                    Design{"transparent_full", R"(, "residual": "transparent")"},
                    Design{"transparent_block", R"(, "residual": "transparent", "block_size": 4)"},
                    Design{"dar_full", R"(, "residual": "dar")"},
                    Design{"dar_block", R"(, "residual": "dar", "block_size": 4)"},
                    Design{"hc", R"(, "residual": "hc")"},
                    Design{"mhc", R"(, "residual": "mhc")"},
                    Design{"denseformer", R"(, "residual": "denseformer")"},
                    Design{"muddformer", R"(, "residual": "muddformer")"},
                    Design{"moe", R"(, "moe": {"num_experts": 4, "top_k": 2,
                                      "expert_intermediate_size": 64, "num_shared_experts": 1})"}),
    [](const testing::TestParamInfo<Design>& info) { return std::string(info.param.name); });

TEST(MemoryEstimate, TrainingCountsMomentsAndShardsThemUnderZero) {
  auto c = ParseModelConfig(R"({"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 4, "max_position_embeddings": 256, "num_attention_heads": 4})", "c");
  ASSERT_TRUE(c.ok()) << c.status();
  MemoryShape s;
  s.batch = 8;
  s.seq_len = 32;
  auto full = EstimateMemory(*c, s);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->gradient_bytes, full->parameter_bytes);
  EXPECT_EQ(full->optimizer_bytes, 2 * full->parameter_bytes);
  s.dp = 4;
  s.zero_stage = 1;
  auto zero = EstimateMemory(*c, s);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->optimizer_bytes, full->optimizer_bytes / 4);
  // Two pipeline stages: each rank holds about half the layers.
  s.dp = 1;
  s.zero_stage = 0;
  s.pp = 2;
  auto staged = EstimateMemory(*c, s);
  ASSERT_TRUE(staged.ok());
  EXPECT_LT(staged->parameters, full->parameters);
}

TEST(MemoryEstimate, RefusesWhatCannotFitNamingTheCause) {
  auto c = ParseModelConfig(R"({"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "max_position_embeddings": 4096, "num_attention_heads": 4})", "c");
  ASSERT_TRUE(c.ok());
  MemoryShape s;
  s.batch = 1 << 22;  // 4M sequences of 4096 tokens: petabytes of attention probabilities
  s.seq_len = 4096;
  absl::Status st = CheckFitsInMemory(*c, s, 1, "satdar train", {"--batch-size", "--seq-len", "--microbatches"});
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("satdar train needs about"), std::string::npos) << st;
  EXPECT_NE(st.message().find("--batch-size or --seq-len"), std::string::npos) << st;
  s.batch = 1;
  s.seq_len = 16;
  EXPECT_TRUE(CheckFitsInMemory(*c, s, 1, "satdar train", {"--batch-size", "--seq-len", "--microbatches"}).ok());
  EXPECT_GT(AvailableMemoryBytes(), 0);
}

}  // namespace
}  // namespace satdar::model
