#include "runtime/mfu.h"

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/model.h"
#include "runtime/train_observer.h"

namespace satdar::runtime {
namespace {

TEST(Mfu, FlopsPerTokenCountsMatmulsAndAttention) {
  model::ModelConfig c;
  c.num_hidden_layers = 2;
  c.hidden_size = 8;
  EXPECT_DOUBLE_EQ(model::FlopsPerToken(1000, c, 16), 6.0 * 1000 + 6.0 * 2 * 16 * 8);
  // MoE: only top_k of the routed experts run per token (2 layers x 6 idle experts x 3 x 4 x 8).
  model::MoeConfig m;
  m.num_experts = 8;
  m.top_k = 2;
  m.expert_intermediate_size = 4;
  c.moe = m;
  EXPECT_DOUBLE_EQ(model::FlopsPerToken(10000, c, 16), 6.0 * (10000 - 2 * 6 * 3 * 4 * 8) + 6.0 * 2 * 16 * 8);
  // DAR reads history entries: 12 FLOPs per entry and channel on top.
  c.moe.reset();
  c.residual = model::Residual::kDar;
  EXPECT_DOUBLE_EQ(model::FlopsPerToken(1000, c, 16),
                   6.0 * 1000 + 6.0 * 2 * 16 * 8 + 12.0 * model::DepthRetrievalReads(c) * 8);
  EXPECT_GT(model::DepthRetrievalReads(c), 0);
}

// What the models themselves report: one depth-weight vector per retrieval (and stream), each
// as long as the history it reads. The count in FlopsPerToken must be their total length.
int64_t ReadsFromStats(const std::string& path) {
  auto config = model::LoadModelConfig(path);
  EXPECT_TRUE(config.ok()) << config.status();
  core::ThreadPool pool(1);
  auto m = model::CreateModel<float>(*config, &pool);
  EXPECT_TRUE(m.ok()) << m.status();
  std::vector<float> params((*m)->params().size());
  (*m)->params().Initialize(params.data(), 1);
  const int b = 1, t = 8;
  std::vector<int32_t> tokens(b * (t + 1), 3);
  EXPECT_TRUE((*m)->Forward(params.data(), tokens.data(), b, t).ok());
  nlohmann::json stats = nlohmann::json::object();
  (*m)->AppendStats(&stats);
  int64_t reads = 0;
  auto count = [&](const nlohmann::json& j, auto&& self) -> void {
    if (j.is_number()) {
      ++reads;
    } else if (j.is_array()) {
      for (const auto& e : j) self(e, self);
    }
  };
  if (stats.contains("dar_depth_weights")) count(stats["dar_depth_weights"], count);
  if (stats.contains("attnres_depth_weights")) count(stats["attnres_depth_weights"], count);
  EXPECT_GT(reads, 0) << path;
  return reads;
}

TEST(Mfu, DepthRetrievalReadsMatchWhatTheModelsRetrieve) {
  for (const char* path : {"configs/cpu/dar.json", "configs/cpu/attnres.json",
                           "configs/cpu/dar-full.json", "configs/cpu/dar-moe.json"}) {
    auto config = model::LoadModelConfig(path);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(model::DepthRetrievalReads(*config), ReadsFromStats(path)) << path;
  }
  auto plain = model::LoadModelConfig("configs/cpu/transformer.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(model::DepthRetrievalReads(*plain), 0);
}

TEST(Mfu, GpuPeaksByName) {
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA H200"), 989e12);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_DOUBLE_EQ(GpuPeakFlops("Some GPU"), 0);
}

TEST(Mfu, CpuPeakIsAMeasuredPositiveRate) {
  core::ThreadPool pool(1);
  const double peak = MeasureCpuPeakFlops(&pool);
  // A core of this decade does between a GFLOP/s and a few TFLOP/s of f32 GEMM.
  EXPECT_GT(peak, 1e9);
  EXPECT_LT(peak, 1e13);
}

TEST(TrainObserver, PhasesAddUpToTheStep) {
  StepTimes t;
  t.data = 0.01;
  t.forward_backward = 0.5;
  t.fb_comm_wait = 0.1;
  t.fb_pipeline_wait = 0.15;
  t.optimizer = 0.2;
  t.opt_comm_wait = 0.05;
  const nlohmann::json p = PhaseSeconds(t);
  EXPECT_DOUBLE_EQ(p["compute"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(p["optimizer"].get<double>(), 0.15);
  EXPECT_DOUBLE_EQ(p["comm_wait"].get<double>(), 0.15);
  EXPECT_DOUBLE_EQ(p["pipeline_bubble"].get<double>(), 0.15);
  double sum = 0;
  for (const auto& [k, v] : p.items()) sum += v.get<double>();
  EXPECT_DOUBLE_EQ(sum, t.data + t.forward_backward + t.optimizer);
}

TEST(TrainObserver, FormatsDurations) {
  EXPECT_EQ(FormatDuration(45.2), "45s");
  EXPECT_EQ(FormatDuration(192), "3m12s");
  EXPECT_EQ(FormatDuration(3840), "1h04m");
  EXPECT_EQ(FormatDuration(-1), "?");
}

}  // namespace
}  // namespace satdar::runtime
