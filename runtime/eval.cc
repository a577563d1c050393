#include "runtime/eval.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/ops/gemm.h"
#include "core/thread_pool.h"
#include "data/batches.h"
#include "data/dataset.h"
#include "data/pos.h"
#include "model/model.h"
#include "runtime/weights.h"

namespace satdar::runtime {

absl::StatusOr<HeldOut> OpenHeldOut(const EvalOptions& o) {
  HeldOut h;
  if (o.mqar.has_value()) {
    SATDAR_RETURN_IF_ERROR(o.mqar->Validate(o.config.vocab_size, o.seq_len));
    auto m = std::make_unique<data::MqarBatches>(o.seed ^ 0x76616c69ull, *o.mqar);
    h.mqar = m.get();
    h.source = std::move(m);
  } else if (!o.synthetic_data && data::Dataset::IsDataset(o.data_dir)) {
    SATDAR_ASSIGN_OR_RETURN(h.dataset, data::Dataset::Open(o.data_dir, o.config.vocab_size));
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<data::DatasetBatches> v,
                            data::OpenValidation(h.dataset, o.seq_len, o.seed, "data_dir"));
    h.val = v.get();
    h.source = std::move(v);
  } else {
    SATDAR_ASSIGN_OR_RETURN(h.source, data::OpenBatchSource({o.synthetic_data, o.data_dir,
                                                             o.data_format, o.seed,
                                                             o.config.vocab_size, o.seq_len,
                                                             "data_dir", "seq_len"},
                                                            nullptr));
  }
  return h;
}

absl::StatusOr<bool> HasPosTags(const EvalOptions& o) {
  if (o.mqar.has_value() || o.synthetic_data || !data::Dataset::IsDataset(o.data_dir)) {
    return false;
  }
  SATDAR_ASSIGN_OR_RETURN(std::shared_ptr<const data::Dataset> dataset,
                          data::Dataset::Open(o.data_dir, o.config.vocab_size));
  return dataset->has_pos();
}

int64_t HeldOut::Sequences(const EvalOptions& o) const {
  int64_t sequences = static_cast<int64_t>(o.batches) * o.batch_size;
  if (val != nullptr && !o.repeat) {
    sequences = std::min<int64_t>(sequences, static_cast<int64_t>(val->samples_per_epoch()));
  }
  return sequences;
}

