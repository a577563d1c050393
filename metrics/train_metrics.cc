#include "metrics/train_metrics.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <sys/resource.h>
#include <unistd.h>

#include "prometheus/text_serializer.h"

namespace satdar::metrics {

namespace {

using Json = nlohmann::json;
using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Step times from 10 ms (a tiny CPU model) to 4 minutes (a 7B step on few GPUs).
const prometheus::Histogram::BucketBoundaries kStepBuckets = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 240};

bool Number(const Json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  *out = it->get<double>();
  return true;
}

// Resident set size of this process now (/proc/self/statm, one short line) and at its peak
// (getrusage's high-water mark).
void ReadRss(double* current, double* peak) {
  *current = 0;
  long long pages_total = 0, pages_resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lld %lld", &pages_total, &pages_resident) == 2) {
      *current = static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
    }
    std::fclose(f);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  *peak = static_cast<double>(ru.ru_maxrss) * 1024.0;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kData: return "data";
    case Phase::kCompute: return "compute";
    case Phase::kCommWait: return "comm_wait";
    case Phase::kPipelineBubble: return "pipeline_bubble";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kCheckpoint: return "checkpoint";
  }
  return "unknown";
}

std::pair<double, double> EntropyAndMax(const Json& weights) {
  double entropy = 0, largest = 0;
  if (!weights.is_array()) return {0, 0};
  for (const Json& w : weights) {
    if (!w.is_number()) continue;
    const double p = w.get<double>();
    if (p > 0) entropy -= p * std::log(p);
    largest = std::max(largest, p);
  }
  return {entropy, largest};
}

std::vector<std::vector<std::pair<double, double>>> DepthWeightSummary(const Json& w,
                                                                       bool streams) {
  std::vector<std::vector<std::pair<double, double>>> out;
  if (!w.is_array()) return out;
  for (const Json& sub : w) {
    std::vector<std::pair<double, double>> per_stream;
    if (sub.is_array()) {
      const size_t n = streams ? sub.size() : 1;
      for (size_t s = 0; s < n; ++s) per_stream.push_back(EntropyAndMax(streams ? sub[s] : sub));
    }
    out.push_back(std::move(per_stream));
  }
  return out;
}

