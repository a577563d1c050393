// model/config.h: the model config (Hugging Face style JSON, MODELS.md section 1).
//
//   SATDAR_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig("configs/demo.json"));
//
// Parsing rejects unknown fields, wrong types and impossible combinations with an
// InvalidArgument error that names the field.
#ifndef SATDAR_MODEL_CONFIG_H_
#define SATDAR_MODEL_CONFIG_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace satdar::model {

struct MoeConfig {
  int num_experts = 0;
  int top_k = 0;
  int expert_intermediate_size = 0;
  int num_shared_experts = 0;
  double router_aux_loss_coef = 0.01;
  double router_z_loss_coef = 0.001;
  bool norm_topk_prob = false;
};

struct ModelConfig {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads
  int max_position_embeddings = 4096;
  double rope_theta = 1e4;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = true;
  bool qk_norm = true;
  double initializer_range = 0.02;
  std::string value_residual = "none";    // none | resformer | satformer
  std::string resformer_mode = "fixed";   // fixed | learnable_plus
  std::string residual = "standard";      // standard | attnres | dar | hc | mhc | denseformer | muddformer
  int block_size = 0;                     // 0: the topology's full form (attnres 1, dar 2)
  std::string dar_variant = "cross";      // cross | self_kv | cross_v | fixed_kv
  int hc_streams = 4;
  std::optional<MoeConfig> moe;

  int head_size() const { return hidden_size / num_attention_heads; }
};

// Parses and validates JSON text; `source` names the file in errors.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);
// Canonical JSON (every field, defaults filled in), e.g. for checkpoints and logs.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_CONFIG_H_
