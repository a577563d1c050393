// Incremental decoding with the KV cache (Model::BeginDecode / DecodeStep) for every design of
// model/registry_designs_testutil.h, in f64 on a tiny model with random (not initial) weights: a
// prefill of P = 5 positions, then 6 greedy steps of one position, then one step of 2.
// At every step the cached logits equal those of a fresh full pass over the whole prefix
// (BeginDecode + one DecodeStep(all_rows) at past 0, whose attention is the training
// forward's bit for bit) to 1e-10, and their argmax is Forward's Predictions(); every row of
// the full pass equals the position's row from the incremental steps; a batch of 2 equal-length
// prompts gives each prompt's B = 1 result. Also: the error codes, refusal on shards, and
// SATFormer's gate ablation during decoding.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/ops/gemm.h"
#include "core/ops/gradcheck_testutil.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "model/registry_designs_testutil.h"

namespace satdar::model {
namespace {

using core::testing::RandomVector;

using testing::Design;

constexpr int kVocab = 11;

using testing::TinyConfig;

// A model of `json` and its noised parameters.
struct Fixture {
  std::unique_ptr<Model<double>> model;
  std::vector<double> params;
};

void Build(const std::string& json, core::ThreadPool* pool, Fixture* f) {
  core::cpu::InitBlas();
  auto config = ParseModelConfig(TinyConfig(json), "decode_test");
  ASSERT_TRUE(config.ok()) << config.status();
  auto model = CreateModel<double>(*config, pool);
  ASSERT_TRUE(model.ok()) << model.status();
  f->model = std::move(*model);
  const ParamTable& table = f->model->params();
  f->params.resize(table.size());
  table.Initialize(f->params.data(), 3);
  // Off the initial values, so no path is switched off (zero queries, closed gates).
  const std::vector<double> noise = RandomVector(f->params.size(), 99, 0.3);
  for (size_t i = 0; i < f->params.size(); ++i) f->params[i] += noise[i];
}

// The first maximum (the lowest id on ties), as Predictions.
int32_t Argmax(const double* row) {
  return static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
}

double MaxDiff(const double* a, const double* b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

// The full pass over seqs (B equal-length sequences): logits (B, len, vocab) from a fresh
// cache at past 0, and Forward's argmax at each position (with a dummy last target).
void FullPass(Model<double>* m, const std::vector<double>& params,
              const std::vector<std::vector<int32_t>>& seqs, std::vector<double>* logits,
              std::vector<int32_t>* argmax) {
  const int b = static_cast<int>(seqs.size()), len = static_cast<int>(seqs[0].size());
  std::vector<int32_t> flat, with_target;
  for (const auto& s : seqs) {
    flat.insert(flat.end(), s.begin(), s.end());
    with_target.insert(with_target.end(), s.begin(), s.end());
    with_target.push_back(0);
  }
  ASSERT_TRUE(m->BeginDecode(b, len).ok());
  ASSERT_TRUE(m->DecodeStep(params.data(), flat.data(), b, len, /*all_rows=*/true, logits).ok());
  ASSERT_EQ(logits->size(), static_cast<size_t>(b) * len * kVocab);
  ASSERT_TRUE(m->Forward(params.data(), with_target.data(), b, len).ok());
  m->Predictions(argmax);
  ASSERT_EQ(argmax->size(), static_cast<size_t>(b) * len);
}

// Decodes the prompts (B x P) incrementally: the prefill with all rows, 6 greedy steps, one
// step of 2 tokens. Returns every position's logits (B, P + 8, vocab) and the sequences.
void Incremental(Model<double>* m, const std::vector<double>& params,
                 std::vector<std::vector<int32_t>>* seqs, std::vector<double>* rows,
                 Model<double>* ref) {
  const int b = static_cast<int>(seqs->size()), p = static_cast<int>((*seqs)[0].size());
  const int steps = 6, last_tn = 2, cap = p + steps + last_tn;
  ASSERT_TRUE(m->BeginDecode(b, cap).ok());
  std::vector<std::vector<double>> per_seq(b);  // (len, vocab) each
  auto take = [&](const std::vector<double>& logits, int tn) {
    for (int bi = 0; bi < b; ++bi) {
      per_seq[bi].insert(per_seq[bi].end(), logits.begin() + bi * tn * kVocab,
                         logits.begin() + (bi + 1) * tn * kVocab);
    }
  };
  // Checks the cached logits of each sequence's last position against a fresh full pass.
  auto check = [&](const std::vector<double>& last) {
    std::vector<double> full;
    std::vector<int32_t> argmax;
    FullPass(ref, params, *seqs, &full, &argmax);
    const int len = static_cast<int>((*seqs)[0].size());
    for (int bi = 0; bi < b; ++bi) {
      const double* want = full.data() + (static_cast<size_t>(bi) * len + len - 1) * kVocab;
      EXPECT_LT(MaxDiff(last.data() + bi * kVocab, want, kVocab), 1e-10)
          << "sequence " << bi << " at length " << len;
      EXPECT_EQ(Argmax(last.data() + bi * kVocab), argmax[bi * len + len - 1])
          << "sequence " << bi << " at length " << len;
      // Every row of the full pass: its argmax is Forward's prediction.
      for (int r = 0; r < len; ++r) {
        EXPECT_EQ(Argmax(full.data() + (static_cast<size_t>(bi) * len + r) * kVocab),
                  argmax[bi * len + r]);
      }
    }
  };

  std::vector<int32_t> flat;
  for (const auto& s : *seqs) flat.insert(flat.end(), s.begin(), s.end());
  std::vector<double> logits;
  ASSERT_TRUE(m->DecodeStep(params.data(), flat.data(), b, p, /*all_rows=*/true, &logits).ok());
  ASSERT_EQ(logits.size(), static_cast<size_t>(b) * p * kVocab);
  take(logits, p);
  std::vector<double> last(static_cast<size_t>(b) * kVocab);
  for (int bi = 0; bi < b; ++bi) {
    std::copy_n(logits.begin() + (static_cast<size_t>(bi) * p + p - 1) * kVocab, kVocab,
                last.begin() + bi * kVocab);
  }
  check(last);
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> next(b);
    for (int bi = 0; bi < b; ++bi) {
      next[bi] = Argmax(last.data() + bi * kVocab);
      (*seqs)[bi].push_back(next[bi]);
    }
    ASSERT_TRUE(m->DecodeStep(params.data(), next.data(), b, 1, /*all_rows=*/false, &last).ok());
    ASSERT_EQ(last.size(), static_cast<size_t>(b) * kVocab);
    take(last, 1);
    check(last);
  }
  // Two positions at once after a filled cache, last rows only.
  std::vector<int32_t> two;
  for (int bi = 0; bi < b; ++bi) {
    for (int j = 0; j < last_tn; ++j) {
      two.push_back(((*seqs)[bi].back() * 5 + j * 3 + 1) % kVocab);
      (*seqs)[bi].push_back(two.back());
    }
  }
  ASSERT_TRUE(m->DecodeStep(params.data(), two.data(), b, last_tn, /*all_rows=*/false, &last).ok());
  check(last);
  rows->clear();
  for (int bi = 0; bi < b; ++bi) rows->insert(rows->end(), per_seq[bi].begin(), per_seq[bi].end());
}

class DesignDecode : public ::testing::TestWithParam<Design> {};

TEST_P(DesignDecode, CachedStepsMatchFullPasses) {
  core::ThreadPool pool(2);
  Fixture f, ref;
  Build(GetParam().json, &pool, &f);
  Build(GetParam().json, &pool, &ref);
  if (HasFatalFailure()) return;
  const int p = 5;
  std::vector<std::vector<int32_t>> seqs(2);
  for (int bi = 0; bi < 2; ++bi) {
    for (int i = 0; i < p; ++i) seqs[bi].push_back((i * 7 + 3 + bi * 4) % kVocab);
  }
  const std::vector<std::vector<int32_t>> prompts = seqs;
  std::vector<double> rows;
  Incremental(f.model.get(), f.params, &seqs, &rows, ref.model.get());
  if (HasFatalFailure()) return;
  const int steps = 6, len = p + steps;  // the rows collected: prefill and greedy steps

  // Every position's row from the incremental steps equals the full pass's row.
  std::vector<std::vector<int32_t>> prefix(2);
  for (int bi = 0; bi < 2; ++bi) prefix[bi].assign(seqs[bi].begin(), seqs[bi].begin() + len);
  std::vector<double> full;
  std::vector<int32_t> argmax;
  FullPass(ref.model.get(), ref.params, prefix, &full, &argmax);
  ASSERT_EQ(rows.size(), full.size());
  EXPECT_LT(MaxDiff(rows.data(), full.data(), full.size()), 1e-10);

  // A batch of two is each prompt alone.
  for (int bi = 0; bi < 2; ++bi) {
    std::vector<std::vector<int32_t>> one = {prompts[bi]};
    std::vector<double> alone;
    Incremental(f.model.get(), f.params, &one, &alone, ref.model.get());
    if (HasFatalFailure()) return;
    EXPECT_EQ(one[0], seqs[bi]);
    ASSERT_EQ(alone.size(), static_cast<size_t>(len) * kVocab);
    EXPECT_LT(MaxDiff(alone.data(), rows.data() + static_cast<size_t>(bi) * len * kVocab,
                      alone.size()),
              1e-10)
        << "prompt " << bi;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Registry, DesignDecode,
    ::testing::ValuesIn(testing::RegistryDesigns()),
    [](const ::testing::TestParamInfo<Design>& info) { return info.param.name; });

TEST(Decode, ErrorCodes) {
  core::ThreadPool pool(2);
  Fixture f;
  Build("", &pool, &f);
  if (HasFatalFailure()) return;
  Model<double>* m = f.model.get();
  const double* w = f.params.data();
  std::vector<double> logits;
  const int32_t ids[6] = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(m->DecodeStep(w, ids, 1, 1, false, &logits).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m->BeginDecode(1, 65).code(), absl::StatusCode::kInvalidArgument);  // > max positions
  EXPECT_EQ(m->BeginDecode(0, 4).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->BeginDecode(1, 4).ok());
  EXPECT_EQ(m->DecodeStep(w, ids, 1, 5, false, &logits).code(), absl::StatusCode::kOutOfRange);
  const int32_t bad[2] = {1, kVocab};
  EXPECT_EQ(m->DecodeStep(w, bad, 1, 2, false, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  const int32_t negative[1] = {-1};
  EXPECT_EQ(m->DecodeStep(w, negative, 1, 1, false, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->DecodeStep(w, ids, 2, 1, false, &logits).code(),
            absl::StatusCode::kInvalidArgument);  // not BeginDecode's batch
  EXPECT_EQ(m->DecodeStep(w, ids, 1, 0, false, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  // The failed steps cached nothing: 4 positions still fit, a 5th does not.
  ASSERT_TRUE(m->DecodeStep(w, ids, 1, 3, false, &logits).ok());
  EXPECT_EQ(logits.size(), static_cast<size_t>(kVocab));
  ASSERT_TRUE(m->DecodeStep(w, ids + 3, 1, 1, true, &logits).ok());
  EXPECT_EQ(m->DecodeStep(w, ids + 4, 1, 1, false, &logits).code(),
            absl::StatusCode::kOutOfRange);
  // No backward after a decode step; training passes still work between steps.
  std::vector<double> grads(f.params.size());
  EXPECT_EQ(m->Backward(w, grads.data(), 1.0).code(), absl::StatusCode::kFailedPrecondition);
  const int32_t tokens[4] = {1, 2, 3, 4};
  ASSERT_TRUE(m->Forward(w, tokens, 1, 3).ok());
  EXPECT_TRUE(m->Backward(w, grads.data(), 1.0).ok());
  // BeginDecode starts over.
  ASSERT_TRUE(m->BeginDecode(1, 4).ok());
  EXPECT_TRUE(m->DecodeStep(w, ids, 1, 4, false, &logits).ok());
}

TEST(Decode, RefusesShards) {
  core::ThreadPool pool(1);
  auto config = ParseModelConfig(TinyConfig(""), "decode_test");
  ASSERT_TRUE(config.ok()) << config.status();
  config->num_key_value_heads = 2;  // divisible by tp
  for (int what = 0; what < 2; ++what) {
    Sharding shard;
    if (what == 0) {
      shard.tp_size = 2;  // no collective runs: BeginDecode refuses first
    } else {
      shard.pp_size = 3;
    }
    auto model = CreateModel<double>(*config, shard, &pool);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->BeginDecode(1, 4).code(), absl::StatusCode::kFailedPrecondition) << what;
  }
}

TEST(Decode, SatformerGateAblation) {
  core::ThreadPool pool(2);
  Fixture f, ref;
  Build(R"("value_residual": "satformer")", &pool, &f);
  Build(R"("value_residual": "satformer")", &pool, &ref);
  if (HasFatalFailure()) return;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2};
  // The logits of the last position: by steps of one after a prefill of 4, and in one pass.
  auto stepped = [&](Model<double>* m, const std::vector<double>& params) {
    std::vector<double> logits;
    EXPECT_TRUE(m->BeginDecode(1, static_cast<int>(prompt.size())).ok());
    EXPECT_TRUE(m->DecodeStep(params.data(), prompt.data(), 1, 4, false, &logits).ok());
    for (size_t i = 4; i < prompt.size(); ++i) {
      EXPECT_TRUE(m->DecodeStep(params.data(), &prompt[i], 1, 1, false, &logits).ok());
    }
    return logits;
  };
  auto whole = [&](Model<double>* m, const std::vector<double>& params) {
    std::vector<double> logits;
    const int n = static_cast<int>(prompt.size());
    EXPECT_TRUE(m->BeginDecode(1, n).ok());
    EXPECT_TRUE(m->DecodeStep(params.data(), prompt.data(), 1, n, false, &logits).ok());
    return logits;
  };
  const std::vector<double> open = stepped(f.model.get(), f.params);
  ASSERT_TRUE(f.model->SetGateAblation(GateAblation::kZero));
  ASSERT_TRUE(ref.model->SetGateAblation(GateAblation::kZero));
  const std::vector<double> closed = stepped(f.model.get(), f.params);
  const std::vector<double> closed_full = whole(ref.model.get(), ref.params);
  ASSERT_EQ(closed.size(), static_cast<size_t>(kVocab));
  ASSERT_EQ(closed_full.size(), static_cast<size_t>(kVocab));
  EXPECT_LT(MaxDiff(closed.data(), closed_full.data(), kVocab), 1e-10);
  EXPECT_GT(MaxDiff(closed.data(), open.data(), kVocab), 1e-6);  // the ablation applies
  // Forward with the ablation predicts the same.
  std::vector<int32_t> with_target = prompt;
  with_target.push_back(0);
  ASSERT_TRUE(ref.model->Forward(ref.params.data(), with_target.data(), 1,
                                 static_cast<int>(prompt.size()))
                  .ok());
  std::vector<int32_t> argmax;
  ref.model->Predictions(&argmax);
  EXPECT_EQ(argmax.back(), Argmax(closed.data()));
}

}  // namespace
}  // namespace satdar::model
