#include "model/layout_check.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"

namespace satdar::model {

namespace {

// The design table: what each residual topology can hand across a pipeline boundary and
// split over TP. A new design adds its row here and its makers in registry.cc.
struct TopologyRow {
  Residual residual;
  bool stages;  // BoundaryTensors/ForwardRange/BackwardRange implemented (topology.h)
  bool tensor_parallel;
  const char* tp_reason;  // why not, when it cannot
};
const std::vector<TopologyRow>& Topologies() {
  static const auto* rows = new std::vector<TopologyRow>{
      {Residual::kStandard, true, true, ""},
      {Residual::kAttnRes, true, true, ""},
      {Residual::kDar, true, true, ""},
      {Residual::kHc, false, true, ""},
      {Residual::kMhc, false, true, ""},
      {Residual::kDenseFormer, false, true, ""},
      {Residual::kMuddFormer, false, false,
       "feeds attention three different inputs, which tensor parallelism does not split yet"},
  };
  return *rows;
}

const TopologyRow& RowOf(Residual r) {
  for (const TopologyRow& row : Topologies()) {
    if (row.residual == r) return row;
  }
  SATDAR_CHECK(false) << "residual " << Name(r) << " has no row in the design table";
  return Topologies()[0];
}

}  // namespace

Capabilities CapabilitiesOf(const ModelConfig& c) {
  Capabilities out;
  const TopologyRow& row = RowOf(c.residual);
  if (!row.stages) {
    std::vector<std::string> can;
    for (const TopologyRow& r : Topologies()) {
      if (r.stages) can.push_back(Name(r.residual));
    }
    out.pipeline_stages = false;
    out.stages_blocker = absl::StrCat("config field \"residual\" \"", Name(c.residual),
                                      "\" cannot hand its state across pipeline stages yet (",
                                      absl::StrJoin(can, ", "), " can)");
  } else if (c.value_residual == ValueResidualKind::kResFormer &&
             c.resformer_mode == ResformerMode::kLearnablePlus) {
    out.pipeline_stages = false;
    out.stages_blocker =
        "config field \"resformer_mode\" \"learnable_plus\" shares its lambda softmax across "
        "all layers, which pipeline stages do not split yet";
  }
  if (!row.tensor_parallel) {
    out.tensor_parallel = false;
    out.tp_blocker =
        absl::StrCat("config field \"residual\" \"", Name(c.residual), "\" ", row.tp_reason);
  }
  return out;
}

absl::Status ValidateSharding(const ModelConfig& c, int tp, int pp, int ep,
                              const LayoutNames& names) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (tp < 1 || pp < 1 || ep < 1) {
    return bad(absl::StrCat(names.tp, ", ", names.pp, " and ", names.ep, " must be at least 1"));
  }
  auto divisible = [&](const std::string& size, int ways, const char* field,
                       int value) -> absl::Status {
    if (value % ways == 0) return absl::OkStatus();
    return bad(absl::StrCat(size, " ", ways, " does not divide config field \"", field, "\" (",
                            value, ")"));
  };
  const Capabilities can = CapabilitiesOf(c);
  if (tp > 1) {
    SATDAR_RETURN_IF_ERROR(divisible(names.tp, tp, "num_attention_heads", c.num_attention_heads));
    SATDAR_RETURN_IF_ERROR(divisible(names.tp, tp, "num_key_value_heads", c.num_key_value_heads));
    SATDAR_RETURN_IF_ERROR(divisible(names.tp, tp, "intermediate_size", c.intermediate_size));
    SATDAR_RETURN_IF_ERROR(divisible(names.tp, tp, "vocab_size", c.vocab_size));
    if (!can.tensor_parallel) {
      return bad(absl::StrCat(names.tp, " > 1: ", can.tp_blocker, "; use ", names.tp, " 1"));
    }
  }
  if (pp > 1) {
    SATDAR_RETURN_IF_ERROR(divisible(names.pp, pp, "num_hidden_layers", c.num_hidden_layers));
    if (!can.pipeline_stages) {
      return bad(absl::StrCat(names.pp, " > 1: ", can.stages_blocker, "; use ", names.pp, " 1"));
    }
  }
  if (ep > 1) {
    // Without experts the EP ranks are more data-parallel replicas.
    if (c.moe.has_value()) {
      SATDAR_RETURN_IF_ERROR(divisible(names.ep, ep, "moe.num_experts", c.moe->num_experts));
    }
  }
  return absl::OkStatus();
}

}  // namespace satdar::model
