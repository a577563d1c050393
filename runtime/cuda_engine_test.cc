// `satdar train --device cuda` (the trainer's loop with the CUDA engine) against the CPU engine: the same losses step by step (f32
// compute), a falling loss in bf16, an exact resume from a GPU checkpoint, and a GPU checkpoint
// that resumes on the CPU. Skipped without a GPU (the no-GPU error is checked instead).
#include "runtime/cuda_engine.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/local_communicator.h"
#include "comm/staged_communicator.h"
#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "data/prep.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"

namespace satdar::runtime {
namespace {

using core::testing::TestTmpDir;

// residual "dar-moe": DAR with MoE FFNs (8 experts, top 2, one shared expert).
TrainOptions Options(const std::string& name, std::string residual,
                     const std::string& value_residual) {
  TrainOptions o;
  const size_t moe = residual.find("-moe");
  if (moe != std::string::npos) {
    residual.resize(moe);
    model::MoeConfig m;
    m.num_experts = 8;
    m.top_k = 2;
    m.expert_intermediate_size = 64;
    m.num_shared_experts = 1;
    // Larger than the defaults, so that a lost or double-counted aux or z loss (about 0.1 and
    // 0.04 of a loss near 5.5) exceeds the 1e-2 tolerance below.
    m.router_aux_loss_coef = 0.1;
    m.router_z_loss_coef = 0.01;
    o.config.moe = m;
  }
  o.config.vocab_size = 256;
  o.config.hidden_size = 64;
  o.config.intermediate_size = 128;
  o.config.num_hidden_layers = 4;
  o.config.num_attention_heads = 4;
  o.config.num_key_value_heads = 2;
  SATDAR_CHECK(model::FromName(residual, &o.config.residual) &&
               model::FromName(value_residual, &o.config.value_residual))
      << residual << " " << value_residual;
  if (residual == "dar" || residual == "attnres" || residual == "transparent") {
    o.config.block_size = 4;
  }
  o.steps = 8;
  o.batch_size = 4;
  o.microbatches = 2;
  o.seq_len = 32;
  o.threads = 2;
  o.synthetic_data = true;
  o.quiet = true;
  o.lr = 3e-3;
  o.log_jsonl = TestTmpDir(name) + "/log.jsonl";
  std::remove(o.log_jsonl.c_str());
  return o;
}

// The trainer on the GPU engine.
absl::StatusOr<TrainSummary> TrainGpu(TrainOptions o, GpuOptions g) {
  g.enabled = true;
  o.gpu = g;
  return Train(o);
}

// Two ranks of `two`'s layout as threads sharing one GPU (host communicators in process, the
// device ones staged through host memory, as `--gpu-comm host`); each rank's outcome.
std::vector<absl::Status> TrainTwoRanksOnOneGpu(const TrainOptions& two, const GpuOptions& g) {
  auto host = comm::MakeLocalCommunicators(2), device = comm::MakeLocalCommunicators(2);
  std::vector<std::unique_ptr<comm::Communicator>> staged;
  for (auto& d : device) staged.push_back(comm::StageThroughHost(std::move(d), comm::CudaCopier()));
  std::vector<absl::Status> status(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      TrainOptions o = two;
      o.world = host[r].get();
      GpuOptions gr = g;
      gr.world = staged[r].get();
      gr.world_kind = "host staging";
      status[r] = TrainGpu(o, gr).status();
    });
  }
  for (auto& t : ranks) t.join();
  return status;
}

