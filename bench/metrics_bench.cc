// One rank's /metrics at a model's full shape: every family filled as a training step with
// statistics fills it (SATFormer gates when the config has them, DAR/AttnRes depth weights per
// retrieval and stream, MoE load per layer and expert, five communication groups, the pipeline
// boundaries of --pp, GPU memory), served by the real exporter and scraped over loopback.
// The model itself is not run: the page's size depends only on the shapes.
//   bazel run -c opt //bench:metrics_bench -- configs/dar-moe-7b.json [--pp 4] [--scrapes 200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "metrics/http_server.h"
#include "metrics/rank_exporter.h"
#include "metrics/train_metrics.h"
#include "model/config.h"

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A step record with statistics of the config's shape (values are placeholders in [0, 1]).
Json FullRecord(const satdar::model::ModelConfig& c, int pp, int64_t step) {
  Json stats = Json::object();
  const int layers = c.num_hidden_layers, nkv = c.num_key_value_heads;
  if (c.value_residual == satdar::model::ValueResidualKind::kSatFormer) {
    Json mean = Json::array();
    for (int l = 1; l < layers; ++l) mean.push_back(std::vector<double>(nkv, 0.3));
    stats["satformer_gate_mean"] = mean;
    stats["satformer_gate_zero_fraction"] = mean;
  }
  const int64_t block = c.block_size > 0 ? c.block_size : 2;
  if (c.residual == satdar::model::Residual::kDar || c.residual == satdar::model::Residual::kAttnRes) {
    const bool dar = c.residual == satdar::model::Residual::kDar;
    Json w = Json::array();
    for (int64_t i = 0; i <= 2 * layers; ++i) {
      const int64_t n = 1 + (i + block - 1) / block;
      Json v(std::vector<double>(n, 1.0 / n));
      w.push_back(dar ? Json::array({v, v}) : v);
    }
    stats[dar ? "dar_depth_weights" : "attnres_depth_weights"] = w;
  }
  if (c.moe.has_value()) {
    Json load = Json::array();
    for (int l = 0; l < layers; ++l) load.push_back(std::vector<int64_t>(c.moe->num_experts, 100 + step));
    stats["moe_expert_load"] = load;
    stats["moe_dropped_tokens"] = 0;
  }
  Json boundaries = Json::array();
  for (int s = 0; s + 1 < pp; ++s) boundaries.push_back({1 << 20, 1 << 20});
  return {{"step", step}, {"loss", 3.5}, {"lr", 1e-4}, {"grad_norm", 0.8},
          {"tokens_per_second", 5e4}, {"step_seconds", 1.2}, {"mfu", 0.41},
          {"phase_seconds", {{"data", 0.001}, {"compute", 0.9}, {"comm_wait", 0.2},
                             {"pipeline_bubble", 0.1}, {"optimizer", 0.05}}},
          {"comm_bytes", {{"tp", 1e8}, {"pp", 1e7}, {"ep", 1e8}, {"data", 1e9}, {"mp", 1e6}}},
          {"pp_boundary_bytes", boundaries},
          {"device_bytes", {{"allocated", 6e10}, {"reserved", 7e10}, {"peak", 7.5e10}}},
          {"stats", stats}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: metrics_bench CONFIG.json [--pp N] [--scrapes N]\n");
    return 2;
  }
  int pp = 4, scrapes = 200;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--pp") pp = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--scrapes") scrapes = std::atoi(argv[i + 1]);
  }
  auto config = satdar::model::LoadModelConfig(argv[1]);
  if (!config.ok()) {
    std::fprintf(stderr, "metrics_bench: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  satdar::metrics::TrainMetrics m("job-000001-bench", 0);
  m.SetInfo("dar+moe", "cuda", "dp=8 tp=1 pp=4 ep=8", 989e12, 100000);
  // Step records: the cost of an update, with and without statistics.
  const Json with_stats = FullRecord(*config, pp, 1);
  Json plain = with_stats;
  plain.erase("stats");
  const int updates = 2000;
  auto t0 = Clock::now();
  for (int i = 0; i < updates; ++i) m.ObserveStep(plain, 1 << 20);
  const double plain_us = Ms(t0) * 1000 / updates;
  t0 = Clock::now();
  for (int i = 0; i < 200; ++i) m.ObserveStep(with_stats, 1 << 20);
  const double stats_us = Ms(t0) * 1000 / 200;

  auto exporter = satdar::metrics::RankExporter::Start("127.0.0.1:0", m.registry());
  if (!exporter.ok()) {
    std::fprintf(stderr, "metrics_bench: %s\n", std::string(exporter.status().message()).c_str());
    return 1;
  }
  std::vector<double> times;
  size_t bytes = 0, series = 0;
  for (int i = 0; i < scrapes; ++i) {
    t0 = Clock::now();
    auto r = satdar::metrics::HttpGet((*exporter)->address(), "/metrics");
    times.push_back(Ms(t0));
    if (!r.ok() || r->status != 200) {
      std::fprintf(stderr, "metrics_bench: scrape failed\n");
      return 1;
    }
    bytes = r->body.size();
    series = 0;  // sample lines (not # HELP / # TYPE)
    for (size_t p = 0; p < r->body.size();) {
      const size_t nl = r->body.find('\n', p);
      if (r->body[p] != '#') ++series;
      p = nl == std::string::npos ? r->body.size() : nl + 1;
    }
  }
  std::sort(times.begin(), times.end());
  std::printf("config %s (pp %d): %zu samples, %.1f KiB per scrape\n", argv[1], pp, series,
              bytes / 1024.0);
  std::printf("scrape over loopback: p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d scrapes)\n",
              times[times.size() / 2], times[times.size() * 99 / 100], times.back(), scrapes);
  std::printf("update per step: %.1f us without statistics, %.1f us with\n", plain_us, stats_us);
  return 0;
}
