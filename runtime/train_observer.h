// runtime/train_observer.h: what one rank of `satdar train` shows of its steps outside the
// --log-jsonl file: Prometheus metrics (metrics/train_metrics.h, served when
// TrainOptions::metrics_listen is set), MFU's terms, and the console's progress (a line per
// logged step, or one updating bar on a terminal).
//
//   TrainObserver obs(options, rank);
//   SATDAR_RETURN_IF_ERROR(obs.Start());          // before the ranks meet: scrapes work at once
//   obs.SetModel(full_parameters, world_size, design, layout, engine->PeakFlops());
//   obs.OnStep(step, &line, tokens, times);      // adds phase_seconds and mfu to the line
#ifndef SATDAR_RUNTIME_TRAIN_OBSERVER_H_
#define SATDAR_RUNTIME_TRAIN_OBSERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "metrics/rank_exporter.h"
#include "metrics/train_metrics.h"
#include "nlohmann/json.hpp"
#include "runtime/train_options.h"

namespace satdar::runtime {

// Where one step's wall time went, measured by the loop (data, forward-backward, optimizer)
// and, inside the last two, by the engine (time blocked in collectives and in the pipeline's
// neighbour exchanges).
struct StepTimes {
  double data = 0, forward_backward = 0, optimizer = 0;
  double fb_comm_wait = 0, fb_pipeline_wait = 0, opt_comm_wait = 0, opt_pipeline_wait = 0;
};

// {"data", "compute", "comm_wait", "pipeline_bubble", "optimizer"} seconds: compute is the
// forward-backward time not spent waiting, optimizer the update's; they add up to the step.
nlohmann::json PhaseSeconds(const StepTimes& t);

// "3m12s", "1h04m", "45s".
std::string FormatDuration(double seconds);

class TrainObserver {
 public:
  TrainObserver(const TrainOptions& options, int rank);

  // Serves /metrics when metrics_listen is set and prints where; Unavailable when the address
  // cannot be bound.
  absl::Status Start();

  // MFU's terms: the whole model's parameter count and the ranks sharing its work. The peak is
  // --peak-tflops, else the GPU's from its name (the engine logs that MFU itself), else a GEMM
  // measured now on this rank's threads (only when metrics are on: it takes about 0.2 s).
  // engine_peak_flops: the engine's own peak when it logs MFU itself (a GPU's), else 0.
  void SetModel(int64_t full_parameters, int world_size, const std::string& design,
                const std::string& layout, double engine_peak_flops);
  // The step a resumed run starts after (its first step pays for allocation: no ETA from it).
  void SetStartStep(int64_t start_step) { start_step_ = start_step; }

  // After each step: adds "phase_seconds" and, for an engine that logs none, "mfu" to the
  // line (only with metrics on), updates the metrics and prints the progress (rank 0).
  void OnStep(int64_t step, nlohmann::json* line, int64_t tokens, const StepTimes& times);
  void OnCheckpoint(double seconds);
  // A line that is not progress (validation, checkpoints): clears the bar first.
  void Print(const std::string& text);
  // The end of the steps: ends the bar's line.
  void Finish();

 private:
  void PrintProgress(int64_t step, const nlohmann::json& line);

  TrainOptions o_;
  int rank_;
  bool bar_ = false, bar_drawn_ = false;
  std::unique_ptr<metrics::TrainMetrics> metrics_;
  std::unique_ptr<metrics::RankExporter> exporter_;
  double flops_per_token_ = 0, peak_flops_ = 0;
  int world_size_ = 1;
  int64_t start_step_ = 0, steps_seen_ = 0;
  double seconds_seen_ = 0;
};

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_TRAIN_OBSERVER_H_