std::vector<double> Losses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// A prepared dataset (vocab 320) of sentences of 24 words in random order: learnable (the
// words' and pieces' frequencies) in a few steps, unlike uniform synthetic tokens. Prepared
// once per process; "" when that failed.
std::string WordCorpus() {
  static const std::string* dir = [] {
    const std::string corpus = TestTmpDir("eval_corpus");
    const char* words[] = {"the",    "jury",  "said",   "city",  "election",  "law",
                           "new",    "would", "praise", "committee", "charge", "many",
                           "of",     "in",    "was",    "a",     "report",    "court",
                           "judge",  "county", "vote",  "people", "state",    "year"};
    uint32_t x = 12345;
    for (int f = 0; f < 8; ++f) {
      std::string text;
      for (int s = 0; s < 60; ++s) {
        for (int w = 0; w < 12; ++w) {
          x = x * 1664525u + 1013904223u;
          text += std::string(words[(x >> 16) % 24]) + (w == 11 ? ".\n" : " ");
        }
      }
      const std::string file = corpus + "/doc" + std::to_string(f) + ".txt";
      EXPECT_TRUE(core::WriteFileAtomically(file, text).ok());
    }
    data::PrepOptions p;
    p.inputs = {corpus};
    p.out = TestTmpDir("eval_ds") + "/ds";
    p.vocab_size = 320;  // byte fallback needs at least 260 pieces
    p.val_fraction = 0.3;
    p.format = "text";
    p.progress = false;
    const auto prepared = data::Prep(p);
    EXPECT_TRUE(prepared.ok()) << prepared.status();
    if (!prepared.ok()) return new std::string();
    return new std::string(p.out);
  }();
  return *dir;
}

class CudaEngineTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(CudaEngineTest, F32MatchesCpuTrainerAndBf16FollowsIt) {
  SATDAR_SKIP_WITHOUT_GPU();
  const auto& [residual, vr] = GetParam();
  // The GPU router's logits differ from the CPU's in the last bits; with MoE a near-tie may
  // route a token differently late in the run, so the MoE losses get a looser bound.
  TrainOptions cpu = Options("cpu_" + residual + vr, residual, vr);
  ASSERT_TRUE(Train(cpu).ok());
  TrainOptions gpu = Options("gpu_" + residual + vr, residual, vr);
  GpuOptions g;
  g.compute = core::DType::kF32;
  absl::StatusOr<TrainSummary> s = TrainGpu(gpu, g);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<double> want = Losses(cpu.log_jsonl), got = Losses(gpu.log_jsonl);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], (gpu.config.moe ? 1e-2 : 2e-3) * want[i]) << "step " << i + 1;
  }
  EXPECT_GT(s->peak_device_bytes, 0);

  // bf16 (with recompute) on learnable data follows the CPU trainer's f32 run and learns.
  // (Synthetic tokens are uniform: no run gets below ln(vocab), so they cannot tell a
  // learning run from one whose weights never change.)
  const std::string data = WordCorpus();
  ASSERT_FALSE(data.empty());
  auto on_words = [&](const std::string& name) {
    TrainOptions o = Options(name, residual, vr);
    o.steps = 30;
    o.synthetic_data = false;
    o.data_dir = data;
    o.config.vocab_size = 320;
    return o;
  };
  const TrainOptions cpu_words = on_words("cpu_words_" + residual + vr);
  ASSERT_TRUE(Train(cpu_words).ok());
  const TrainOptions bf = on_words("bf16_" + residual + vr);
  GpuOptions gb;
  gb.recompute = true;
  s = TrainGpu(bf, gb);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<double> l = Losses(bf.log_jsonl), ref = Losses(cpu_words.log_jsonl);
  ASSERT_EQ(l.size(), ref.size());
  // Step by step while the trajectories are close (the first 5 steps); then bf16 rounding
  // moves the run off f32's path one loss spike at a time, so the last 10 steps are compared
  // on average.
  const double moe = bf.config.moe ? 2.0 : 1.0;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(l[i], ref[i], moe * 2e-2 * ref[i]) << "bf16 step " << i + 1;
  }
  double tail = 0, ref_tail = 0;
  for (size_t i = ref.size() - 10; i < ref.size(); ++i) {
    tail += l[i] / 10;
    ref_tail += ref[i] / 10;
  }
  EXPECT_NEAR(tail, ref_tail, moe * 5e-2 * ref_tail) << "bf16's mean loss over the last 10 steps";
  EXPECT_LT(ref.back(), ref.front() - 0.5) << "the CPU trainer did not learn the word corpus";
  EXPECT_LT(l.back(), l.front() - 0.5) << "bf16 training did not learn";
}

