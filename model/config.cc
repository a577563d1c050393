#include "model/config.h"

#include <initializer_list>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "nlohmann/json.hpp"

namespace satdar::model {

namespace {
using Json = nlohmann::json;

// Reads typed fields out of one JSON object, remembering the first error.
class FieldReader {
 public:
  FieldReader(const Json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  void Int(const char* name, int* out, bool required, int min_value, int max_value) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (required) Fail(name, "is required");
      return;
    }
    if (!it->is_number_integer()) return Fail(name, "must be an integer");
    const bool huge = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{1} << 62;
    const int64_t v = huge ? int64_t{1} << 62 : it->get<int64_t>();
    if (v < min_value || v > max_value) {
      return Fail(name, absl::StrCat("must be in [", min_value, ", ", max_value, "], got ",
                                     huge ? it->dump() : std::to_string(v)));
    }
    *out = static_cast<int>(v);
  }
  // A finite number in (min_exclusive, max_inclusive].
  void Double(const char* name, double* out, double min_exclusive, double max_inclusive) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return;
    if (!it->is_number()) return Fail(name, "must be a number");
    double v = it->get<double>();
    if (!(v > min_exclusive && v <= max_inclusive)) {
      return Fail(name, absl::StrCat("must be > ", min_exclusive, " and <= ", max_inclusive,
                                     ", got ", it->dump()));
    }
    *out = v;
  }
  void NonNegative(const char* name, double* out, double max_inclusive) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return;
    if (!it->is_number() || !(it->get<double>() >= 0 && it->get<double>() <= max_inclusive)) {
      return Fail(name, absl::StrCat("must be a number in [0, ", max_inclusive, "]"));
    }
    *out = it->get<double>();
  }
  void Bool(const char* name, bool* out) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return;
    if (!it->is_boolean()) return Fail(name, "must be true or false");
    *out = it->get<bool>();
  }
  // One of `values` (an enum's every value), by its Name().
  template <typename E>
  void Enum(const char* name, E* out, const std::vector<E>& values) {
    seen_.insert(name);
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return;
    if (!it->is_string()) return Fail(name, "must be a string");
    const std::string v = it->get<std::string>();
    std::vector<std::string> names;
    for (E e : values) {
      if (v == model::Name(e)) {
        *out = e;
        return;
      }
      names.push_back(model::Name(e));
    }
    Fail(name, absl::StrCat("must be one of \"", absl::StrJoin(names, "\", \""), "\", got \"",
                            v, "\""));
  }
  void Skip(const char* name) { seen_.insert(name); }
  void RejectUnknown() {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!seen_.count(it.key())) Fail(it.key().c_str(), "is not a known config field");
    }
  }
  void Fail(const std::string& name, const std::string& what) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat(source_, ": field \"", prefix_, name, "\" ", what));
    }
  }
  const absl::Status& status() const { return status_; }

 private:
  const Json& object_;
  std::string source_;
  std::string prefix_;
  std::set<std::string> seen_;
  absl::Status status_;
};

absl::Status Invalid(const std::string& source, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", field, "\" ", what));
}

absl::Status Validate(const ModelConfig& c, const std::string& src) {
  if (c.hidden_size % c.num_attention_heads != 0) {
    return Invalid(src, "num_attention_heads",
                   absl::StrCat("must divide hidden_size (", c.hidden_size, " % ",
                                c.num_attention_heads, " != 0)"));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Invalid(src, "num_key_value_heads",
                   absl::StrCat("must divide num_attention_heads (", c.num_attention_heads, " % ",
                                c.num_key_value_heads, " != 0)"));
  }
  if (c.head_size() % 2 != 0) {
    return Invalid(src, "num_attention_heads",
                   absl::StrCat("gives an odd head size ", c.head_size(),
                                "; rotary embeddings need an even head size"));
  }
  if (!c.moe.has_value() && c.intermediate_size < 1) {
    return Invalid(src, "intermediate_size", "is required for a dense MLP");
  }
  if (c.value_residual != ValueResidualKind::kNone && c.num_hidden_layers < 2) {
    return Invalid(src, "value_residual",
                   "needs at least 2 layers (layer 1 only produces V1); num_hidden_layers is " +
                       std::to_string(c.num_hidden_layers));
  }
  if ((c.residual == Residual::kAttnRes || c.residual == Residual::kTransparent) &&
      c.block_size > 1 && c.block_size % 2 != 0) {
    return Invalid(src, "block_size",
                   absl::StrCat("must be 1 (full) or even for ", Name(c.residual), ", got ",
                                c.block_size));
  }
  if (c.residual == Residual::kDar && c.block_size != 0 &&
      (c.block_size < 2 || c.block_size % 2 != 0)) {
    return Invalid(src, "block_size",
                   absl::StrCat("must be even and >= 2 for dar (2 = Full DAR), got ",
                                c.block_size));
  }
  if (c.moe.has_value()) {
    const MoeConfig& m = *c.moe;
    if (static_cast<int64_t>(m.num_experts) * c.num_hidden_layers > kMaxExpertLayers) {
      return Invalid(src, "moe.num_experts",
                     absl::StrCat("(", m.num_experts, ") times num_hidden_layers (",
                                  c.num_hidden_layers, ") must be at most ", kMaxExpertLayers,
                                  " experts in all"));
    }
    if (m.top_k > m.num_experts) {
      return Invalid(src, "moe.top_k",
                     absl::StrCat("(", m.top_k, ") must not exceed moe.num_experts (",
                                  m.num_experts, ")"));
    }
  }
  return absl::OkStatus();
}
}  // namespace