TrainMetrics::TrainMetrics(const std::string& job_id, int rank)
    : registry_(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels base = {{"job_id", job_id}, {"rank", std::to_string(rank)}};
  prometheus::Registry& r = *registry_;
  auto gauges = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Labels(base).Register(r);
  };
  auto counters = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Labels(base).Register(r);
  };
  auto gauge = [&](const char* name, const char* help) { return &gauges(name, help)->Add({}); };
  tokens_ = &counters("satdar_train_tokens_total",
                      "Tokens the job trained on (the global batch; every rank counts the same)")
                 ->Add({});
  steps_ = &counters("satdar_train_steps_total", "Optimizer steps completed by this process")->Add({});
  step_seconds_ =
      &BuildHistogram()
           .Name("satdar_train_step_seconds")
           .Help("Wall time of one optimizer step (data, forward, backward, reductions, update)")
           .Labels(base)
           .Register(r)
           .Add({}, kStepBuckets);
  auto* phases = counters("satdar_train_phase_seconds_total",
                          "Step wall time by phase: data, compute, comm_wait, pipeline_bubble, "
                          "optimizer, checkpoint");
  for (Phase p : kAllPhases) phases_[p] = &phases->Add({{"phase", PhaseName(p)}});
  // What a step measures has no sample until a step measured it: a 0 before the first step
  // would read as a loss or throughput of 0 (and trip the alerts' baselines).
  for (const auto& [key, name, help] :
       {std::tuple<const char*, const char*, const char*>{
            "step", "satdar_train_step", "The last completed optimizer step (1-based)"},
        {"loss", "satdar_train_loss", "Loss of the last step (the whole global batch)"},
        {"val_loss", "satdar_train_validation_loss", "The last validation loss"},
        {"lr", "satdar_train_learning_rate", "Learning rate of the last step"},
        {"grad_norm", "satdar_train_grad_norm",
         "Global gradient norm of the last step, before clipping"},
        {"tokens_per_second", "satdar_train_tokens_per_second",
         "Tokens per second of the last step (all replicas)"},
        {"mfu", "satdar_train_mfu_ratio", "Model FLOPs utilisation of the last step (0..1)"}}) {
    step_gauges_.push_back({key, gauges(name, help), nullptr});
  }
  total_steps_ = gauge("satdar_train_total_steps", "The run's total number of optimizer steps");
  peak_flops_ = gauge("satdar_train_peak_flops", "The peak FLOP/s per rank MFU divides by");
  // From the start of the process, so a run that never makes its first step also stalls.
  last_step_time_ = gauge("satdar_train_last_step_timestamp_seconds",
                          "Unix time at which the last step ended (the process start before one)");
  last_step_time_->Set(UnixSeconds());
  rss_ = gauge("satdar_process_resident_memory_bytes", "Resident set size of the rank's process");
  peak_rss_ = gauge("satdar_process_peak_resident_memory_bytes",
                    "Peak resident set size of the rank's process");
  info_ = gauges("satdar_train_info", "1, labelled with the design, device and layout of the run");
  device_memory_ = gauges("satdar_device_memory_bytes",
                          "GPU memory of this rank by kind: allocated, reserved, peak");
  comm_bytes_ = counters("satdar_comm_bytes_total",
                         "Payload bytes this rank handed to each communication group");
  boundary_bytes_ = counters("satdar_pipeline_boundary_bytes_total",
                             "Bytes across pipeline boundary b (between stages b and b+1), "
                             "forward activations and backward gradients");
  gate_mean_ = gauges("satdar_satformer_gate_mean",
                      "Mean SATFormer value gate per layer and KV head since the last statistics");
  gate_zero_ = gauges("satdar_satformer_gate_zero_ratio",
                      "Fraction of tokens whose SATFormer gate is exactly 0, per layer and KV head");
  depth_entropy_ = gauges("satdar_depth_weight_entropy_nats",
                          "Entropy of the mean depth-retrieval weights per sublayer and stream");
  depth_max_ = gauges("satdar_depth_weight_max_ratio",
                      "Largest mean depth-retrieval weight per sublayer and stream");
  expert_tokens_ = counters("satdar_moe_expert_tokens_total",
                            "Token assignments routed to each expert of each MoE layer");
  dropped_tokens_ =
      &counters("satdar_moe_dropped_tokens_total", "Token assignments dropped by expert capacity")
           ->Add({});
  double rss, peak;
  ReadRss(&rss, &peak);
  rss_->Set(rss);
  peak_rss_->Set(peak);
}

void TrainMetrics::SetInfo(const std::string& design, const std::string& device,
                           const std::string& layout, double peak_flops, int64_t steps) {
  info_->Add({{"design", design}, {"device", device}, {"layout", layout}}).Set(1);
  peak_flops_->Set(peak_flops);
  total_steps_->Set(static_cast<double>(steps));
}

void TrainMetrics::ObservePhase(Phase phase, double seconds) {
  if (seconds > 0 && std::isfinite(seconds)) phases_[phase]->Increment(seconds);
}

