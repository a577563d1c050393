#include "model/layout_check.h"

#include <algorithm>
#include <cstdint>
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
      {Residual::kTransparent, true, true, ""},
      {Residual::kDar, true, true, ""},
      {Residual::kHc, true, true, ""},
      {Residual::kMhc, true, true, ""},
      {Residual::kDenseFormer, true, true, ""},
      {Residual::kMuddFormer, true, true, ""},
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
  }
  if (!row.tensor_parallel) {
    out.tensor_parallel = false;
    out.tp_blocker =
        absl::StrCat("config field \"residual\" \"", Name(c.residual), "\" ", row.tp_reason);
  }
  return out;
}

const char* Name(Recompute r) {
  switch (r) {
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    case Recompute::kNone:
      break;
  }
  return "none";
}

Recompute RecomputeNamed(const std::string& name) {
  for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    if (name == Name(r)) return r;
  }
  return Recompute::kNone;
}

int PaddedVocab(int vocab_size, int tp, int vocab_multiple) {
  const int64_t unit = static_cast<int64_t>(tp) * vocab_multiple;
  return static_cast<int>((vocab_size + unit - 1) / unit * unit);
}

absl::Status ValidateSharding(const ModelConfig& c, int tp, int pp, int ep,
                              const LayoutNames& names, int vocab_multiple) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (tp < 1 || pp < 1 || ep < 1) {
    return bad(absl::StrCat(names.tp, ", ", names.pp, " and ", names.ep, " must be at least 1"));
  }
  if (vocab_multiple < 1) return bad(absl::StrCat(names.vocab_multiple, " must be at least 1"));
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
    // Every TP rank must hold at least one true vocabulary row after padding.
    auto fits = [&](int ways, int multiple) {
      return static_cast<int64_t>(PaddedVocab(c.vocab_size, ways, multiple)) / ways * (ways - 1) <
             c.vocab_size;
    };
    if (!fits(tp, vocab_multiple)) {
      std::string change;
      // The largest smaller power of two that fits (widths stay aligned), else a smaller tp.
      int most = 1;
      while (most * 2 < vocab_multiple) most *= 2;
      while (most >= 1 && !fits(tp, most)) most /= 2;
      if (most >= 1) {
        change = absl::StrCat(names.vocab_multiple, " ", most);
      } else {
        int ways = tp - 1;
        while (ways > 1 && !fits(ways, 1)) --ways;
        change = absl::StrCat(names.tp, " ", ways);
      }
      return bad(absl::StrCat(names.tp, " ", tp, " with ", names.vocab_multiple, " ",
                              vocab_multiple, " pads config field \"vocab_size\" (", c.vocab_size,
                              ") to ", PaddedVocab(c.vocab_size, tp, vocab_multiple),
                              ", which leaves the last tensor-parallel rank no vocabulary row; "
                              "use ", change));
    }
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

absl::Status CheckDeviceSupport(const ModelConfig& c, int tp) {
  // Every residual, value residual and FFN runs on the device; what is refused here is what
  // its kernels cannot take. HC's dynamic_alpha and dynamic_beta run as two GEMMs
  // (variants/hyper_connections.cc), so their sizes are free.
  if ((c.residual == Residual::kHc || c.residual == Residual::kMhc) &&
      c.hc_streams > kDeviceMaxHyperStreams) {
    return absl::InvalidArgumentError(absl::StrCat("device cuda: hc_streams ", c.hc_streams,
                                                   " exceeds the GPU kernels' limit of ",
                                                   kDeviceMaxHyperStreams));
  }
  // gate_proj and up_proj run as one (2F, D) GEMM (layers/mlp.cc checks they are adjacent), and
  // the device table starts each tensor at a multiple of kDeviceParamAlign elements.
  if (!c.moe.has_value()) {
    // Each of the tp ranks holds intermediate_size / tp rows of them.
    const int rows = c.intermediate_size / std::max(tp, 1);
    const int64_t ffn = static_cast<int64_t>(rows) * c.hidden_size;
    if (ffn % kDeviceParamAlign != 0) {
      if (tp > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device cuda: (intermediate_size / tensor-parallel size) x hidden_size = (",
            c.intermediate_size, " / ", tp, ") x ", c.hidden_size, " must be a multiple of ",
            kDeviceParamAlign));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "device cuda: intermediate_size x hidden_size = ", c.intermediate_size, " x ",
          c.hidden_size, " must be a multiple of ", kDeviceParamAlign));
    }
  } else {
    const int64_t expert = static_cast<int64_t>(c.moe->expert_intermediate_size) * c.hidden_size;
    if (expert % kDeviceParamAlign != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device cuda: moe.expert_intermediate_size x hidden_size = ",
          c.moe->expert_intermediate_size, " x ", c.hidden_size, " must be a multiple of ",
          kDeviceParamAlign));
    }
    if (c.moe->num_experts > kDeviceMaxExperts) {
      return absl::InvalidArgumentError(
          absl::StrCat("device cuda: moe.num_experts ", c.moe->num_experts,
                       " exceeds the GPU router's limit of ", kDeviceMaxExperts));
    }
    if (c.moe->top_k > kDeviceMaxTopK) {
      return absl::InvalidArgumentError(absl::StrCat("device cuda: moe.top_k ", c.moe->top_k,
                                                     " exceeds the GPU router's limit of ",
                                                     kDeviceMaxTopK));
    }
  }
  if (c.head_size() > kDeviceMaxHeadSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device cuda: head size hidden_size / num_attention_heads = ", c.head_size(),
        " exceeds the attention kernel's limit of ", kDeviceMaxHeadSize));
  }
  return absl::OkStatus();
}

}  // namespace satdar::model