const char* Name(Residual r) {
  switch (r) {
    case Residual::kStandard: return "standard";
    case Residual::kAttnRes: return "attnres";
    case Residual::kDar: return "dar";
    case Residual::kHc: return "hc";
    case Residual::kMhc: return "mhc";
    case Residual::kDenseFormer: return "denseformer";
    case Residual::kMuddFormer: return "muddformer";
    case Residual::kTransparent: return "transparent";
  }
  return "?";
}

const char* Name(ValueResidualKind v) {
  switch (v) {
    case ValueResidualKind::kNone: return "none";
    case ValueResidualKind::kResFormer: return "resformer";
    case ValueResidualKind::kSatFormer: return "satformer";
  }
  return "?";
}

const char* Name(ResformerMode m) {
  return m == ResformerMode::kFixed ? "fixed" : "learnable_plus";
}

const char* Name(DarVariant d) {
  switch (d) {
    case DarVariant::kCross: return "cross";
    case DarVariant::kSelfKv: return "self_kv";
    case DarVariant::kCrossV: return "cross_v";
    case DarVariant::kFixedKv: return "fixed_kv";
  }
  return "?";
}

namespace {
template <typename E>
bool FromNameIn(const std::string& name, std::initializer_list<E> values, E* out) {
  for (E e : values) {
    if (name == Name(e)) {
      *out = e;
      return true;
    }
  }
  return false;
}
}  // namespace