void TrainMetrics::ObserveStep(const Json& line, int64_t tokens) {
  double v = 0;
  if (tokens > 0) tokens_->Increment(static_cast<double>(tokens));
  steps_->Increment();
  // Gauges take NaN and Inf as they are: the exposition writes them the way Prometheus reads
  // them, so a diverging loss shows up instead of a stale value.
  for (StepGauge& g : step_gauges_) {
    if (!Number(line, g.key, &v)) continue;
    if (g.gauge == nullptr) g.gauge = &g.family->Add({});
    g.gauge->Set(v);
  }
  if (Number(line, "step_seconds", &v) && std::isfinite(v) && v >= 0) step_seconds_->Observe(v);
  if (auto it = line.find("phase_seconds"); it != line.end() && it->is_object()) {
    for (Phase p : kAllPhases) {
      if (Number(*it, PhaseName(p), &v)) ObservePhase(p, v);
    }
  }
  if (auto it = line.find("comm_bytes"); it != line.end() && it->is_object()) {
    for (const auto& [group, bytes] : it->items()) {
      if (bytes.is_number() && bytes.get<double>() > 0) {
        comm_bytes_->Add({{"group", group}}).Increment(bytes.get<double>());
      }
    }
  }
  if (auto it = line.find("pp_boundary_bytes"); it != line.end() && it->is_array()) {
    for (size_t b = 0; b < it->size(); ++b) {
      const Json& pair = (*it)[b];
      if (!pair.is_array() || pair.size() != 2) continue;
      const char* dirs[2] = {"forward", "backward"};
      for (int d = 0; d < 2; ++d) {
        if (!pair[d].is_number()) continue;
        auto& c = boundary_bytes_->Add({{"boundary", std::to_string(b)}, {"direction", dirs[d]}});
        if (pair[d].get<double>() > 0) c.Increment(pair[d].get<double>());
      }
    }
  }
  if (auto it = line.find("device_bytes"); it != line.end() && it->is_object()) {
    for (const char* kind : {"allocated", "reserved", "peak"}) {
      if (Number(*it, kind, &v)) device_memory_->Add({{"kind", kind}}).Set(v);
    }
  }
  if (auto it = line.find("stats"); it != line.end() && it->is_object()) ObserveStats(*it);
  double rss, peak;
  ReadRss(&rss, &peak);
  rss_->Set(rss);
  peak_rss_->Set(peak);
  last_step_time_->Set(UnixSeconds());
}

void TrainMetrics::ObserveDepthWeights(const std::string& design, const Json& w, bool streams) {
  const auto summary = DepthWeightSummary(w, streams);
  for (size_t l = 0; l < summary.size(); ++l) {
    for (size_t s = 0; s < summary[l].size(); ++s) {
      const prometheus::Labels labels = {
          {"design", design}, {"sublayer", std::to_string(l)}, {"stream", std::to_string(s)}};
      depth_entropy_->Add(labels).Set(summary[l][s].first);
      depth_max_->Add(labels).Set(summary[l][s].second);
    }
  }
}

void TrainMetrics::ObserveStats(const Json& stats) {
  // Gates: [layer 1..L-1][kv head] (layer 0 computes V1 and has none).
  for (const auto& [key, family] : {std::pair<const char*, prometheus::Family<prometheus::Gauge>*>{
                                        "satformer_gate_mean", gate_mean_},
                                    {"satformer_gate_zero_fraction", gate_zero_}}) {
    auto it = stats.find(key);
    if (it == stats.end() || !it->is_array()) continue;
    for (size_t l = 0; l < it->size(); ++l) {
      const Json& heads = (*it)[l];
      if (!heads.is_array()) continue;
      for (size_t h = 0; h < heads.size(); ++h) {
        if (!heads[h].is_number()) continue;
        family->Add({{"layer", std::to_string(l + 1)}, {"head", std::to_string(h)}})
            .Set(heads[h].get<double>());
      }
    }
  }
  if (auto it = stats.find("dar_depth_weights"); it != stats.end()) {
    ObserveDepthWeights("dar", *it, true);
  }
  if (auto it = stats.find("attnres_depth_weights"); it != stats.end()) {
    ObserveDepthWeights("attnres", *it, false);
  }
  if (auto it = stats.find("transparent_depth_weights"); it != stats.end()) {
    ObserveDepthWeights("transparent", *it, false);
  }
  if (auto it = stats.find("moe_expert_load"); it != stats.end() && it->is_array()) {
    for (size_t l = 0; l < it->size(); ++l) {
      const Json& experts = (*it)[l];
      if (!experts.is_array()) continue;
      for (size_t e = 0; e < experts.size(); ++e) {
        if (!experts[e].is_number()) continue;
        auto& c = expert_tokens_->Add({{"layer", std::to_string(l)}, {"expert", std::to_string(e)}});
        if (experts[e].get<double>() > 0) c.Increment(experts[e].get<double>());
      }
    }
  }
  double dropped = 0;
  if (Number(stats, "moe_dropped_tokens", &dropped) && dropped > 0) dropped_tokens_->Increment(dropped);
}

std::string TrainMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace satdar::metrics
