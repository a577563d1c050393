#include "model/layout_check.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::model {

absl::Status ValidateSharding(const ModelConfig& c, int tp, int pp, int ep) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (tp < 1 || pp < 1 || ep < 1) return bad("--tp, --pp and --ep must be at least 1");
  auto divisible = [&](const char* flag, int ways, const char* field, int value) -> absl::Status {
    if (value % ways == 0) return absl::OkStatus();
    return bad(absl::StrCat(flag, " ", ways, " does not divide config field \"", field, "\" (",
                            value, ")"));
  };
  if (tp > 1) {
    SATDAR_RETURN_IF_ERROR(divisible("--tp", tp, "num_attention_heads", c.num_attention_heads));
    SATDAR_RETURN_IF_ERROR(divisible("--tp", tp, "num_key_value_heads", c.num_key_value_heads));
    SATDAR_RETURN_IF_ERROR(divisible("--tp", tp, "intermediate_size", c.intermediate_size));
    SATDAR_RETURN_IF_ERROR(divisible("--tp", tp, "vocab_size", c.vocab_size));
    if (c.residual == Residual::kMuddFormer) {
      return bad("--tp > 1: config field \"residual\" \"muddformer\" feeds attention three "
                 "different inputs, which tensor parallelism does not split yet; use --tp 1");
    }
  }
  if (pp > 1) {
    SATDAR_RETURN_IF_ERROR(divisible("--pp", pp, "num_hidden_layers", c.num_hidden_layers));
    if (c.residual != Residual::kStandard && c.residual != Residual::kDar &&
        c.residual != Residual::kAttnRes) {
      return bad(absl::StrCat("--pp > 1: config field \"residual\" \"", Name(c.residual),
                              "\" cannot hand its state across pipeline stages yet (standard, "
                              "attnres and dar can); use --pp 1"));
    }
    if (c.value_residual == ValueResidualKind::kResFormer &&
        c.resformer_mode == ResformerMode::kLearnablePlus) {
      return bad("--pp > 1: config field \"resformer_mode\" \"learnable_plus\" shares its lambda "
                 "softmax across all layers, which pipeline stages do not split yet; use --pp 1");
    }
  }
  if (ep > 1) {
    // Without experts the EP ranks are more data-parallel replicas.
    if (c.moe.has_value()) {
      SATDAR_RETURN_IF_ERROR(divisible("--ep", ep, "moe.num_experts", c.moe->num_experts));
    }
  }
  return absl::OkStatus();
}

}  // namespace satdar::model