bool FromName(const std::string& name, Residual* out) {
  return FromNameIn(name, {Residual::kStandard, Residual::kAttnRes, Residual::kTransparent,
                           Residual::kDar, Residual::kHc, Residual::kMhc, Residual::kDenseFormer,
                           Residual::kMuddFormer}, out);
}
bool FromName(const std::string& name, ValueResidualKind* out) {
  return FromNameIn(name, {ValueResidualKind::kNone, ValueResidualKind::kResFormer,
                           ValueResidualKind::kSatFormer}, out);
}
bool FromName(const std::string& name, ResformerMode* out) {
  return FromNameIn(name, {ResformerMode::kFixed, ResformerMode::kLearnablePlus}, out);
}
bool FromName(const std::string& name, DarVariant* out) {
  return FromNameIn(name, {DarVariant::kCross, DarVariant::kSelfKv, DarVariant::kCrossV,
                           DarVariant::kFixedKv}, out);
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  SATDAR_ASSIGN_OR_RETURN(Json j, core::ParseJson(json_text, source));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": config must be a JSON object"));
  }
  ModelConfig c;
  FieldReader r(j, source, "");
  r.Int("vocab_size", &c.vocab_size, true, 2, kMaxVocabSize);
  r.Int("hidden_size", &c.hidden_size, true, 2, kMaxHiddenSize);
  // 0 (or absent) is allowed with "moe", whose experts have their own width: the canonical
  // JSON (ModelConfigToJson) writes 0 there, and it must parse again (a job's stored config).
  r.Int("intermediate_size", &c.intermediate_size, false, 0, kMaxIntermediateSize);
  r.Int("num_hidden_layers", &c.num_hidden_layers, true, 1, kMaxLayers);
  r.Int("num_attention_heads", &c.num_attention_heads, true, 1, kMaxHeads);
  r.Int("num_key_value_heads", &c.num_key_value_heads, false, 1, kMaxHeads);
  // MODELS.md gives it no default: the positions a model is trained for are its user's choice.
  r.Int("max_position_embeddings", &c.max_position_embeddings, true, 1, kMaxPositions);
  r.Double("rope_theta", &c.rope_theta, 0.0, 1e12);
  r.Double("rms_norm_eps", &c.rms_norm_eps, 0.0, 1.0);
  r.Bool("tie_word_embeddings", &c.tie_word_embeddings);
  r.Bool("qk_norm", &c.qk_norm);
  r.Double("initializer_range", &c.initializer_range, 0.0, 1.0);
  r.Enum("value_residual", &c.value_residual,
         {ValueResidualKind::kNone, ValueResidualKind::kResFormer, ValueResidualKind::kSatFormer});
  r.Enum("resformer_mode", &c.resformer_mode,
         {ResformerMode::kFixed, ResformerMode::kLearnablePlus});
  r.Enum("residual", &c.residual,
         {Residual::kStandard, Residual::kAttnRes, Residual::kTransparent, Residual::kDar,
          Residual::kHc, Residual::kMhc, Residual::kDenseFormer, Residual::kMuddFormer});
  r.Int("block_size", &c.block_size, false, 1, 2 * kMaxLayers);
  r.Enum("dar_variant", &c.dar_variant,
         {DarVariant::kCross, DarVariant::kSelfKv, DarVariant::kCrossV, DarVariant::kFixedKv});
  r.Int("hc_streams", &c.hc_streams, false, 1, kMaxHyperStreams);
  r.Skip("moe");
  r.RejectUnknown();
  SATDAR_RETURN_IF_ERROR(r.status());
  auto moe = j.find("moe");
  if (moe != j.end() && !moe->is_null()) {
    if (!moe->is_object()) return Invalid(source, "moe", "must be null or an object");
    MoeConfig m;
    FieldReader mr(*moe, source, "moe.");
    mr.Int("num_experts", &m.num_experts, true, 1, kMaxExperts);
    mr.Int("top_k", &m.top_k, true, 1, kMaxExperts);
    mr.Int("expert_intermediate_size", &m.expert_intermediate_size, true, 1,
           kMaxIntermediateSize);
    mr.Int("num_shared_experts", &m.num_shared_experts, false, 0, kMaxExperts);
    mr.NonNegative("router_aux_loss_coef", &m.router_aux_loss_coef, 1e6);
    mr.NonNegative("router_z_loss_coef", &m.router_z_loss_coef, 1e6);
    mr.Bool("norm_topk_prob", &m.norm_topk_prob);
    mr.RejectUnknown();
    SATDAR_RETURN_IF_ERROR(mr.status());
    c.moe = m;
  }
  if (c.num_key_value_heads == 0) c.num_key_value_heads = c.num_attention_heads;
  SATDAR_RETURN_IF_ERROR(Validate(c, source));
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  auto text = core::ReadFileToString(path, core::kMaxSmallFileBytes);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", text.status().message()));
  }
  return ParseModelConfig(*text, path);
}

std::string DesignName(const ModelConfig& c) {
  std::string design = Name(c.residual);
  if (c.value_residual != ValueResidualKind::kNone) absl::StrAppend(&design, "+", Name(c.value_residual));
  if (c.moe.has_value()) absl::StrAppend(&design, "+moe");
  return design;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  Json j = {{"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_key_value_heads},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rope_theta", c.rope_theta},
            {"rms_norm_eps", c.rms_norm_eps},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"qk_norm", c.qk_norm},
            {"initializer_range", c.initializer_range},
            {"value_residual", Name(c.value_residual)},
            {"resformer_mode", Name(c.resformer_mode)},
            {"residual", Name(c.residual)},
            {"dar_variant", Name(c.dar_variant)},
            {"hc_streams", c.hc_streams}};
  if (c.block_size > 0) j["block_size"] = c.block_size;
  if (c.moe.has_value()) {
    const MoeConfig& m = *c.moe;
    j["moe"] = {{"num_experts", m.num_experts},
                {"top_k", m.top_k},
                {"expert_intermediate_size", m.expert_intermediate_size},
                {"num_shared_experts", m.num_shared_experts},
                {"router_aux_loss_coef", m.router_aux_loss_coef},
                {"router_z_loss_coef", m.router_z_loss_coef},
                {"norm_topk_prob", m.norm_topk_prob}};
  } else {
    j["moe"] = nullptr;
  }
  return j.dump(2);
}

}  // namespace satdar::model
