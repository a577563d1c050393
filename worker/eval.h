// worker/eval.h: `satdar eval`: the mean loss of given weights over batches of held-back
// data, and SATFormer's gate intervention (--gate-ablation zero|mean): the loss again with
// every gate set to 0, or to its mean per layer and KV head measured on the same batches.
#ifndef SATDAR_WORKER_EVAL_H_
#define SATDAR_WORKER_EVAL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "nlohmann/json.hpp"

namespace satdar::worker {

struct EvalOptions {
  model::ModelConfig config;
  std::string weights;  // safetensors: weights or a checkpoint
  bool synthetic_data = false;
  std::string data_dir;
  std::string data_format = "auto";
  int batch_size = 0;
  int seq_len = 0;
  int batches = 0;
  uint64_t seed = 0;
  int threads = 1;
  bool f64 = false;
  std::string gate_ablation = "none";  // none | zero | mean
};

// {"loss", "tokens", "stats"} and, with an ablation, {"ablated_loss", "loss_change"}.
// The loss is the mean cross-entropy (auxiliary MoE losses are not included).
absl::StatusOr<nlohmann::json> Evaluate(const EvalOptions& options);

// Evaluation reads sequences at step numbers from here on, which training never reaches, so
// it sees other windows of a corpus than training did (the data issue adds a held-out split).
inline constexpr int64_t kEvalFirstStep = int64_t{1} << 40;

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_EVAL_H_