namespace {

// result["gate_by_category"][group] = [layer 2..L][KV head] mean gates, and
// result["category_tokens"][group], from the sums over each group's tokens.
void AddGateByCategory(const std::vector<double>& gate_sum,
                       const std::vector<int64_t>& group_tokens, int layers, int heads,
                       nlohmann::json* result) {
  nlohmann::json by = nlohmann::json::object(), counts = nlohmann::json::object();
  for (int g = data::kPosContent; g < data::kNumPosGroups; ++g) {
    nlohmann::json per_layer = nlohmann::json::array();
    for (int layer = 1; layer < layers; ++layer) {
      nlohmann::json per_head = nlohmann::json::array();
      for (int h = 0; h < heads; ++h) {
        const double sum = gate_sum[(static_cast<size_t>(g) * layers + layer) * heads + h];
        // A group with no token has no mean (null), never a gate of 0.
        per_head.push_back(group_tokens[g] > 0 ? nlohmann::json(sum / group_tokens[g])
                                               : nlohmann::json(nullptr));
      }
      per_layer.push_back(per_head);
    }
    by[data::PosGroupName(g)] = per_layer;
    counts[data::PosGroupName(g)] = group_tokens[g];
  }
  (*result)["gate_by_category"] = by;
  (*result)["category_tokens"] = counts;
}

template <typename T>
absl::StatusOr<nlohmann::json> EvaluateTyped(const EvalOptions& o) {
  model::GateAblation ablation = model::GateAblation::kNone;
  if (o.gate_ablation == "zero") ablation = model::GateAblation::kZero;
  if (o.gate_ablation == "mean") ablation = model::GateAblation::kMean;
  core::cpu::InitBlas();
  core::ThreadPool pool(o.threads);
  SATDAR_ASSIGN_OR_RETURN(auto model, model::CreateModel<T>(o.config, &pool));
  if (ablation != model::GateAblation::kNone && o.config.value_residual != model::ValueResidualKind::kSatFormer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gate_ablation: the config has value_residual \"", model::Name(o.config.value_residual),
        "\"; gates exist only with \"satformer\""));
  }
  std::vector<T> params;
  if (o.checkpoint.empty()) {
    std::vector<bool> present;
    SATDAR_RETURN_IF_ERROR(LoadWeights<T>("weights", o.weights, model->params(),
                                          model::ModelConfigToJson(o.config), &params, &present));
  } else {
    SATDAR_RETURN_IF_ERROR(LoadModelWeights<T>(o.weights, o.checkpoint, model->params(),
                                               model::ModelConfigToJson(o.config), &params));
  }
  SATDAR_ASSIGN_OR_RETURN(HeldOut held_out, OpenHeldOut(o));
  const data::BatchSource* source = held_out.source.get();
  const data::Dataset* dataset = held_out.dataset.get();
  const data::DatasetBatches* val = held_out.val;
  const data::MqarBatches* mqar = held_out.mqar;
  if (o.gate_by_category) {
    if (o.config.value_residual != model::ValueResidualKind::kSatFormer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gate_by_category: the config has value_residual \"", model::Name(o.config.value_residual),
          "\"; gates exist only with \"satformer\""));
    }
    if (dataset == nullptr || !dataset->has_pos()) {
      return absl::InvalidArgumentError(
          "gate_by_category: needs data_dir prepared from the tagged Brown corpus (its "
          "part-of-speech sidecars)");
    }
  }
  // How many sequences to score: a validation split's windows at most once unless repeated.
  const int64_t sequences = held_out.Sequences(o);
  const int batches = static_cast<int>((sequences + o.batch_size - 1) / o.batch_size);
  const int layers = o.config.num_hidden_layers, heads = o.config.num_key_value_heads;
  std::vector<double> gate_sum(static_cast<size_t>(data::kNumPosGroups) * layers * heads, 0.0);
  std::vector<int64_t> group_tokens(data::kNumPosGroups, 0);
  int64_t queries = 0, recalled = 0;
  std::vector<int32_t> tokens(static_cast<size_t>(o.batch_size) * (o.seq_len + 1)), pred;
  std::vector<double> gates;
  // One pass: the mean loss, and (first pass only) the MQAR and category statistics.
  auto mean_loss = [&](bool analyse) -> absl::StatusOr<double> {
    double sum = 0;  // cross-entropy x sequences
    for (int i = 0; i < batches; ++i) {
      const int64_t first = static_cast<int64_t>(i) * o.batch_size;
      const int count = static_cast<int>(std::min<int64_t>(o.batch_size, sequences - first));
      source->Batch(kEvalFirstStep + i, 0, first, count, o.seq_len, tokens.data());
      SATDAR_RETURN_IF_ERROR(
          model->Forward(params.data(), tokens.data(), count, o.seq_len).status());
      sum += model->last_cross_entropy() * count;
      if (!analyse) continue;
      if (mqar != nullptr) {
        model->Predictions(&pred);
        for (int b = 0; b < count; ++b) {
          for (int t : mqar->QueryPositions(o.seq_len)) {
            ++queries;
            recalled += pred[b * o.seq_len + t] == tokens[b * (o.seq_len + 1) + t + 1];
          }
        }
      }
      if (o.gate_by_category) {
        for (int b = 0; b < count; ++b) {
          const uint64_t start = val->WindowStart(first + b);
          for (int t = 0; t < o.seq_len; ++t) {
            ++group_tokens[dataset->pos(data::Split::kVal, start + t)];
          }
        }
        for (int layer = 1; layer < layers; ++layer) {
          if (!model->GateValues(layer, &gates)) continue;
          for (int b = 0; b < count; ++b) {
            const uint64_t start = val->WindowStart(first + b);
            for (int t = 0; t < o.seq_len; ++t) {
              const int g = dataset->pos(data::Split::kVal, start + t);
              for (int h = 0; h < heads; ++h) {
                gate_sum[(static_cast<size_t>(g) * layers + layer) * heads + h] +=
                    gates[(static_cast<size_t>(b) * o.seq_len + t) * heads + h];
              }
            }
          }
        }
      }
    }
    return sum / static_cast<double>(sequences);
  };
  model->ResetStats();
  nlohmann::json result;
  SATDAR_ASSIGN_OR_RETURN(const double loss, mean_loss(true));
  result["loss"] = loss;
  result["tokens"] = sequences * o.seq_len;
  result["sequences"] = sequences;
  result["batches"] = batches;
  if (val != nullptr) {
    result["split_tokens"] = dataset->tokens(data::Split::kVal);
    result["split_sequences"] = val->samples_per_epoch();
  }
  nlohmann::json stats = nlohmann::json::object();
  model->AppendStats(&stats);
  result["stats"] = stats;
  if (mqar != nullptr) {
    result["mqar_accuracy"] = queries > 0 ? static_cast<double>(recalled) / queries : 0.0;
    result["queries"] = queries;
  }
  if (o.gate_by_category) AddGateByCategory(gate_sum, group_tokens, layers, heads, &result);
  if (ablation != model::GateAblation::kNone) {
    SATDAR_CHECK(model->SetGateAblation(ablation)) << "a SATFormer model without gates";
    SATDAR_ASSIGN_OR_RETURN(const double ablated, mean_loss(false));
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

}  // namespace satdar::runtime
