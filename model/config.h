// model/config.h: the model config (Hugging Face style JSON, MODELS.md section 1).
//
//   SATDAR_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig("configs/demo.json"));
//
// Parsing rejects unknown fields, keys given twice, missing required fields (vocab_size,
// hidden_size, num_hidden_layers, num_attention_heads, max_position_embeddings), wrong types,
// values out of their bounds (below) and impossible combinations with an InvalidArgument
// error that names the field. Config files are read up to 16 MiB.
#ifndef SATDAR_MODEL_CONFIG_H_
#define SATDAR_MODEL_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace satdar::model {

// Upper bounds of the config's counts: far above any published model, low enough that every
// product of them (parameters, activations) fits in 64 bits and a typo cannot ask for an
// exabyte. The memory estimate (model/memory_estimate.h) then refuses what does not fit.
inline constexpr int kMaxVocabSize = 1 << 24;         // 16.7M tokens
inline constexpr int kMaxHiddenSize = 1 << 16;        // 65536
inline constexpr int kMaxIntermediateSize = 1 << 20;  // 1M
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxHeads = 4096;
inline constexpr int kMaxPositions = 1 << 22;         // 4M
inline constexpr int kMaxHyperStreams = 64;
inline constexpr int kMaxExperts = 4096;
inline constexpr int64_t kMaxExpertLayers = int64_t{1} << 17;  // experts over all layers

// The design choices, parsed once from their JSON names (Name() gives the name back).
enum class Residual {
  kStandard, kAttnRes, kDar, kHc, kMhc, kDenseFormer, kMuddFormer, kTransparent
};
enum class ValueResidualKind { kNone, kResFormer, kSatFormer };
enum class ResformerMode { kFixed, kLearnablePlus };
enum class DarVariant { kCross, kSelfKv, kCrossV, kFixedKv };

const char* Name(Residual r);            // "standard", "attnres", "dar", "hc", "mhc", ...
const char* Name(ValueResidualKind v);   // "none", "resformer", "satformer"
const char* Name(ResformerMode m);       // "fixed", "learnable_plus"
const char* Name(DarVariant d);          // "cross", "self_kv", "cross_v", "fixed_kv"
// DAR's routing (MODELS.md section 4): for target stream s, {key stream, value stream}.
inline std::array<std::array<int, 2>, 2> DarRoute(DarVariant v) {
  switch (v) {
    case DarVariant::kCross: return {{{1, 0}, {0, 1}}};
    case DarVariant::kSelfKv: return {{{0, 0}, {1, 1}}};
    case DarVariant::kCrossV: return {{{0, 1}, {1, 0}}};
    case DarVariant::kFixedKv: return {{{0, 1}, {0, 1}}};
  }
  return {{{1, 0}, {0, 1}}};
}

// The value whose Name() is `name`; false (and *out unchanged) when there is none.
bool FromName(const std::string& name, Residual* out);
bool FromName(const std::string& name, ValueResidualKind* out);
bool FromName(const std::string& name, ResformerMode* out);
bool FromName(const std::string& name, DarVariant* out);

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
  int max_position_embeddings = 0;  // required (MODELS.md gives no default)
  double rope_theta = 1e4;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = true;
  bool qk_norm = true;
  double initializer_range = 0.02;
  ValueResidualKind value_residual = ValueResidualKind::kNone;
  ResformerMode resformer_mode = ResformerMode::kFixed;
  Residual residual = Residual::kStandard;
  int block_size = 0;                     // 0: the topology's full form (attnres and transparent 1, dar 2)
  DarVariant dar_variant = DarVariant::kCross;
  int hc_streams = 4;
  std::optional<MoeConfig> moe;

  int head_size() const { return hidden_size / num_attention_heads; }
};

// "dar+satformer+moe": the residual, then the value residual and the MoE when there are.
std::string DesignName(const ModelConfig& config);

// Parses and validates JSON text; `source` names the file in errors.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source);
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);
// Canonical JSON (every field, defaults filled in), e.g. for checkpoints and logs.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_CONFIG_H_
