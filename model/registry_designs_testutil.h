// model/registry_designs_testutil.h: one tiny config per design and composition of the
// registry, for tests that must hold for every design (decode_test, analysis_hooks_test).
// Each is a few fields added to the tiny base config.
#ifndef SATDAR_MODEL_REGISTRY_DESIGNS_TESTUTIL_H_
#define SATDAR_MODEL_REGISTRY_DESIGNS_TESTUTIL_H_

#include <string>
#include <vector>

namespace satdar::model::testing {

// The tiny base config (vocabulary 11, C 8, 3 layers, 2 heads, 1 KV head) with `extra`
// fields added.
inline std::string TinyConfig(const std::string& extra) {
  return R"({"vocab_size": 11, "hidden_size": 8, "intermediate_size": 12,
             "num_hidden_layers": 3, "max_position_embeddings": 64,
             "num_attention_heads": 2, "num_key_value_heads": 1)" +
         (extra.empty() ? std::string() : ", " + extra) + "}";
}

struct Design {
  std::string name;
  std::string json;  // fields added to the tiny base config
};

inline std::vector<Design> RegistryDesigns() {
  return {
      {"baseline", ""},
      {"baseline_untied_no_qk_norm", R"("tie_word_embeddings": false, "qk_norm": false)"},
      {"satformer", R"("value_residual": "satformer")"},
      {"resformer_fixed", R"("value_residual": "resformer")"},
      {"resformer_learnable_plus",
       R"("value_residual": "resformer", "resformer_mode": "learnable_plus")"},
      {"attnres_full", R"("residual": "attnres")"},
      {"attnres_block2", R"("residual": "attnres", "block_size": 2)"},
      {"attnres_block4", R"("residual": "attnres", "block_size": 4)"},
      {"satformer_attnres",
       R"("residual": "attnres", "block_size": 2, "value_residual": "satformer")"},
      {"transparent_full", R"("residual": "transparent")"},
      {"transparent_block4", R"("residual": "transparent", "block_size": 4)"},
      {"satformer_transparent",
       R"("residual": "transparent", "block_size": 2, "value_residual": "satformer")"},
      {"dar_full", R"("residual": "dar")"},
      {"dar_block4", R"("residual": "dar", "block_size": 4)"},
      {"dar_self_kv", R"("residual": "dar", "dar_variant": "self_kv")"},
      {"dar_cross_v", R"("residual": "dar", "dar_variant": "cross_v", "block_size": 4)"},
      {"dar_fixed_kv", R"("residual": "dar", "dar_variant": "fixed_kv")"},
      {"satformer_dar", R"("residual": "dar", "block_size": 4, "value_residual": "satformer")"},
      {"moe", R"("moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 6})"},
      {"moe_shared_norm",
       R"("moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 6,
                  "num_shared_experts": 1, "norm_topk_prob": true,
                  "router_aux_loss_coef": 0.1, "router_z_loss_coef": 0.05})"},
      {"dar_moe", R"("residual": "dar", "block_size": 4,
                     "moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 6})"},
      {"hc4", R"("residual": "hc")"},
      {"hc2_satformer", R"("residual": "hc", "hc_streams": 2, "value_residual": "satformer")"},
      {"mhc4", R"("residual": "mhc")"},
      {"mhc3", R"("residual": "mhc", "hc_streams": 3)"},
      {"denseformer", R"("residual": "denseformer")"},
      {"muddformer", R"("residual": "muddformer")"},
      {"muddformer_satformer", R"("residual": "muddformer", "value_residual": "satformer")"},
  };
}

}  // namespace satdar::model::testing

#endif  // SATDAR_MODEL_REGISTRY_DESIGNS_TESTUTIL_H_
