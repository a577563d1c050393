#include "runtime/train_observer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/thread_pool.h"
#include "core/timestamp.h"
#include "runtime/mfu.h"

namespace satdar::runtime {

using Json = nlohmann::json;

Json PhaseSeconds(const StepTimes& t) {
  auto busy = [](double total, double waits) { return std::max(0.0, total - waits); };
  return {{"data", t.data},
          {"compute", busy(t.forward_backward, t.fb_comm_wait + t.fb_pipeline_wait)},
          {"comm_wait", t.fb_comm_wait + t.opt_comm_wait},
          {"pipeline_bubble", t.fb_pipeline_wait + t.opt_pipeline_wait},
          {"optimizer", busy(t.optimizer, t.opt_comm_wait + t.opt_pipeline_wait)}};
}

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, t / 60 % 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%ds", t);
}

TrainObserver::TrainObserver(const TrainOptions& options, int rank) : o_(options), rank_(rank) {
  bar_ = o_.progress == "bar" || (o_.progress == "auto" && isatty(STDOUT_FILENO) == 1);
}

absl::Status TrainObserver::Start() {
  if (o_.metrics_listen.empty()) return absl::OkStatus();
  metrics_ = std::make_unique<metrics::TrainMetrics>(o_.job_id, rank_);
  auto exporter = metrics::RankExporter::Start(o_.metrics_listen, metrics_->registry());
  if (!exporter.ok()) {
    return absl::Status(exporter.status().code(),
                        absl::StrCat("rank ", rank_, ": ", exporter.status().message()));
  }
  exporter_ = std::move(*exporter);
  // Every rank says where (the worker reads this line to list the rank for Prometheus).
  std::printf("metrics: serving on http://%s/metrics\n", exporter_->address().c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

void TrainObserver::SetModel(int64_t full_parameters, int world_size, const std::string& design,
                             const std::string& layout, double engine_peak_flops) {
  world_size_ = std::max(1, world_size);
  flops_per_token_ = model::FlopsPerToken(full_parameters, o_.config, o_.seq_len);
  if (o_.peak_tflops > 0) {
    peak_flops_ = o_.peak_tflops * 1e12;
  } else if (engine_peak_flops > 0) {
    peak_flops_ = engine_peak_flops;
  } else if ((metrics_ != nullptr || (rank_ == 0 && !o_.log_jsonl.empty())) && !o_.gpu.enabled) {
    core::ThreadPool pool(o_.threads);
    peak_flops_ = MeasureCpuPeakFlops(&pool);
  }
  if (metrics_ != nullptr) {
    metrics_->SetInfo(design, o_.gpu.enabled ? "cuda" : "cpu", layout, peak_flops_, o_.steps);
  }
}

void TrainObserver::OnStep(int64_t step, Json* line, int64_t tokens, const StepTimes& times) {
  const double seconds = (*line)["step_seconds"].get<double>();
  if (step > start_step_ + 1 || o_.steps == start_step_ + 1) {
    ++steps_seen_;
    seconds_seen_ += seconds;
  }
  // The step's phases and MFU go into the record whether or not metrics are served.
  (*line)["phase_seconds"] = PhaseSeconds(times);
  if (!line->contains("mfu") && peak_flops_ > 0) {
    (*line)["mfu"] =
        Mfu((*line)["tokens_per_second"].get<double>(), world_size_, flops_per_token_, peak_flops_);
  }
  if (metrics_ != nullptr) metrics_->ObserveStep(*line, tokens);
  if (rank_ == 0 && !o_.quiet) PrintProgress(step, *line);
}

void TrainObserver::OnCheckpoint(double seconds) {
  if (metrics_ != nullptr) metrics_->ObservePhase(metrics::Phase::kCheckpoint, seconds);
}

void TrainObserver::Print(const std::string& text) {
  if (rank_ != 0 || o_.quiet) return;
  if (bar_drawn_) std::printf("\r\033[K");
  bar_drawn_ = false;
  // Lines for a log carry the time; a terminal's bar shows the ETA instead.
  std::printf("%s%s\n", bar_ ? "" : (core::UtcTimestamp() + " ").c_str(), text.c_str());
  std::fflush(stdout);
}

void TrainObserver::Finish() {
  if (bar_drawn_) std::printf("\n");
  bar_drawn_ = false;
  std::fflush(stdout);
}

void TrainObserver::PrintProgress(int64_t step, const Json& line) {
  const double loss = line["loss"].get<double>();
  const double tps = line["tokens_per_second"].get<double>();
  if (bar_) {
    // One line redrawn in place: step, a bar, loss, throughput, time left.
    const double frac = static_cast<double>(step) / static_cast<double>(o_.steps);
    const int width = 24, filled = static_cast<int>(frac * width);
    const double eta = steps_seen_ > 0 ? (o_.steps - step) * seconds_seen_ / steps_seen_ : NAN;
    std::string mfu;
    if (line.contains("mfu")) mfu = absl::StrFormat(" | MFU %.1f%%", 100 * line["mfu"].get<double>());
    std::printf("\r\033[Kstep %lld/%lld [%s%s] %3.0f%% | loss %.4f | %.0f tok/s%s | ETA %s",
                static_cast<long long>(step), static_cast<long long>(o_.steps),
                std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                100 * frac, loss, tps, mfu.c_str(), FormatDuration(eta).c_str());
    bar_drawn_ = true;
    std::fflush(stdout);
    return;
  }
  if (step % o_.log_every != 0 && step != o_.steps && step != start_step_ + 1) return;
  std::string device;
  if (line.contains("peak_device_bytes")) {
    device = absl::StrFormat(" | MFU %.1f%% | peak %.2f GiB", 100 * line["mfu"].get<double>(),
                             line["peak_device_bytes"].get<int64_t>() / 1073741824.0);
  }
  std::printf("%s step %5lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s%s\n",
              core::UtcTimestamp().c_str(), static_cast<long long>(step), static_cast<long long>(o_.steps), loss,
              line["lr"].get<double>(), line["grad_norm"].get<double>(), tps, device.c_str());
  std::fflush(stdout);
}

}  // namespace satdar::runtime
