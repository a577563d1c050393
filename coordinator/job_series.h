// coordinator/job_series.h: what the coordinator's dashboard draws for one job, kept without
// Prometheus: the step records global rank 0 logs (worker heartbeats carry them), as bounded
// series, and the latest statistics snapshot (gates, depth weights, expert load).
//
// Bounded by decimation: points are kept for steps that are multiples of a stride; when more
// than kMaxPoints are kept the stride doubles and every other point goes. The newest record is
// always kept as well, so a chart ends at the current step. A record for a step at or before
// the newest (a restarted attempt resuming from its checkpoint replays steps) first drops the
// points from that step on.
#ifndef SATDAR_COORDINATOR_JOB_SERIES_H_
#define SATDAR_COORDINATOR_JOB_SERIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace satdar::coordinator {

class JobSeries {
 public:
  static constexpr int kMaxPoints = 512;
  // The fields kept per point, in this order (phase_* are seconds of the step per phase).
  static const std::vector<std::string>& Fields();

  // A step record (an object with at least "step"); false (nothing changes) when it is not one.
  bool Add(const nlohmann::json& record, int64_t time_ms);

  // {"stride", "fields": [...], "points": [[v, ...], ...] (NaN and missing as null),
  //  "stats_step", "stats": {gate_mean, gate_zero, depth_entropy, depth_max, depth_design,
  //  expert_load} or null}
  nlohmann::json ToJson() const;
  // The same, back (a coordinator restarted on its state folder); InvalidArgument when the
  // text is not what ToJson wrote.
  static absl::StatusOr<JobSeries> FromJson(const std::string& text);

  size_t size() const { return points_.size() + (has_last_ ? 1 : 0); }
  int64_t stride() const { return stride_; }

 private:
  using Point = std::vector<double>;  // Fields() order; NaN: missing
  static Point ToPoint(const nlohmann::json& record, int64_t time_ms);
  void TakeStats(int64_t step, const nlohmann::json& stats);

  int64_t stride_ = 1;
  std::vector<Point> points_;  // steps that are multiples of stride_, ascending
  Point last_;                 // the newest record (when it is not in points_)
  bool has_last_ = false;
  int64_t stats_step_ = 0;
  nlohmann::json stats_;       // null until a record carries statistics
};

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_JOB_SERIES_H_
