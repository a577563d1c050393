// metrics/train_metrics.h: one training rank's Prometheus metrics (prometheus-cpp), fed from
// the step records the trainer logs (the `--log-jsonl` objects), so a metric and the log line
// it came from always agree. docs/OBSERVABILITY.md lists every family and its cardinality.
//
//   TrainMetrics m("job-7", 0);
//   m.ObserveStep(line, tokens_this_step);        // after each optimizer step
//   m.ObservePhase(Phase::kCheckpoint, seconds);  // time spent outside the step record
//   exporter = StartExporter("127.0.0.1:0", m.registry());  // rank_exporter.h
//
// Every family carries the constant labels job_id and rank; the others are bounded by the
// model's shape (layer, head, sublayer, stream, expert) or fixed lists (phase, group, kind),
// never by the step. Updates take a few atomic operations and short per-metric locks; a scrape
// serializes on its own thread, so a slow scraper never holds up a step.
#ifndef SATDAR_METRICS_TRAIN_METRICS_H_
#define SATDAR_METRICS_TRAIN_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace satdar::metrics {

// Where a step's wall time goes (satdar_train_phase_seconds_total{phase}).
enum class Phase { kData, kCompute, kCommWait, kPipelineBubble, kOptimizer, kCheckpoint };
const char* PhaseName(Phase phase);  // "data", "compute", "comm_wait", ...
inline constexpr Phase kAllPhases[] = {Phase::kData,           Phase::kCompute,
                                       Phase::kCommWait,       Phase::kPipelineBubble,
                                       Phase::kOptimizer,      Phase::kCheckpoint};

// Shannon entropy (nats) and largest entry of a weight vector (a depth retrieval's softmax).
std::pair<double, double> EntropyAndMax(const nlohmann::json& weights);

// Depth weights [sublayer][source] (AttnRes: streams false) or [sublayer][stream][source]
// (DAR) as [sublayer][stream] (entropy, largest weight); a sublayer that is not an array has
// no streams.
std::vector<std::vector<std::pair<double, double>>> DepthWeightSummary(const nlohmann::json& w,
                                                                       bool streams);

class TrainMetrics {
 public:
  TrainMetrics(const std::string& job_id, int rank);
  TrainMetrics(const TrainMetrics&) = delete;
  TrainMetrics& operator=(const TrainMetrics&) = delete;

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Static facts of the run (satdar_train_info{design, device, layout} = 1), the peak FLOP/s
  // MFU divides by, and the run's total steps.
  void SetInfo(const std::string& design, const std::string& device, const std::string& layout,
               double peak_flops, int64_t steps);

  // One optimizer step's record: step, loss, lr, grad_norm, tokens_per_second, step_seconds,
  // and when present mfu, phase_seconds {phase: s}, comm_bytes {group: bytes},
  // pp_boundary_bytes [[forward, backward], ...], device_bytes {kind: bytes}, val_loss and
  // stats (satformer_gate_mean/zero_fraction, dar/attnres/transparent_depth_weights,
  // moe_expert_load).
  // Keys it does not know are ignored; a value of the wrong type is skipped.
  void ObserveStep(const nlohmann::json& line, int64_t tokens);
  void ObservePhase(Phase phase, double seconds);

  // The text exposition of everything (what /metrics serves).
  std::string Serialize() const;

 private:
  void ObserveStats(const nlohmann::json& stats);
  void ObserveDepthWeights(const std::string& design, const nlohmann::json& w, bool streams);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* tokens_;
  prometheus::Counter* steps_;
  prometheus::Histogram* step_seconds_;
  std::map<Phase, prometheus::Counter*> phases_;
  // The gauges of a step record's numbers, created by the first record that has them.
  struct StepGauge {
    const char* key;
    prometheus::Family<prometheus::Gauge>* family;
    prometheus::Gauge* gauge;
  };
  std::vector<StepGauge> step_gauges_;
  prometheus::Gauge *total_steps_, *peak_flops_, *last_step_time_, *rss_, *peak_rss_;
  prometheus::Family<prometheus::Gauge>* info_;
  prometheus::Family<prometheus::Gauge>* device_memory_;
  prometheus::Family<prometheus::Counter>* comm_bytes_;
  prometheus::Family<prometheus::Counter>* boundary_bytes_;
  prometheus::Family<prometheus::Gauge>* gate_mean_;
  prometheus::Family<prometheus::Gauge>* gate_zero_;
  prometheus::Family<prometheus::Gauge>* depth_entropy_;
  prometheus::Family<prometheus::Gauge>* depth_max_;
  prometheus::Family<prometheus::Counter>* expert_tokens_;
  prometheus::Counter* dropped_tokens_;
};

}  // namespace satdar::metrics

#endif  // SATDAR_METRICS_TRAIN_METRICS_H_
