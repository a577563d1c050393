#include "model/param_table.h"

#include <vector>

#include "core/check.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace satdar::model
