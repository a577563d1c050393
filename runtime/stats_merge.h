// runtime/stats_merge.h: one model's statistics (MODELS.md, "What satdar reports") from the
// pieces its model-parallel ranks hold. A pipeline stage reports the depth retrievals it owns
// (dar_*, attnres/transparent_depth_weights: its sublayers, in order) and zeros for other stages' layers
// (SATFormer gates, MoE load); a tensor-parallel rank holds its KV heads' gates; an
// expert-parallel rank routes its own tokens. The whole model's object:
//   depth keys                 the stages' lists concatenated in stage order (tp 0, ep 0)
//   satformer_gate_*           per stage the KV heads of the TP ranks side by side, then the
//                              stages added layer by layer (each layer is one stage's)
//   moe_expert_load, moe_dropped_tokens   added over stages and EP ranks (tp 0): the tokens
//                              of the replica group
//   resformer_lambda*          per layer the stage that has it (the others report null)
//   anything else              as the first piece has it
// Equal to what one rank reports for the same batch (tested through the command line).
#ifndef SATDAR_RUNTIME_STATS_MERGE_H_
#define SATDAR_RUNTIME_STATS_MERGE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "nlohmann/json.hpp"
#include "runtime/mesh_groups.h"

namespace satdar::runtime {

struct StatsPiece {
  int tp = 0, pp = 0, ep = 0;
  nlohmann::json stats;  // the rank's AppendStats object
};

// rows_split: sequence parallelism, the TP ranks' depth statistics cover their own tokens.
nlohmann::json MergeStats(const std::vector<StatsPiece>& pieces, bool rows_split = false);

// One stage's statistics from its model instances (the 1F1B schedule keeps one per micro-batch
// in flight; instance k ran weights[k] of the micro-batches): the counts (moe_*) added, every
// other number the weighted mean (a null stays null).
nlohmann::json MergeInstanceStats(const std::vector<nlohmann::json>& instances,
                                  const std::vector<double>& weights);

// A chunk's statistics since the last call, from its instances (anything with AppendStats and
// ResetStats: the CPU's Model<T>, a GPU's DeviceModel), micro-batch mb having run on instance
// mb % instances; the instances' statistics are reset.
template <class M>
nlohmann::json TakeChunkStats(const std::vector<M*>& instances, int microbatches) {
  nlohmann::json s = nlohmann::json::object();
  if (instances.size() == 1) {
    instances[0]->AppendStats(&s);
  } else {
    std::vector<nlohmann::json> each(instances.size(), nlohmann::json::object());
    std::vector<double> weights(instances.size(), 0);
    for (size_t k = 0; k < instances.size(); ++k) instances[k]->AppendStats(&each[k]);
    for (int mb = 0; mb < microbatches; ++mb) weights[mb % instances.size()] += 1;
    s = MergeInstanceStats(each, weights);
  }
  for (M* m : instances) m->ResetStats();
  return s;
}

// Every model-parallel rank's statistics over g.mp (host memory: JSON text in int64 words,
// lengths first, then the padded texts), merged into the whole model's (MergeStats) on every
// rank. mine: one object per model chunk this rank holds (chunk c is virtual stage
// c * pp + its pipeline coordinate). Every rank of g.mp must call it.
absl::StatusOr<nlohmann::json> GatherStats(const MeshGroups& g,
                                           const std::vector<nlohmann::json>& mine,
                                           bool sequence_parallel,
                                           const comm::CollectiveOptions& options);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_STATS_MERGE_H_
