// model/param_roles.h: what a rank's parameters mean for the gradient reductions, the global
// gradient norm and ZeRO-1, read from the table's roles and flags (never from the names).
// The trainer's GradientSync (runtime/gradient_sync.h) reduces by these runs on either device,
// and the planner's cost model (cost_model.h) counts them.
//
//   ParamRoles roles = RolesOf(table, {.tp = 0, .pp = 1, .ep = 0, .pipeline = true}, tied);
//   for (auto [offset, length] : roles.dense) ...   // averaged over the data group
#ifndef SATDAR_MODEL_PARAM_ROLES_H_
#define SATDAR_MODEL_PARAM_ROLES_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "model/param_table.h"

namespace satdar::model {

using Runs = std::vector<std::pair<int64_t, int64_t>>;  // (offset, length), ascending

// Elements in `runs`.
int64_t RunElements(const Runs& runs);

// Where a rank sits in the mesh: its tensor-, pipeline- and expert-parallel coordinates, and
// whether there is more than one pipeline stage.
struct RankPlace {
  int tp = 0, pp = 0, ep = 0;
  bool pipeline = false;
};

struct ParamRoles {
  Runs tp_partial;  // summed over TP
  Runs pp_partial;  // summed over the pipeline stages (only with a pipeline)
  // The flat buffer as maximal runs of replicated weights (averaged over the data group) and
  // of routed experts' (averaged over dp only). The runs take each tensor's stride, so on an
  // aligned table they cover the padding too (it stays 0) and stay maximal.
  Runs dense, experts;
  std::pair<int64_t, int64_t> tied_embedding{-1, 0};  // on both end stages of a pipeline
  Runs in_norm;  // counted in the global gradient norm (replicated copies on one rank only)
  // Under ZeRO-1 each replica counts its shard: in_norm without the EP-rank-0 rule (the dense
  // partition's sum is then taken on EP rank 0 only).
  Runs in_norm_zero;
  Runs vocabulary;  // the embedding's and the untied head's rows this rank holds
};

// tied: the config's tie_word_embeddings.
ParamRoles RolesOf(const ParamTable& table, const RankPlace& place, bool tied);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_PARAM_ROLES_H_
