// CheckDeviceSupport (layout_check.h): what the device backend's kernels refuse, from the
// config alone. ValidateSharding's cases are in param_table_test.cc.
#include "model/layout_check.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "model/config.h"

namespace satdar::model {
namespace {

// A config every check accepts: 96 x 64 FFN, head size 16.
ModelConfig Config() {
  ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 128;
  return c;
}

ModelConfig WithMoe(ModelConfig c, int experts, int top_k, int expert_size) {
  MoeConfig m;
  m.num_experts = experts;
  m.top_k = top_k;
  m.expert_intermediate_size = expert_size;
  c.moe = m;
  return c;
}

// InvalidArgument with exactly `message`.
void ExpectRefused(const ModelConfig& c, const std::string& message) {
  const absl::Status s = CheckDeviceSupport(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), message);
}

TEST(CheckDeviceSupport, AcceptsWithinTheLimits) {
  EXPECT_TRUE(CheckDeviceSupport(Config()).ok());
  EXPECT_TRUE(CheckDeviceSupport(WithMoe(Config(), kDeviceMaxExperts, kDeviceMaxTopK, 32)).ok());
  for (Residual r : {Residual::kHc, Residual::kMhc}) {
    ModelConfig c = Config();
    c.residual = r;
    c.hc_streams = kDeviceMaxHyperStreams;
    EXPECT_TRUE(CheckDeviceSupport(c).ok()) << Name(r);
  }
  ModelConfig c = Config();
  c.hidden_size = 512;  // head size 128
  EXPECT_TRUE(CheckDeviceSupport(c).ok());
}

TEST(CheckDeviceSupport, HyperStreams) {
  for (Residual r : {Residual::kHc, Residual::kMhc}) {
    ModelConfig c = Config();
    c.residual = r;
    c.hc_streams = 9;
    ExpectRefused(c, "device cuda: hc_streams 9 exceeds the GPU kernels' limit of 8");
  }
  // Without streams the field is unused.
  ModelConfig c = Config();
  c.hc_streams = 9;
  EXPECT_TRUE(CheckDeviceSupport(c).ok());
}

// HC's dynamic_alpha (n + 1, C) and dynamic_beta (1, C) run as two GEMMs: (n + 1) x C need not
// be a multiple of kDeviceParamAlign.
TEST(CheckDeviceSupport, HcProjectionsNeedNoAlignment) {
  ModelConfig c = Config();
  c.residual = Residual::kHc;
  c.hc_streams = 4;
  c.hidden_size = 36;  // (4 + 1) x 36 = 180; the FFN's 96 x 36 = 3456 is a multiple of 32
  ASSERT_NE(static_cast<int64_t>(c.hc_streams + 1) * c.hidden_size % kDeviceParamAlign, 0);
  EXPECT_TRUE(CheckDeviceSupport(c).ok());
}

TEST(CheckDeviceSupport, DenseFfnAlignment) {
  ModelConfig c = Config();
  c.hidden_size = 36;
  c.intermediate_size = 100;  // 3600 = 112 x 32 + 16
  ExpectRefused(c, "device cuda: intermediate_size x hidden_size = 100 x 36 must be a multiple "
                   "of 32");
}

// Under tensor parallelism a rank holds intermediate_size / tp rows of gate_proj and up_proj:
// 6 x 16 = 96 passes whole, but each of 2 ranks' 3 x 16 = 48 would leave up_proj unaligned.
TEST(CheckDeviceSupport, DenseFfnAlignmentPerTensorParallelRank) {
  ModelConfig c = Config();
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.intermediate_size = 6;
  EXPECT_TRUE(CheckDeviceSupport(c).ok());
  const absl::Status s = CheckDeviceSupport(c, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "device cuda: (intermediate_size / tensor-parallel size) x hidden_size = (6 / 2) x 16 "
            "must be a multiple of 32");
  c.intermediate_size = 4;  // 2 x 16 = 32 per rank
  EXPECT_TRUE(CheckDeviceSupport(c, 2).ok());
}

TEST(CheckDeviceSupport, ExpertAlignment) {
  ModelConfig c = WithMoe(Config(), 8, 2, 100);
  c.hidden_size = 36;
  c.intermediate_size = 100;  // unused with experts
  ExpectRefused(c, "device cuda: moe.expert_intermediate_size x hidden_size = 100 x 36 must be "
                   "a multiple of 32");
  c.moe->expert_intermediate_size = 96;
  EXPECT_TRUE(CheckDeviceSupport(c).ok());
}

TEST(CheckDeviceSupport, RouterLimits) {
  ExpectRefused(WithMoe(Config(), 257, 2, 32),
                "device cuda: moe.num_experts 257 exceeds the GPU router's limit of 256");
  ExpectRefused(WithMoe(Config(), 32, 17, 32),
                "device cuda: moe.top_k 17 exceeds the GPU router's limit of 16");
}

TEST(CheckDeviceSupport, HeadSize) {
  ModelConfig c = Config();
  c.hidden_size = 1024;  // 4 heads of 256
  ExpectRefused(c, "device cuda: head size hidden_size / num_attention_heads = 256 exceeds the "
                   "attention kernel's limit of 128");
}

}  // namespace
}  // namespace satdar::model
