// f64 central-difference checks of the attention and MLP sublayers and of the whole
// baseline model (every parameter), on random weights with non-unit norm gains.
#include <vector>

#include "core/ops/gemm.h"
#include "core/ops/gradcheck_testutil.h"
#include "core/ops/rope.h"
#include "gtest/gtest.h"
#include "model/backend.h"
#include "model/layers/attention.h"
#include "model/layers/mlp.h"
#include "model/model.h"

namespace satdar::model {
namespace {

using core::testing::Dot;
using core::testing::GradError;
using core::testing::RandomVector;
using Vec = std::vector<double>;

class LayersGradcheck : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { core::cpu::InitBlas(); }
  core::ThreadPool pool_{2};
};

TEST_P(LayersGradcheck, Attention) {
  const bool qk_norm = GetParam();
  AttentionDims d{2, 5, 8, 4, 2, 2, qk_norm, 1e-6};
  const int n = d.rows(), qd = d.nh * d.hs, kd = d.nkv * d.hs;
  Vec x = RandomVector(n * d.c, 1), r = RandomVector(n * d.c, 2);
  // q, k and v stacked in one buffer, as the param table lays them out.
  Vec wqkv = RandomVector((qd + 2 * kd) * d.c, 3, 0.5), wo = RandomVector(d.c * qd, 6, 0.5),
      qn = RandomVector(d.hs, 7, 0.2, 1.0), kn = RandomVector(d.hs, 8, 0.2, 1.0);
  std::vector<double> cos, sin;
  core::cpu::RopeTables(&cos, &sin, d.t, d.hs, 10000.0);
  double* q0 = wqkv.data();
  AttentionWeights<double> w{q0, q0 + qd * d.c, q0 + (qd + kd) * d.c, wo.data(), qn.data(),
                             kn.data()};
  AttentionActs<Cpu<double>> acts;
  acts.Resize(d);
  AttentionScratch<Cpu<double>> scratch;
  scratch.Resize(d);
  Vec out(n * d.c);
  auto loss = [&] {
    EXPECT_TRUE(AttentionLayerForward(core::CpuExec{&pool_}, out.data(), &acts, x.data(), w, d,
                                      cos.data(), sin.data(), &scratch)
                    .ok());
    return Dot(out, r);
  };
  loss();
  Vec dx(x.size(), 0.0), gqkv(wqkv.size(), 0.0), go(wo.size(), 0.0), gqn(qn.size(), 0.0),
      gkn(kn.size(), 0.0);
  double* g0 = gqkv.data();
  AttentionWeights<double> g{g0, g0 + qd * d.c, g0 + (qd + kd) * d.c, go.data(), gqn.data(),
                             gkn.data()};
  ASSERT_TRUE(AttentionLayerBackward(core::CpuExec{&pool_}, dx.data(), g, r.data(), acts,
                                     x.data(), w, d, cos.data(), sin.data(), &scratch)
                  .ok());
  const double tol = 1e-7;
  EXPECT_LT(GradError(&x, dx, loss), tol);
  EXPECT_LT(GradError(&wqkv, gqkv, loss), tol);
  EXPECT_LT(GradError(&wo, go, loss), tol);
  if (qk_norm) {
    EXPECT_LT(GradError(&qn, gqn, loss), tol);
    EXPECT_LT(GradError(&kn, gkn, loss), tol);
  }
}

INSTANTIATE_TEST_SUITE_P(QkNorm, LayersGradcheck, ::testing::Bool());

TEST(MlpGradcheck, SwigluMlp) {
  core::cpu::InitBlas();
  core::ThreadPool pool(2);
  MlpDims d{6, 5, 7};
  Vec z = RandomVector(d.rows * d.c, 1), r = RandomVector(d.rows * d.c, 2);
  // gate_proj and up_proj stacked in one buffer, as the param table lays them out.
  Vec wgu = RandomVector(2 * d.f * d.c, 3, 0.5), wd = RandomVector(d.c * d.f, 5, 0.5);
  MlpWeights<double> w{wgu.data(), wgu.data() + d.f * d.c, wd.data()};
  MlpActs<Cpu<double>> acts;
  acts.Resize(d);
  Vec out(d.rows * d.c);
  auto loss = [&] {
    EXPECT_TRUE(MlpForward(core::CpuExec{&pool}, out.data(), &acts, z.data(), w, d).ok());
    return Dot(out, r);
  };
  loss();
  Vec dz(z.size(), 0.0), ggu(wgu.size(), 0.0), gd(wd.size(), 0.0);
  MlpWeights<double> g{ggu.data(), ggu.data() + d.f * d.c, gd.data()};
  MlpScratch<Cpu<double>> scratch;
  scratch.Resize(d);
  ASSERT_TRUE(
      MlpBackward(core::CpuExec{&pool}, dz.data(), g, r.data(), acts, z.data(), w, d, &scratch)
          .ok());
  EXPECT_LT(GradError(&z, dz, loss), 1e-7);
  EXPECT_LT(GradError(&wgu, ggu, loss), 1e-7);
  EXPECT_LT(GradError(&wd, gd, loss), 1e-7);
}

ModelConfig TinyConfig(bool tied, bool qk_norm) {
  ModelConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.tie_word_embeddings = tied;
  c.qk_norm = qk_norm;
  return c;
}

class ModelGradcheck : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(ModelGradcheck, EveryParameter) {
  core::cpu::InitBlas();
  core::ThreadPool pool(2);
  auto [tied, qk_norm] = GetParam();
  auto model = CreateModel<double>(TinyConfig(tied, qk_norm), &pool);
  ASSERT_TRUE(model.ok()) << model.status();
  const ParamTable& table = (*model)->params();
  Vec params(table.size());
  table.Initialize(params.data(), 3);
  // Random (not unit) gains and larger weights so every path carries signal.
  Vec noise = RandomVector(params.size(), 99, 0.3);
  for (size_t i = 0; i < params.size(); ++i) params[i] += noise[i];
  const int b = 2, t = 5;
  std::vector<int32_t> tokens(b * (t + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % 11);
  auto loss = [&] { return (*model)->Forward(params.data(), tokens.data(), b, t).value(); };
  loss();
  Vec grads(params.size(), 0.0);
  ASSERT_TRUE((*model)->Backward(params.data(), grads.data(), 1.0).ok());
  EXPECT_LT(GradError(&params, grads, loss), 1e-7);
}

INSTANTIATE_TEST_SUITE_P(TiedQkNorm, ModelGradcheck,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

}  // namespace
}  // namespace satdar::model
