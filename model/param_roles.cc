#include "model/param_roles.h"

namespace satdar::model {

namespace {

void AddRun(Runs* runs, int64_t offset, int64_t length) {
  if (!runs->empty() && runs->back().first + runs->back().second == offset) {
    runs->back().second += length;
  } else {
    runs->emplace_back(offset, length);
  }
}

}  // namespace

int64_t RunElements(const Runs& runs) {
  int64_t n = 0;
  for (const auto& run : runs) n += run.second;
  return n;
}

ParamRoles RolesOf(const ParamTable& table, const RankPlace& place, bool tied) {
  ParamRoles r;
  for (const ParamSpec& spec : table.specs()) {
    if (spec.tp_partial_grad) r.tp_partial.emplace_back(spec.offset, spec.numel);
    if (spec.pp_partial_grad && place.pipeline) r.pp_partial.emplace_back(spec.offset, spec.numel);
    AddRun(spec.expert ? &r.experts : &r.dense, spec.offset, spec.stride);
    const bool embedding = spec.role == ParamRole::kEmbedding;
    if (embedding && tied && place.pipeline) r.tied_embedding = {spec.offset, spec.numel};
    if (embedding || spec.role == ParamRole::kHead) AddRun(&r.vocabulary, spec.offset, spec.numel);
    // Replicated copies count once: on TP rank 0 (unless sharded), EP rank 0 (unless an
    // expert), and the first pipeline stage for a tied embedding and the stages' shared ones.
    const bool later_stage_copy =
        place.pipeline && place.pp != 0 && ((embedding && tied) || spec.pp_partial_grad);
    const bool counted_zero = (spec.sharded() || place.tp == 0) && !later_stage_copy;
    const bool counted = counted_zero && (spec.expert || place.ep == 0);
    if (counted) AddRun(&r.in_norm, spec.offset, spec.stride);
    if (counted_zero) AddRun(&r.in_norm_zero, spec.offset, spec.stride);
  }
  return r;
}

}  // namespace satdar::model