INSTANTIATE_TEST_SUITE_P(Designs, CudaEngineTest,
                         ::testing::Values(std::make_pair("standard", "none"),
                                           std::make_pair("standard", "satformer"),
                                           std::make_pair("dar", "none"),
                                           std::make_pair("standard", "resformer"),
                                           std::make_pair("attnres", "none"),
                                           std::make_pair("transparent", "none"),
                                           std::make_pair("denseformer", "none"),
                                           std::make_pair("hc", "none"),
                                           std::make_pair("mhc", "satformer"),
                                           std::make_pair("muddformer", "none"),
                                           std::make_pair("dar-moe", "none")));

std::vector<double> ValLosses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) out.push_back(j["val_loss"].get<double>());
  }
  return out;
}

// DAR-MoE with SATFormer on WordCorpus, validated every eval_every steps on 2 batches.
TrainOptions WithEval(const std::string& name, int eval_every) {
  TrainOptions o = Options(name, "dar-moe", "satformer");
  o.config.vocab_size = 320;
  o.synthetic_data = false;
  o.data_dir = WordCorpus();
  o.eval_every = eval_every;
  o.eval_batches = 2;
  return o;
}

// --eval-every on the GPU: the same validation losses as the CPU trainer. With MoE, so that
// counting the router's aux and z losses (0.1 and 0.01 here) into the validation loss fails.
TEST(CudaEngine, ValidationLossMatchesCpuTrainer) {
  SATDAR_SKIP_WITHOUT_GPU();
  ASSERT_FALSE(WordCorpus().empty());
  auto with_eval = [](const std::string& name) { return WithEval(name, /*eval_every=*/4); };
  const TrainOptions cpu = with_eval("eval_cpu");
  ASSERT_TRUE(Train(cpu).ok());
  const TrainOptions gpu = with_eval("eval_gpu");
  GpuOptions g;
  g.compute = core::DType::kF32;
  ASSERT_TRUE(TrainGpu(gpu, g).ok());
  const std::vector<double> want = ValLosses(cpu.log_jsonl), got = ValLosses(gpu.log_jsonl);
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(got.size(), want.size());
  // 1e-2 as for the MoE training losses (a near-tie may route differently); the aux loss
  // alone would add about 2e-2.
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-2 * want[i]) << i;
}

// Pipeline stages on the GPU (two ranks sharing one GPU, staged through host memory, over the
// directed links of parallel/pipeline.h), plain and interleaved: the training losses and the
// validation losses (the batches through the pipeline, the last stage's sum on every rank)
// of one GPU rank. The same kernels on the same micro-batches: equal up to the summation of
// the stages' auxiliary losses (1e-6 relative).
TEST(CudaEngine, PipelineStagesMatchOneRankAndValidateThroughThePipeline) {
  SATDAR_SKIP_WITHOUT_GPU();
  ASSERT_FALSE(WordCorpus().empty());
  GpuOptions g;
  g.compute = core::DType::kF32;
  g.device = 0;
  auto with_eval = [](const std::string& name) {
    TrainOptions o = WithEval(name, /*eval_every=*/2);
    o.steps = 4;
    return o;
  };
  const TrainOptions one = with_eval("pp_one");
  ASSERT_TRUE(TrainGpu(one, g).ok());
  for (int v : {1, 2}) {
    TrainOptions two = with_eval("pp_two_v" + std::to_string(v));
    two.mesh.pp = 2;
    two.virtual_stages = v;
    const std::vector<absl::Status> status = TrainTwoRanksOnOneGpu(two, g);
    ASSERT_TRUE(status[0].ok()) << status[0];
    ASSERT_TRUE(status[1].ok()) << status[1];
    for (const auto& [got, want] :
         {std::pair(Losses(two.log_jsonl), Losses(one.log_jsonl)),
          std::pair(ValLosses(two.log_jsonl), ValLosses(one.log_jsonl))}) {
      ASSERT_EQ(got.size(), want.size());
      ASSERT_FALSE(want.empty());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-6 * want[i]) << "virtual stages " << v << ", " << i;
      }
    }
  }
}

