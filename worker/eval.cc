#include "worker/eval.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/ops/gemm.h"
#include "core/thread_pool.h"
#include "data/batches.h"
#include "model/model.h"
#include "worker/weights.h"

namespace satdar::worker {

namespace {

template <typename T>
absl::StatusOr<nlohmann::json> EvaluateTyped(const EvalOptions& o) {
  model::GateAblation ablation = model::GateAblation::kNone;
  if (o.gate_ablation == "zero") ablation = model::GateAblation::kZero;
  if (o.gate_ablation == "mean") ablation = model::GateAblation::kMean;
  core::cpu::InitBlas();
  core::ThreadPool pool(o.threads);
  SATDAR_ASSIGN_OR_RETURN(auto model, model::CreateModel<T>(o.config, &pool));
  if (ablation != model::GateAblation::kNone && o.config.value_residual != "satformer") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gate-ablation: the config has value_residual \"", o.config.value_residual,
        "\"; gates exist only with \"satformer\""));
  }
  std::vector<T> params;
  std::vector<bool> present;
  SATDAR_RETURN_IF_ERROR(LoadWeights<T>("--weights", o.weights, model->params(), &params, &present));
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<data::BatchSource> source,
                          data::OpenBatchSource({o.synthetic_data, o.data_dir, o.data_format,
                                                 o.seed, o.config.vocab_size, o.seq_len},
                                                nullptr));
  std::vector<int32_t> tokens(static_cast<size_t>(o.batch_size) * (o.seq_len + 1));
  auto mean_loss = [&]() {
    double sum = 0;
    for (int i = 0; i < o.batches; ++i) {
      source->Batch(kEvalFirstStep + i, 0, o.batch_size, o.seq_len, tokens.data());
      model->Forward(params.data(), tokens.data(), o.batch_size, o.seq_len);
      sum += model->last_cross_entropy();
    }
    return sum / o.batches;
  };
  model->ResetStats();
  nlohmann::json result;
  result["loss"] = mean_loss();
  result["tokens"] = static_cast<int64_t>(o.batches) * o.batch_size * o.seq_len;
  nlohmann::json stats = nlohmann::json::object();
  model->AppendStats(&stats);
  result["stats"] = stats;
  if (ablation != model::GateAblation::kNone) {
    SATDAR_CHECK(model->SetGateAblation(ablation)) << "a SATFormer model without gates";
    const double ablated = mean_loss();
    result["gate_ablation"] = o.gate_ablation;
    result["ablated_loss"] = ablated;
    result["loss_change"] = ablated - result["loss"].get<double>();
  }
  return result;
}

}  // namespace

absl::StatusOr<nlohmann::json> Evaluate(const EvalOptions& options) {
  return options.f64 ? EvaluateTyped<double>(options) : EvaluateTyped<float>(options);
}

}  // namespace satdar::worker
