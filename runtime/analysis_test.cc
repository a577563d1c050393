// satdar analyze (runtime/analysis.h) on small models with known answers, in f64:
//   - rescue on DAR models built so that one stream is never read (every mix weight on the
//     other stream, its retrieval query 0, no transport between the streams): restoring the
//     unread stream recovers nothing (gain 0), restoring both recovers everything (1),
//     neither nothing (0), and the read stream a real share; the mirror image swaps them;
//   - CKA: every stream's self-similarity is 1 on the diagonal, the streams' shared embedding
//     is depth 0 of both (CKA 1), the matrices equal CkaMatrix over the returned states, and
//     the summaries are their means; the .npy file holds the states;
//   - the refusals, with their codes.
#include "runtime/analysis.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/safetensors.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "runtime/cka.h"

namespace satdar::runtime {
namespace {

using core::testing::TestTmpDir;

model::ModelConfig Config(const std::string& extra) {
  auto c = model::ParseModelConfig(
      R"({"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 4,
          "max_position_embeddings": 64, "num_attention_heads": 2, "num_key_value_heads": 1, )" +
          extra + "}",
      "analysis_test");
  SATDAR_CHECK(c.ok()) << c.status();
  return *c;
}

// The model's initial weights (noised, so the branches are not at their init), then edited:
// with `read` = 0 or 1, every DAR sublayer and the final readout mix only stream `read` and
// retrieve from it uniformly (query 0), and the transport keeps the streams apart (rho = 1).
std::string WriteWeights(const model::ModelConfig& c, int read, const std::string& name) {
  core::ThreadPool pool(1);
  auto model = model::CreateModel<double>(c, &pool);
  SATDAR_CHECK(model.ok());
  const model::ParamTable& t = (*model)->params();
  std::vector<double> p(t.size());
  t.Initialize(p.data(), 11);
  uint64_t state = 5;
  for (double& v : p) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v += 0.2 * (static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5);
  }
  std::vector<core::TensorRef> refs;
  for (const auto& spec : t.specs()) {
    double* v = p.data() + spec.offset;
    const auto ends_with = [&](const std::string& suffix) {
      return spec.name.size() > suffix.size() &&
             spec.name.compare(spec.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (read >= 0 && spec.name.find("_dar") != std::string::npos) {
      if (ends_with(".mix")) {
        v[read] = 40;
        v[1 - read] = -40;
      }
      if (ends_with(".query")) {
        for (int64_t k = 0; k < c.hidden_size; ++k) v[read * c.hidden_size + k] = 0;
      }
      if (ends_with(".transport")) v[0] = 60;
    }
    refs.push_back({spec.name, core::DType::kF64, spec.shape, v});
  }
  const std::string path = TestTmpDir("analysis") + "/" + name;
  SATDAR_CHECK(core::WriteSafetensors(path, refs, {}).ok());
  return path;
}

AnalysisOptions Options(const model::ModelConfig& c, const std::string& weights) {
  AnalysisOptions o;
  o.eval.config = c;
  o.eval.weights = weights;
  o.eval.synthetic_data = true;
  o.eval.batch_size = 3;
  o.eval.seq_len = 12;
  o.eval.batches = 2;
  o.eval.threads = 2;
  o.eval.f64 = true;
  return o;
}

TEST(Rescue, AStreamNothingReadsRecoversNothing) {
  for (int read : {0, 1}) {
    for (Corruption corruption : {Corruption::kSwap, Corruption::kRandom}) {
      const model::ModelConfig c = Config(R"("residual": "dar")");
      AnalysisOptions o = Options(c, WriteWeights(c, read, "read" + std::to_string(read)));
      o.corruption = corruption;
      // Every position scored with the swap, the positions after the span with random tokens.
      o.scored = corruption == Corruption::kSwap ? Scored::kAll : Scored::kAfterSpan;
      auto r = AnalyzeRescue(o);
      ASSERT_TRUE(r.ok()) << r.status();
      const std::string used = read == 0 ? "s0" : "s1", unused = read == 0 ? "s1" : "s0";
      ASSERT_EQ((*r)["depths"].size(), 3u);  // after layers 1, 2, 3
      for (const auto& d : (*r)["depths"]) {
        SCOPED_TRACE(d.dump());
        const auto& g = d["gain"];
        EXPECT_NEAR(g["neither"].get<double>(), 0.0, 1e-12);
        EXPECT_NEAR(g["both"].get<double>(), 1.0, 1e-9);
        EXPECT_NEAR(g[unused].get<double>(), 0.0, 1e-9);
        EXPECT_GT(std::fabs(g[used].get<double>()), 1e-3);
        EXPECT_NEAR(d["loss"]["neither"].get<double>(), (*r)["corrupted_loss"].get<double>(),
                    1e-12);
        EXPECT_NEAR(d["loss"]["both"].get<double>(), (*r)["clean_loss"].get<double>(), 1e-12);
      }
      EXPECT_EQ((*r)["corrupted_positions"], 6);
      EXPECT_EQ((*r)["scored_positions"], corruption == Corruption::kSwap ? 12 : 6);
      EXPECT_EQ((*r)["scored"], Name(o.scored));
      EXPECT_EQ((*r)["corruption"], Name(corruption));
      // The mean over depths of |gain(s0) - gain(s1)|, here |gain(used)|.
      double asymmetry = 0;
      for (const auto& d : (*r)["depths"]) asymmetry += std::fabs(d["gain"][used].get<double>());
      EXPECT_NEAR((*r)["summary"]["asymmetry"].get<double>(), asymmetry / 3, 1e-9);
    }
  }
}

// Gains of an ordinary DAR model: restoring both streams is the clean run at every depth, and
// the layers asked for are the ones reported.
TEST(Rescue, LayersAndEndpoints) {
  const model::ModelConfig c = Config(R"("residual": "dar", "block_size": 4)");
  AnalysisOptions o = Options(c, WriteWeights(c, -1, "plain"));
  o.layers = {2};
  auto r = AnalyzeRescue(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)["depths"].size(), 1u);
  EXPECT_EQ((*r)["depths"][0]["layer"], 2);
  EXPECT_NEAR((*r)["depths"][0]["gain"]["both"].get<double>(), 1.0, 1e-9);
  EXPECT_EQ((*r)["streams"], 2);
  EXPECT_EQ((*r)["design"], "dar");
}

TEST(Rescue, Refusals) {
  const model::ModelConfig dar = Config(R"("residual": "dar")");
  const std::string w = WriteWeights(dar, -1, "refusals");
  AnalysisOptions o = Options(dar, w);
  o.layers = {4};  // L = 4: the boundaries are after layers 1..3
  EXPECT_EQ(AnalyzeRescue(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.layers = {0};
  EXPECT_EQ(AnalyzeRescue(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(dar, w);
  o.corrupt_fraction = 1.0;
  EXPECT_EQ(AnalyzeRescue(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(dar, w);
  o.eval.batch_size = 1;
  EXPECT_EQ(AnalyzeRescue(o).status().code(), absl::StatusCode::kInvalidArgument);
  // One residual stream: nothing to compare.
  const model::ModelConfig plain = Config(R"("residual": "attnres")");
  o = Options(plain, WriteWeights(plain, -1, "attnres"));
  const absl::Status s = AnalyzeRescue(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("one residual stream"), std::string::npos) << s;
  EXPECT_EQ(AnalyzeCka(o, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  // Weights that are missing.
  o = Options(dar, TestTmpDir("analysis") + "/missing.safetensors");
  EXPECT_FALSE(AnalyzeRescue(o).ok());
}

TEST(Cka, MatricesOfTheReturnedStates) {
  for (const char* extra : {R"("residual": "dar")", R"("residual": "mhc", "hc_streams": 2)",
                            R"("residual": "hc", "hc_streams": 3)"}) {
    SCOPED_TRACE(extra);
    const model::ModelConfig c = Config(extra);
    AnalysisOptions o = Options(c, WriteWeights(c, -1, "cka"));
    CkaStates states;
    auto r = AnalyzeCka(o, &states);
    ASSERT_TRUE(r.ok()) << r.status();
    const int streams = (*r)["streams"].get<int>();
    const int depths = static_cast<int>((*r)["depths"].size());
    EXPECT_EQ(depths, 5);  // the embedding and after each of 4 layers (DAR full: blocks of 1)
    EXPECT_EQ(states.n, 2 * 3 * 12);
    EXPECT_EQ(states.d, 16);
    ASSERT_EQ(static_cast<int>(states.states.size()), streams * depths);
    std::vector<std::vector<const double*>> by(streams);
    for (const auto& s : states.states) by[s.stream].push_back(s.values.data());
    double unpaired = 0;
    int unpaired_n = 0;
    for (int a = 0; a < streams; ++a) {
      for (int b = a; b < streams; ++b) {
        const auto& m = (*r)["matrices"][absl::StrCat("s", a, "-s", b)];
        ASSERT_EQ(static_cast<int>(m.size()), depths);
        const std::vector<double> want = CkaMatrix(by[a], by[b], states.n, states.d);
        for (int i = 0; i < depths; ++i) {
          for (int j = 0; j < depths; ++j) {
            EXPECT_NEAR(m[i][j].get<double>(), want[i * depths + j], 1e-12);
            if (a == b && i == j) {
              EXPECT_NEAR(m[i][j].get<double>(), 1.0, 1e-12);
            }
            if (a != b && i > 0 && j > 0 && i != j) {
              unpaired += m[i][j].get<double>();
              ++unpaired_n;
            }
          }
        }
        // Every stream starts from the embedding.
        EXPECT_NEAR(m[0][0].get<double>(), 1.0, 1e-12);
      }
    }
    EXPECT_NEAR((*r)["summary"]["mean_unpaired_cross"].get<double>(), unpaired / unpaired_n,
                1e-12);
    // The .npy file: a header naming the shape, then the states in order.
    const std::string npy = TestTmpDir("analysis") + "/states.npy";
    ASSERT_TRUE(WriteStatesNpy(npy, states).ok());
    auto bytes = core::ReadFileToString(npy, size_t{1} << 30);
    ASSERT_TRUE(bytes.ok());
    ASSERT_EQ(bytes->compare(0, 6, "\x93NUMPY"), 0);
    const size_t header = static_cast<unsigned char>((*bytes)[8]) |
                          static_cast<size_t>(static_cast<unsigned char>((*bytes)[9])) << 8;
    EXPECT_EQ((10 + header) % 64, 0u);
    EXPECT_NE(bytes->find(absl::StrCat("'shape': (", streams * depths, ", ", states.n, ", 16)")),
              std::string::npos);
    const size_t values = static_cast<size_t>(streams) * depths * states.n * 16;
    ASSERT_EQ(bytes->size(), 10 + header + values * sizeof(double));
    double last;
    std::memcpy(&last, bytes->data() + bytes->size() - sizeof(double), sizeof(double));
    EXPECT_EQ(last, states.states.back().values.back());
  }
}

}  // namespace
}  // namespace satdar::runtime
