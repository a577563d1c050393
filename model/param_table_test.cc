#include "model/param_table.h"

#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "gtest/gtest.h"
#include "model/layout_check.h"
#include "model/model.h"

namespace satdar::model {
namespace {

ModelConfig Config() {
  ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  return c;
}

ParamTable BaselineTable(const ModelConfig& c) {
  core::ThreadPool pool(1);
  auto model = CreateModel<float>(c, &pool);
  SATDAR_CHECK(model.ok()) << model.status();
  return (*model)->params();
}

TEST(ParamTable, BaselineNamesAndShapes) {
  ParamTable t = BaselineTable(Config());
  const ParamSpec* q = t.Find("model.layers.1.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (core::Shape{64, 64}));
  EXPECT_EQ(t.Find("model.layers.0.self_attn.k_proj.weight")->shape, (core::Shape{32, 64}));
  EXPECT_EQ(t.Find("model.layers.0.self_attn.q_norm.weight")->shape, (core::Shape{16}));
  EXPECT_EQ(t.Find("model.layers.0.mlp.down_proj.weight")->shape, (core::Shape{64, 96}));
  EXPECT_EQ(t.Find("lm_head.weight"), nullptr);  // tied by default
  int64_t per_layer = 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 2 * 16 + 64 + 3 * 96 * 64;
  EXPECT_EQ(t.size(), 256 * 64 + 2 * per_layer + 64);
  // Offsets are contiguous in table order.
  int64_t off = 0;
  for (const ParamSpec& s : t.specs()) {
    EXPECT_EQ(s.offset, off) << s.name;
    off += s.numel;
  }
}

TEST(ParamTable, UntiedHeadAndNoQkNorm) {
  ModelConfig c = Config();
  c.tie_word_embeddings = false;
  c.qk_norm = false;
  ParamTable t = BaselineTable(c);
  ASSERT_NE(t.Find("lm_head.weight"), nullptr);
  EXPECT_EQ(t.Find("model.layers.0.self_attn.q_norm.weight"), nullptr);
}

TEST(ParamTable, InitIsPureFunctionOfSeedNameIndex) {
  ParamTable t = BaselineTable(Config());
  std::vector<float> a(t.size()), b(t.size()), c(t.size());
  t.Initialize(a.data(), 5);
  t.Initialize(b.data(), 5);
  t.Initialize(c.data(), 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  const ParamSpec* norm = t.Find("model.norm.weight");
  for (int64_t i = 0; i < norm->numel; ++i) EXPECT_EQ(a[norm->offset + i], 1.0f);
  const ParamSpec* e = t.Find("model.embed_tokens.weight");
  double sq = 0;
  for (int64_t i = 0; i < e->numel; ++i) sq += a[e->offset + i] * a[e->offset + i];
  EXPECT_NEAR(std::sqrt(sq / e->numel), 0.02, 0.001);
  // A table with a different layout gives the same values for the same name.
  ParamTable t2;
  t2.Add("model.embed_tokens.weight", e->shape, ParamInit::Normal(0.02));
  std::vector<float> d(t2.size());
  t2.Initialize(d.data(), 5);
  for (int64_t i = 0; i < e->numel; ++i) ASSERT_EQ(d[i], a[e->offset + i]);
}

// A tensor-parallel shard initialises to exactly its slice of the whole tensor, along rows
// (column-parallel weights) and along columns (row-parallel ones).
TEST(ParamTable, ShardsInitialiseAsSlicesOfTheGlobalTensor) {
  ParamTable whole;
  whole.Add("w", {6, 4}, ParamInit::Normal(0.02));
  std::vector<double> full(whole.size());
  whole.Initialize(full.data(), 5);
  for (int dim : {0, 1}) {
    const int count = dim == 0 ? 3 : 2;
    for (int index = 0; index < count; ++index) {
      ParamTable part;
      const ParamSpec& spec = part.AddShard("w", {6, 4}, ParamInit::Normal(0.02), dim, index,
                                            count);
      EXPECT_EQ(spec.shape, dim == 0 ? (core::Shape{2, 4}) : (core::Shape{6, 2}));
      std::vector<double> mine(part.size());
      part.Initialize(mine.data(), 5);
      for (int64_t i = 0; i < part.size(); ++i) {
        const int64_t r = i / spec.shape[1], c = i % spec.shape[1];
        const int64_t g = dim == 0 ? (index * 2 + r) * 4 + c : r * 4 + index * 2 + c;
        EXPECT_EQ(spec.GlobalIndex(i), g);
        EXPECT_EQ(mine[i], full[g]) << "dim " << dim << " slice " << index << " element " << i;
      }
    }
  }
}

// A vocabulary that no TP size divides is padded inside the model; a padding that would leave
// a TP rank without a true row is refused, naming the smallest change that runs.
TEST(ParamTable, VocabularyPaddingForAnyTp) {
  ModelConfig c = Config();
  const LayoutNames flags = {"--tp", "--pp", "--ep", "--vocab-multiple"};
  c.vocab_size = 255;
  EXPECT_TRUE(ValidateSharding(c, 2, 1, 1, flags).ok());
  EXPECT_TRUE(ValidateSharding(c, 2, 1, 1, flags, 64).ok());  // 256 rows, 128 per rank
  EXPECT_EQ(PaddedVocab(255, 4, 64), 256);
  EXPECT_EQ(PaddedVocab(50257, 8, 128), 51200);
  EXPECT_EQ(PaddedVocab(32001, 1, 1), 32001);
  c.num_key_value_heads = 4;  // heads and width divisible by 4: the vocabulary is the limit
  c.vocab_size = 11;
  absl::Status s = ValidateSharding(c, 4, 1, 1, flags, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "--tp 4 with --vocab-multiple 4 pads config field \"vocab_size\" (11) to 16, which "
            "leaves the last tensor-parallel rank no vocabulary row; use --vocab-multiple 1");
  c.vocab_size = 5;
  EXPECT_EQ(ValidateSharding(c, 4, 1, 1, flags).message(),
            "--tp 4 with --vocab-multiple 1 pads config field \"vocab_size\" (5) to 8, which "
            "leaves the last tensor-parallel rank no vocabulary row; use --tp 3");
  EXPECT_EQ(ValidateSharding(c, 1, 1, 1, flags, 0).message(), "--vocab-multiple must be at least 1");

  // Slice 1 of 2 of a [5, 2] tensor padded to 8 rows: global row 4, then 3 padding rows.
  ParamTable table;
  const ParamSpec& spec = table.AddPaddedShard("w", {5, 2}, ParamInit::Normal(0.02), 0, 1, 2, 8);
  EXPECT_EQ(spec.shape, (core::Shape{4, 2}));
  EXPECT_TRUE(spec.padded());
  EXPECT_EQ(spec.TrueFirst(), 4);
  EXPECT_EQ(spec.TrueCount(), 1);
  EXPECT_EQ(spec.GlobalIndex(0), 8);
  EXPECT_EQ(spec.GlobalIndex(1), 9);
  for (int i = 2; i < 8; ++i) EXPECT_EQ(spec.GlobalIndex(i), -1) << i;
  std::vector<float> v(table.size(), 1.0f);
  table.Initialize(v.data(), 0);
  for (int i = 2; i < 8; ++i) EXPECT_EQ(v[i], 0.0f) << "padding element " << i;
  EXPECT_NE(v[0], 0.0f);
}

// Pipeline stages split the parameters: together they hold every tensor of the whole model
// once, except the tied embedding, which both end stages hold.
TEST(ParamTable, PipelineStagesPartitionTheModel) {
  const ModelConfig c = Config();
  const ParamTable whole = BaselineTable(c);
  core::ThreadPool pool(1);
  std::map<std::string, int> seen;
  for (int stage = 0; stage < 2; ++stage) {
    Sharding s;
    s.pp_rank = stage;
    s.pp_size = 2;
    auto model = CreateModel<float>(c, s, &pool);
    ASSERT_TRUE(model.ok()) << model.status();
    for (const ParamSpec& spec : (*model)->params().specs()) ++seen[spec.name];
  }
  for (const ParamSpec& spec : whole.specs()) {
    EXPECT_EQ(seen[spec.name], spec.name == "model.embed_tokens.weight" ? 2 : 1) << spec.name;
  }
  EXPECT_EQ(seen.size(), whole.specs().size());
}

TEST(ParamTable, ShardingErrorsNameTheFlagAndField) {
  ModelConfig c = Config();
  const LayoutNames flags = {"--tp", "--pp", "--ep"};
  absl::Status s = ValidateSharding(c, 3, 1, 1, flags);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--tp 3 does not divide config field \"num_attention_heads\" (4)");
  s = ValidateSharding(c, 1, 4, 1, flags);
  EXPECT_EQ(s.message(), "--pp 4 does not divide config field \"num_hidden_layers\" (2)");
  c.residual = Residual::kMhc;
  EXPECT_TRUE(ValidateSharding(c, 1, 2, 1).ok());  // every design splits into stages
  EXPECT_TRUE(ValidateSharding(c, 2, 1, 2).ok());  // without experts, EP ranks are replicas
  // Without the caller's names, the library names the sizes in words.
  EXPECT_EQ(ValidateSharding(c, 3, 1, 1).message(),
            "tensor-parallel size 3 does not divide config field \"num_attention_heads\" (4)");
}

// A token id outside the vocabulary is the Forward's error, before anything is computed.
TEST(ParamTable, ForwardRefusesTokenOutsideVocabulary) {
  ModelConfig c = Config();
  core::ThreadPool pool(1);
  auto model = CreateModel<float>(c, &pool);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> params((*model)->params().size());
  (*model)->params().Initialize(params.data(), 0);
  std::vector<int32_t> tokens(2 * 5, 1);
  tokens[7] = 256;
  absl::StatusOr<double> loss = (*model)->Forward(params.data(), tokens.data(), 2, 4);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loss.status().message(), "token id 256 at position 7 is outside [0, 256)");
  tokens[7] = -1;
  EXPECT_EQ((*model)->Forward(params.data(), tokens.data(), 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  tokens[7] = 255;
  EXPECT_TRUE((*model)->Forward(params.data(), tokens.data(), 2, 4).ok());
}

// The design table of the layout check (no model built) says what each topology says of itself.
TEST(ParamTable, DesignTableAgreesWithEveryTopology) {
  for (Residual r : {Residual::kStandard, Residual::kAttnRes, Residual::kTransparent,
                     Residual::kDar, Residual::kHc, Residual::kMhc, Residual::kDenseFormer,
                     Residual::kMuddFormer}) {
    ModelConfig c = Config();
    c.residual = r;
    if (r == Residual::kDar || r == Residual::kAttnRes || r == Residual::kTransparent) {
      c.block_size = 2;
    }
    EXPECT_EQ(CapabilitiesOf(c).pipeline_stages, TopologySupportsStages(c)) << Name(r);
    EXPECT_EQ(CapabilitiesOf(c).pipeline_stages, CapabilitiesOf(c).stages_blocker.empty());
  }
}

}  // namespace
}  // namespace satdar::model
