// runtime/analysis.h: `satdar analyze`: what the DAR paper measures besides loss, on given
// weights and held-out batches (docs/ANALYSIS.md has the protocols).
//   cka     linear CKA (runtime/cka.h) between every pair of depth states of the residual
//           streams (Model::DepthStates): DAR's two histories against each other and within
//           each, HC/mHC's streams likewise; over the tokens of all held-out batches.
//   rescue  activation patching between a clean and a corrupted input: at the state between
//           layers k and k+1 (Model::ForwardToState), the corrupted run's tensors of stream s
//           (of every stream: "both"; none: "neither") are replaced by the clean run's, the
//           rest of the pass runs from there (Model::ForwardFromState), and the gain is the
//           fraction of the clean-vs-corrupted loss gap that closes:
//             gain(s) = (L_corrupted - L_restored(s)) / (L_corrupted - L_clean)
//           on every position (or, `scored` kAfterSpan, those after the corrupted span:
//           clean inputs, corrupted context).
#ifndef SATDAR_RUNTIME_ANALYSIS_H_
#define SATDAR_RUNTIME_ANALYSIS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "runtime/eval.h"

namespace satdar::runtime {

enum class Corruption {
  kSwap,    // the span comes from the next sequence of the batch (fluent, wrong context)
  kRandom,  // the span's tokens are drawn uniformly from the vocabulary (seeded)
};
const char* Name(Corruption c);  // "swap", "random"

// Which positions' losses the rescue scores (targets are always the clean next tokens).
enum class Scored {
  kAll,        // every position: the corrupted inputs and the clean ones after them
  kAfterSpan,  // only the positions after the corrupted span: clean inputs, corrupted context
};
const char* Name(Scored s);  // "all", "after"

struct AnalysisOptions {
  // The model, its weights and the held-out data (eval.h; gate_ablation, gate_by_category and
  // mqar are not read).
  EvalOptions eval;
  std::string checkpoint;  // instead of eval.weights: a checkpoint file or folder
  // cka: a pair counts as highly similar from this CKA on (the summary's high_cross_fraction).
  double cka_threshold = 0.9;
  // rescue: how the first ceil(corrupt_fraction * seq_len) input positions are corrupted, and
  // after which layers the state is restored (empty: every layer boundary 1 .. L-1).
  Corruption corruption = Corruption::kSwap;
  double corrupt_fraction = 0.5;
  Scored scored = Scored::kAll;
  std::vector<int> layers;
};

// The depth states gathered by AnalyzeCka, every batch's rows one after another (n x C).
struct CkaStates {
  int n = 0, d = 0;
  std::vector<model::DepthState> states;
};

// {"command": "cka", "design", "label", "streams", "depths": [layer of each depth],
//  "matrices": {"s0-s1": [[..]], "s0-s0": .., "s1-s1": ..} (every pair of streams a <= b: rows
//  are stream a's depths, columns stream b's), "states": [{"stream", "depth", "layer"}],
//  "summary": {"mean_unpaired_cross", "mean_paired_cross", "high_cross_fraction", "threshold"},
//  "tokens", "sequences"}. The cross summaries read every pair of different streams (a < b):
//  paired = the same depth, unpaired = different depths, skipping depth 0 (the embedding, which
//  every stream starts from). InvalidArgument for a design with one residual stream.
// states: unless null, the states themselves (for --save-states).
absl::StatusOr<nlohmann::json> AnalyzeCka(const AnalysisOptions& options, CkaStates* states);

// {"command": "rescue", "design", "label", "streams", "corruption", "corrupt_fraction",
//  "corrupted_positions", "scored", "scored_positions", "clean_loss", "corrupted_loss", "gap",
//  "depths": [{"layer", "loss": {"neither", "s0", .., "both"}, "gain": {...}}],
//  "summary": {"mean_gain": {"s0", .., "both", "neither"}, "asymmetry"}, "sequences"}.
// Losses are mean cross-entropies over the scored positions of every sequence. asymmetry (two
// streams): the mean over depths of |gain(s0) - gain(s1)|. InvalidArgument for a design with
// one residual stream, a layer outside [1, L), swap with batch size 1, or clean and corrupted
// losses that are equal (no gain is defined); "gap" (corrupted - clean) is negative where the
// corruption helps, as it can on an untrained model.
absl::StatusOr<nlohmann::json> AnalyzeRescue(const AnalysisOptions& options);

// Writes `states` as a NumPy .npy file of float64, shape (S, n, C) (tests/reference reads it).
absl::Status WriteStatesNpy(const std::string& path, const CkaStates& states);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_ANALYSIS_H_
