// f64 central-difference check of every parameter's gradient for every design of the
// registry, on a tiny model with random (not initial) weights. The PyTorch reference
// (tests/reference) checks the same designs against an independent implementation.
#include <string>
#include <vector>

#include "core/ops/gemm.h"
#include "core/ops/gradcheck_testutil.h"
#include "gtest/gtest.h"
#include "model/model.h"

namespace satdar::model {
namespace {

using core::testing::GradError;
using core::testing::RandomVector;

struct Design {
  std::string name;
  std::string json;  // fields added to the tiny base config
};

std::string TinyConfig(const std::string& extra) {
  return R"({"vocab_size": 11, "hidden_size": 8, "intermediate_size": 12,
             "num_hidden_layers": 3, "max_position_embeddings": 512, "num_attention_heads": 2, "num_key_value_heads": 1)" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

class DesignGradcheck : public ::testing::TestWithParam<Design> {};

TEST_P(DesignGradcheck, EveryParameter) {
  core::cpu::InitBlas();
  core::ThreadPool pool(2);
  auto config = ParseModelConfig(TinyConfig(GetParam().json), GetParam().name);
  ASSERT_TRUE(config.ok()) << config.status();
  auto model = CreateModel<double>(*config, &pool);
  ASSERT_TRUE(model.ok()) << model.status();
  const ParamTable& table = (*model)->params();
  std::vector<double> params(table.size());
  table.Initialize(params.data(), 3);
  // Move every parameter off its initial value so no path is switched off (zero queries,
  // one-hot weights, closed gates).
  std::vector<double> noise = RandomVector(params.size(), 99, 0.3);
  for (size_t i = 0; i < params.size(); ++i) params[i] += noise[i];
  const int b = 2, t = 5;
  std::vector<int32_t> tokens(b * (t + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % 11);
  auto loss = [&] { return (*model)->Forward(params.data(), tokens.data(), b, t).value(); };
  loss();
  std::vector<double> grads(params.size(), 0.0);
  ASSERT_TRUE((*model)->Backward(params.data(), grads.data(), 1.0).ok());
  EXPECT_LT(GradError(&params, grads, loss), 1e-7);
  // Parameters marked unused get no gradient.
  for (const ParamSpec& spec : table.specs()) {
    if (!spec.unused) continue;
    for (int64_t i = 0; i < spec.numel; ++i) EXPECT_EQ(grads[spec.offset + i], 0.0) << spec.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Registry, DesignGradcheck,
    ::testing::Values(Design{"baseline", ""},
                      Design{"baseline_untied_no_qk_norm",
                             R"("tie_word_embeddings": false, "qk_norm": false)"},
                      Design{"satformer", R"("value_residual": "satformer")"},
                      Design{"resformer_fixed", R"("value_residual": "resformer")"},
                      Design{"resformer_learnable_plus",
                             R"("value_residual": "resformer", "resformer_mode": "learnable_plus")"},
                      Design{"attnres_full", R"("residual": "attnres")"},
                      Design{"attnres_block2", R"("residual": "attnres", "block_size": 2)"},
                      Design{"attnres_block4", R"("residual": "attnres", "block_size": 4)"},
                      Design{"satformer_attnres", R"("residual": "attnres", "block_size": 2,
                                                      "value_residual": "satformer")"},
                      Design{"transparent_full", R"("residual": "transparent")"},
                      Design{"transparent_block4", R"("residual": "transparent", "block_size": 4)"},
                      Design{"satformer_transparent", R"("residual": "transparent", "block_size": 2,
                                                          "value_residual": "satformer")"},
                      Design{"dar_full", R"("residual": "dar")"},
                      Design{"dar_block4", R"("residual": "dar", "block_size": 4)"},
                      Design{"dar_self_kv", R"("residual": "dar", "dar_variant": "self_kv")"},
                      Design{"dar_cross_v", R"("residual": "dar", "dar_variant": "cross_v",
                                               "block_size": 4)"},
                      Design{"dar_fixed_kv", R"("residual": "dar", "dar_variant": "fixed_kv")"},
                      Design{"satformer_dar", R"("residual": "dar", "block_size": 4,
                                                 "value_residual": "satformer")"},
                      Design{"moe", R"("moe": {"num_experts": 4, "top_k": 2,
                                               "expert_intermediate_size": 6})"},
                      Design{"moe_shared_norm", R"("moe": {"num_experts": 4, "top_k": 2,
                                 "expert_intermediate_size": 6, "num_shared_experts": 1,
                                 "norm_topk_prob": true, "router_aux_loss_coef": 0.1,
                                 "router_z_loss_coef": 0.05})"},
                      Design{"dar_moe", R"("residual": "dar", "block_size": 4,
                                           "moe": {"num_experts": 4, "top_k": 2,
                                                   "expert_intermediate_size": 6})"},
                      Design{"hc4", R"("residual": "hc")"},
                      Design{"hc2_satformer", R"("residual": "hc", "hc_streams": 2,
                                                 "value_residual": "satformer")"},
                      Design{"mhc4", R"("residual": "mhc")"},
                      Design{"mhc3", R"("residual": "mhc", "hc_streams": 3)"},
                      Design{"denseformer", R"("residual": "denseformer")"},
                      Design{"muddformer", R"("residual": "muddformer")"},
                      Design{"muddformer_satformer", R"("residual": "muddformer",
                                                        "value_residual": "satformer")"}),
    [](const ::testing::TestParamInfo<Design>& info) { return info.param.name; });

}  // namespace
}  // namespace satdar::model