TEST(CudaEngine, ResumeIsExactAndCheckpointsLoadOnCpu) {
  SATDAR_SKIP_WITHOUT_GPU();
  GpuOptions g;
  TrainOptions full = Options("full", "dar", "satformer");
  full.checkpoint_dir = TestTmpDir("full_ckpt");
  ASSERT_TRUE(TrainGpu(full, g).ok());
  // The same 8-step run (the same learning-rate schedule), "crashed" after its step-4
  // checkpoint: the step-8 one is removed, and the run resumes from step 4.
  TrainOptions part = Options("part", "dar", "satformer");
  part.checkpoint_dir = TestTmpDir("part_ckpt");
  part.checkpoint_every = 4;
  ASSERT_TRUE(TrainGpu(part, g).ok());
  ASSERT_EQ(std::remove(CheckpointPath(part.checkpoint_dir, 8).c_str()), 0);
  part.resume = true;
  ASSERT_TRUE(TrainGpu(part, g).ok());
  // Deterministic kernels: the resumed run repeats the uninterrupted one bit for bit.
  EXPECT_EQ(Losses(part.log_jsonl), Losses(full.log_jsonl));
  // The step-4 checkpoint continues on the CPU (f32) close to the GPU's bf16 trajectory.
  ASSERT_EQ(std::remove(CheckpointPath(part.checkpoint_dir, 8).c_str()), 0);
  TrainOptions cpu = Options("cpu_resume", "dar", "satformer");
  cpu.checkpoint_dir = part.checkpoint_dir;
  cpu.checkpoint_every = 4;
  cpu.resume = true;
  ASSERT_TRUE(Train(cpu).ok());
  const std::vector<double> on_cpu = Losses(cpu.log_jsonl), on_gpu = Losses(full.log_jsonl);
  ASSERT_EQ(on_cpu.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(on_cpu[i], on_gpu[4 + i], 3e-2 * on_gpu[4 + i]);
}

// Data parallelism with two ranks on one GPU (gradients staged through host memory, as
// `--gpu-comm host`), with and without ZeRO-1, against one GPU rank with the whole batch: the
// same losses up to the order of the replicas' average (f32: 1e-5 relative). Under ZeRO-1 the
// final checkpoint (moments gathered from the two slices) resumes on the CPU.
TEST(CudaEngine, TwoRanksSharingOneGpuMatchOneRank) {
  SATDAR_SKIP_WITHOUT_GPU();
  GpuOptions g;
  g.compute = core::DType::kF32;
  g.device = 0;
  TrainOptions one = Options("dp_one", "dar", "satformer");
  ASSERT_TRUE(TrainGpu(one, g).ok());
  const std::vector<double> want = Losses(one.log_jsonl);
  for (int zero : {0, 1}) {
    TrainOptions two = Options("dp_two_zero" + std::to_string(zero), "dar", "satformer");
    two.mesh.dp = 2;
    two.zero_stage = zero;
    two.batch_size = one.batch_size / 2;  // per replica: the same global batch
    two.microbatches = 1;
    two.checkpoint_dir = TestTmpDir("dp_two_ckpt" + std::to_string(zero));
    const std::vector<absl::Status> status = TrainTwoRanksOnOneGpu(two, g);
    ASSERT_TRUE(status[0].ok()) << status[0];
    ASSERT_TRUE(status[1].ok()) << status[1];
    const std::vector<double> got = Losses(two.log_jsonl);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << "zero " << zero << " step " << i + 1;
    }
    // The checkpoint holds the whole state: a CPU run continues it.
    TrainOptions cpu = Options("dp_two_cpu" + std::to_string(zero), "dar", "satformer");
    cpu.checkpoint_dir = two.checkpoint_dir;
    cpu.steps = two.steps + 2;
    cpu.resume = true;
    EXPECT_TRUE(Train(cpu).ok());
  }
}

TEST(CudaEngine, RefusesWhatItDoesNotHave) {
  TrainOptions o = Options("refuse", "standard", "none");
  o.f64 = true;  // every layout runs on the GPU; f64 does not
  absl::StatusOr<TrainSummary> s = TrainGpu(o, GpuOptions());
  EXPECT_FALSE(s.ok());
  if (!core::cuda::BuiltWithCuda()) {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  } else {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    EXPECT_EQ(s.status().message(), "device cuda: dtype must be bf16 or f32");
  }
}

}  // namespace
}  // namespace satdar::runtime
