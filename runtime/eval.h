// runtime/eval.h: `satdar eval`: the mean loss of given weights over batches of held-out data
// (a prepared dataset's validation split), and the analyses built on it. A validation split is
// read in order, each sequence (window) at most once: `batches` is capped by the split's size
// unless `repeat` lets it read the split again.
//   --gate-ablation zero|mean  SATFormer's intervention: the loss again with every gate set to
//                              0, or to its mean per layer and KV head on the same batches;
//   --gate-by-category         SATFormer's gates averaged by the part-of-speech group of the
//                              token (tagged Brown datasets);
//   --task mqar                recall accuracy on multi-query associative recall.
#ifndef SATDAR_RUNTIME_EVAL_H_
#define SATDAR_RUNTIME_EVAL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "data/batches.h"
#include "data/dataset.h"
#include "data/mqar.h"
#include "model/config.h"
#include "nlohmann/json.hpp"

namespace satdar::runtime {

struct EvalOptions {
  model::ModelConfig config;
  std::string weights;     // safetensors: weights or a checkpoint
  std::string checkpoint;  // or: a checkpoint file or folder of any layout
  bool synthetic_data = false;
  std::string data_dir;
  std::string data_format = "auto";
  int batch_size = 0;
  int seq_len = 0;
  int batches = 0;      // at most this many (fewer for a validation split too short)
  bool repeat = false;  // a validation split shorter than `batches` is read again from its start
  uint64_t seed = 0;
  int threads = 1;
  bool f64 = false;
  std::string gate_ablation = "none";  // none | zero | mean
  bool gate_by_category = false;
  std::optional<data::MqarOptions> mqar;  // --task mqar
};

// The held-out data of `options`: a dataset's validation split, MQAR, or windows of raw text /
// synthetic tokens that training never reads (at steps from kEvalFirstStep on).
struct HeldOut {
  std::unique_ptr<data::BatchSource> source;
  std::shared_ptr<const data::Dataset> dataset;  // when reading a prepared dataset
  const data::DatasetBatches* val = nullptr;     // its validation split (in source)
  const data::MqarBatches* mqar = nullptr;       // MQAR (in source)
  // How many sequences `options` reads: batches x batch_size, capped by a validation split's
  // windows unless `repeat`.
  int64_t Sequences(const EvalOptions& options) const;
};
absl::StatusOr<HeldOut> OpenHeldOut(const EvalOptions& options);
// Whether the held-out data carries part-of-speech tags (a dataset prepared from the tagged
// Brown corpus): what gate_by_category needs.
absl::StatusOr<bool> HasPosTags(const EvalOptions& options);

// {"loss", "tokens", "sequences", "batches", "stats"}: "tokens" counts the positions scored
// (sequences x seq_len); on a validation split also "split_tokens" (its size) and
// "split_sequences" (its windows). With an ablation {"ablated_loss", "loss_change"}; with MQAR
// {"mqar_accuracy", "queries"}; by category {"gate_by_category": {group: [layer][head]},
// "category_tokens": {group: count}}. The loss is the mean cross-entropy (auxiliary MoE losses
// are not included), weighted by the positions of each batch (the last batch of a split may be
// smaller).
absl::StatusOr<nlohmann::json> Evaluate(const EvalOptions& options);

// On raw text (no prepared dataset) evaluation reads windows at step numbers from here on,
// which training never reaches; prepared datasets are evaluated on their validation split.
inline constexpr int64_t kEvalFirstStep = int64_t{1} << 40;

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_EVAL_H_
