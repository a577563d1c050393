#include "coordinator/job_series.h"

#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "metrics/train_metrics.h"

namespace satdar::coordinator {

namespace {

using Json = nlohmann::json;
constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

Json NumberOrNull(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

// True for an array nested exactly `depth` deep with numbers (or nulls) at the bottom, of at
// most *budget numbers: the only shape of statistic the dashboard keeps.
bool NumberGrid(const Json& j, int depth, int64_t* budget) {
  if (depth == 0) return (j.is_number() || j.is_null()) && --*budget >= 0;
  if (!j.is_array()) return false;
  for (const Json& e : j) {
    if (!NumberGrid(e, depth - 1, budget)) return false;
  }
  return true;
}
constexpr int64_t kMaxStatNumbers = 1 << 20;
constexpr int64_t kMaxStep = int64_t{1} << 53;  // kept exactly as a double

}  // namespace

const std::vector<std::string>& JobSeries::Fields() {
  static const std::vector<std::string> kFields = {
      "step", "time_ms", "loss", "val_loss", "tokens_per_second", "mfu", "step_seconds",
      "grad_norm", "lr", "phase_data", "phase_compute", "phase_comm_wait",
      "phase_pipeline_bubble", "phase_optimizer"};
  return kFields;
}

JobSeries::Point JobSeries::ToPoint(const Json& r, int64_t time_ms) {
  Point p(Fields().size(), kMissing);
  auto get = [](const Json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : kMissing;
  };
  const std::vector<std::string>& f = Fields();
  p[1] = static_cast<double>(time_ms);
  const Json* phases = nullptr;
  if (auto it = r.find("phase_seconds"); it != r.end() && it->is_object()) phases = &*it;
  for (size_t i = 0; i < f.size(); ++i) {
    if (i == 1) continue;
    if (f[i].rfind("phase_", 0) == 0) {
      if (phases != nullptr) p[i] = get(*phases, f[i].c_str() + 6);
    } else {
      p[i] = get(r, f[i].c_str());
    }
  }
  return p;
}

void JobSeries::TakeStats(int64_t step, const Json& stats) {
  Json s = Json::object();
  int64_t budget = kMaxStatNumbers;
  for (const auto& [from, to] : {std::pair<const char*, const char*>{"satformer_gate_mean", "gate_mean"},
                                 {"satformer_gate_zero_fraction", "gate_zero"},
                                 {"moe_expert_load", "expert_load"}}) {
    auto it = stats.find(from);
    if (it != stats.end() && NumberGrid(*it, 2, &budget)) s[to] = *it;
  }
  // Depth weights: [sublayer][stream] entropy and largest weight (AttnRes and Transparent
  // Attention have one stream).
  for (const auto& [key, design, streams] :
       {std::tuple<const char*, const char*, bool>{"dar_depth_weights", "dar", true},
        {"attnres_depth_weights", "attnres", false},
        {"transparent_depth_weights", "transparent", false}}) {
    auto it = stats.find(key);
    if (it == stats.end() || !NumberGrid(*it, streams ? 3 : 2, &budget)) continue;
    Json entropy = Json::array(), largest = Json::array();
    for (const auto& per_stream : metrics::DepthWeightSummary(*it, streams)) {
      Json e = Json::array(), m = Json::array();
      for (const auto& [h, mx] : per_stream) {
        e.push_back(h);
        m.push_back(mx);
      }
      entropy.push_back(e);
      largest.push_back(m);
    }
    s["depth_design"] = design;
    s["depth_entropy"] = entropy;
    s["depth_max"] = largest;
  }
  if (s.empty()) return;
  stats_step_ = step;
  stats_ = s;
}

bool JobSeries::Add(const Json& record, int64_t time_ms) {
  if (!record.is_object()) return false;
  auto it = record.find("step");
  if (it == record.end() || !it->is_number_integer() || it->get<int64_t>() < 1 ||
      it->get<int64_t>() > kMaxStep) {
    return false;
  }
  const int64_t step = it->get<int64_t>();
  const int64_t newest = has_last_ ? static_cast<int64_t>(last_[0])
                                   : points_.empty() ? 0 : static_cast<int64_t>(points_.back()[0]);
  if (step <= newest) {  // a replay after a restart: the new attempt's values replace these
    while (!points_.empty() && points_.back()[0] >= static_cast<double>(step)) points_.pop_back();
    has_last_ = false;
  }
  if (has_last_ && static_cast<int64_t>(last_[0]) % stride_ == 0) points_.push_back(last_);
  has_last_ = false;
  Point p = ToPoint(record, time_ms);
  last_ = std::move(p);
  has_last_ = true;
  while (static_cast<int>(points_.size()) > kMaxPoints) {
    stride_ *= 2;
    std::vector<Point> kept;
    for (Point& q : points_) {
      if (static_cast<int64_t>(q[0]) % stride_ == 0) kept.push_back(std::move(q));
    }
    points_ = std::move(kept);
  }
  if (auto s = record.find("stats"); s != record.end() && s->is_object()) TakeStats(step, *s);
  return true;
}

Json JobSeries::ToJson() const {
  Json points = Json::array();
  auto add = [&](const Point& p) {
    Json row = Json::array();
    for (double v : p) row.push_back(NumberOrNull(v));
    points.push_back(row);
  };
  for (const Point& p : points_) add(p);
  if (has_last_) add(last_);
  return {{"stride", stride_},   {"fields", Fields()}, {"points", points},
          {"stats_step", stats_step_}, {"stats", stats_}};
}

absl::StatusOr<JobSeries> JobSeries::FromJson(const std::string& text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("job series: ", why));
  };
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("fields") || j["fields"] != Json(Fields())) return bad("fields differ from this build's");
  if (!j.contains("stride") || !j["stride"].is_number_integer() || j["stride"].get<int64_t>() < 1) {
    return bad("stride is not a positive integer");
  }
  if (!j.contains("points") || !j["points"].is_array()) return bad("points is not an array");
  JobSeries s;
  s.stride_ = j["stride"].get<int64_t>();
  for (const Json& row : j["points"]) {
    if (!row.is_array() || row.size() != Fields().size() || !row[0].is_number()) {
      return bad("a point does not have one value per field");
    }
    Point p;
    for (const Json& v : row) p.push_back(v.is_number() ? v.get<double>() : kMissing);
    s.points_.push_back(std::move(p));
  }
  // The newest point was written last; it goes back to being the newest record.
  if (!s.points_.empty() && static_cast<int64_t>(s.points_.back()[0]) % s.stride_ != 0) {
    s.last_ = s.points_.back();
    s.points_.pop_back();
    s.has_last_ = true;
  }
  if (j.contains("stats") && j["stats"].is_object()) {
    s.stats_ = j["stats"];
    s.stats_step_ = j.value("stats_step", int64_t{0});
  }
  return s;
}

}  // namespace satdar::coordinator
