// f64 central-difference checks of every CPU kernel's backward, with two threads so the
// parallel split is exercised. Each loss is sum(out * r) for a fixed random r.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/adamw.h"
#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/embedding.h"
#include "core/ops/gemm.h"
#include "core/ops/gradcheck_testutil.h"
#include "core/ops/matmul.h"
#include "core/ops/rmsnorm.h"
#include "core/ops/rope.h"
#include "core/ops/swiglu.h"
#include "core/ops/vocab_parallel.h"
#include "gtest/gtest.h"

namespace satdar::core::cpu {
namespace {

using testing::Dot;
using testing::GradError;
using testing::RandomVector;
using Vec = std::vector<double>;

constexpr double kTol = 1e-7;

class OpsGradcheck : public ::testing::Test {
 protected:
  void SetUp() override { InitBlas(); }
  ThreadPool pool_{2};
};

TEST_F(OpsGradcheck, Matmul) {
  const int m = 7, n = 5, k = 6;
  Vec x = RandomVector(m * k, 1), w = RandomVector(n * k, 2), r = RandomVector(m * n, 3);
  Vec out(m * n);
  auto loss = [&] {
    MatmulForward(out.data(), x.data(), w.data(), m, n, k, &pool_);
    return Dot(out, r);
  };
  Vec dx(m * k, 0.0), dw(n * k, 0.0);
  MatmulBackward(dx.data(), dw.data(), r.data(), x.data(), w.data(), m, n, k, &pool_);
  EXPECT_LT(GradError(&x, dx, loss), kTol);
  EXPECT_LT(GradError(&w, dw, loss), kTol);
}

TEST_F(OpsGradcheck, MatmulAccumulates) {
  const int m = 3, n = 2, k = 4;
  Vec x = RandomVector(m * k, 1), w = RandomVector(n * k, 2), r = RandomVector(m * n, 3);
  Vec dx1(m * k, 0.0), dw1(n * k, 0.0), dx2(m * k, 0.0), dw2(n * k, 0.0);
  MatmulBackward(dx1.data(), dw1.data(), r.data(), x.data(), w.data(), m, n, k, &pool_);
  MatmulBackward(dx2.data(), dw2.data(), r.data(), x.data(), w.data(), m, n, k, &pool_);
  MatmulBackward(dx2.data(), dw2.data(), r.data(), x.data(), w.data(), m, n, k, &pool_);
  for (int i = 0; i < m * k; ++i) EXPECT_NEAR(dx2[i], 2 * dx1[i], 1e-12);
  for (int i = 0; i < n * k; ++i) EXPECT_NEAR(dw2[i], 2 * dw1[i], 1e-12);
}

TEST_F(OpsGradcheck, RmsNorm) {
  const int n = 9, c = 8;
  Vec x = RandomVector(n * c, 4), g = RandomVector(c, 5, 0.3, 1.0), r = RandomVector(n * c, 6);
  Vec out(n * c), rstd(n);
  auto loss = [&] {
    RmsNormForward(out.data(), rstd.data(), x.data(), g.data(), n, c, 1e-6, &pool_);
    return Dot(out, r);
  };
  loss();
  Vec dx(n * c, 0.0), dg(c, 0.0);
  RmsNormBackward(dx.data(), dg.data(), r.data(), x.data(), g.data(), rstd.data(), n, c, &pool_);
  EXPECT_LT(GradError(&x, dx, loss), kTol);
  EXPECT_LT(GradError(&g, dg, loss), kTol);
}

TEST_F(OpsGradcheck, RmsNormMatchesDefinition) {
  const int c = 4;
  Vec x = {1, -2, 3, -4}, g = {1, 2, 3, 4}, out(c), rstd(1);
  RmsNormForward(out.data(), rstd.data(), x.data(), g.data(), 1, c, 1e-6, &pool_);
  double s = 1.0 / std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  for (int i = 0; i < c; ++i) EXPECT_NEAR(out[i], g[i] * x[i] * s, 1e-15);
}

TEST_F(OpsGradcheck, Rope) {
  const int b = 2, t = 5, nh = 3, hs = 8;
  std::vector<double> cos, sin;
  RopeTables(&cos, &sin, t, hs, 10000.0);
  Vec x = RandomVector(b * t * nh * hs, 7), r = RandomVector(b * t * nh * hs, 8);
  auto loss = [&] {
    Vec y = x;
    RopeForward(y.data(), cos.data(), sin.data(), b, t, nh, hs, &pool_);
    return Dot(y, r);
  };
  Vec dx = r;
  RopeBackward(dx.data(), cos.data(), sin.data(), b, t, nh, hs, &pool_);
  EXPECT_LT(GradError(&x, dx, loss), kTol);
}

TEST_F(OpsGradcheck, RopeHuggingFaceConvention) {
  // Position 1, head size 4: pairs (x0, x2) and (x1, x3) rotate by angles 1 and 1/100.
  std::vector<double> cos, sin;
  RopeTables(&cos, &sin, 2, 4, 10000.0);
  Vec x = {0, 0, 0, 0, 1, 2, 3, 4};  // (T=2, HS=4); position 0 then 1
  RopeForward(x.data(), cos.data(), sin.data(), 1, 2, 1, 4, &pool_);
  double a0 = 1.0, a1 = 0.01;
  EXPECT_NEAR(x[4], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-14);
  EXPECT_NEAR(x[5], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-14);
  EXPECT_NEAR(x[6], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-14);
  EXPECT_NEAR(x[7], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-14);
}

// Checks dq, dk and dv of causal GQA attention at one shape; returns the saved probabilities.
Vec CheckAttentionGrads(int b, int t, int nh, int nkv, int hs, uint64_t seed, ThreadPool* pool) {
  Vec q = RandomVector(b * t * nh * hs, seed), k = RandomVector(b * t * nkv * hs, seed + 1),
      v = RandomVector(b * t * nkv * hs, seed + 2), r = RandomVector(b * t * nh * hs, seed + 3);
  Vec out(b * t * nh * hs), probs(b * nh * t * t);
  auto loss = [&] {
    AttentionForward(out.data(), probs.data(), q.data(), k.data(), v.data(), b, t, nh, nkv, hs,
                     pool);
    return Dot(out, r);
  };
  loss();
  Vec saved = probs;
  Vec dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  AttentionBackward(dq.data(), dk.data(), dv.data(), r.data(), probs.data(), q.data(), k.data(),
                    v.data(), b, t, nh, nkv, hs, pool);
  EXPECT_LT(GradError(&q, dq, loss), kTol);
  EXPECT_LT(GradError(&k, dk, loss), kTol);
  EXPECT_LT(GradError(&v, dv, loss), kTol);
  return saved;
}

TEST_F(OpsGradcheck, AttentionGqa) { CheckAttentionGrads(2, 5, 4, 2, 3, 9, &pool_); }

TEST_F(OpsGradcheck, AttentionAcrossRowBlocks) {
  // T larger than the kernel's 64-row block and not a multiple of it.
  const int t = 70, nh = 2;
  Vec probs = CheckAttentionGrads(1, t, nh, 1, 2, 19, &pool_);
  for (int h = 0; h < nh; ++h) {
    for (int row = 0; row < t; ++row) {
      const double* p = probs.data() + (h * t + row) * t;
      double sum = 0;
      for (int j = 0; j < t; ++j) sum += p[j];
      ASSERT_NEAR(sum, 1.0, 1e-12);
      for (int j = row + 1; j < t; ++j) ASSERT_EQ(p[j], 0.0) << "row " << row << " col " << j;
    }
  }
}

TEST_F(OpsGradcheck, AttentionIsCausal) {
  // Changing the last token's k/v must not change earlier outputs.
  const int b = 1, t = 4, nh = 2, nkv = 1, hs = 2;
  Vec q = RandomVector(t * nh * hs, 1), k = RandomVector(t * nkv * hs, 2),
      v = RandomVector(t * nkv * hs, 3);
  Vec out1(q.size()), out2(q.size()), probs(nh * t * t);
  AttentionForward(out1.data(), probs.data(), q.data(), k.data(), v.data(), b, t, nh, nkv, hs,
                   &pool_);
  for (int i = (t - 1) * hs; i < t * hs; ++i) v[i] += 5.0, k[i] -= 3.0;
  AttentionForward(out2.data(), probs.data(), q.data(), k.data(), v.data(), b, t, nh, nkv, hs,
                   &pool_);
  for (int i = 0; i < (t - 1) * nh * hs; ++i) EXPECT_DOUBLE_EQ(out1[i], out2[i]);
  // The first position attends only to itself: its output equals v[0].
  Vec v0 = RandomVector(t * nkv * hs, 3);
  EXPECT_NEAR(out1[0], v0[0], 1e-14);
  EXPECT_NEAR(out1[1], v0[1], 1e-14);
}

TEST_F(OpsGradcheck, Swiglu) {
  const int n = 5, f = 7;
  Vec gu = RandomVector(n * 2 * f, 13, 2.0), r = RandomVector(n * f, 15);
  Vec out(n * f);
  auto loss = [&] {
    SwigluForward(out.data(), gu.data(), n, f, &pool_);
    return Dot(out, r);
  };
  loss();
  EXPECT_NEAR(out[f + 2], gu[2 * f + 2] / (1 + std::exp(-gu[2 * f + 2])) * gu[3 * f + 2], 1e-15);
  Vec dgu(n * 2 * f);
  SwigluBackward(dgu.data(), r.data(), gu.data(), n, f, &pool_);
  EXPECT_LT(GradError(&gu, dgu, loss), kTol);
}

TEST_F(OpsGradcheck, Embedding) {
  const int n = 11, c = 5, vocab = 4;
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = (i * 7) % vocab;
  Vec table = RandomVector(vocab * c, 16), r = RandomVector(n * c, 17), out(n * c);
  auto loss = [&] {
    EmbeddingForward(out.data(), tokens.data(), table.data(), n, c, &pool_);
    return Dot(out, r);
  };
  Vec dtable(vocab * c, 0.0);
  EmbeddingBackward(dtable.data(), r.data(), tokens.data(), n, c, &pool_);
  EXPECT_LT(GradError(&table, dtable, loss), kTol);
}

TEST_F(OpsGradcheck, CrossEntropy) {
  const int n = 6, v = 7;
  std::vector<int32_t> targets = {0, 6, 3, 3, 1, 5};
  Vec logits = RandomVector(n * v, 18, 3.0), losses(n);
  auto loss = [&] {
    CrossEntropyForward(losses.data(), logits.data(), targets.data(), n, v, &pool_);
    double s = 0;
    for (double l : losses) s += l;
    return s / n;
  };
  Vec dlogits(n * v);
  CrossEntropyBackward(dlogits.data(), logits.data(), targets.data(), 1.0 / n, n, v, &pool_);
  EXPECT_LT(GradError(&logits, dlogits, loss), kTol);
}

TEST_F(OpsGradcheck, CrossEntropyUniformLogits) {
  const int v = 256;
  Vec logits(v, 0.5), losses(1);
  std::vector<int32_t> target = {42};
  CrossEntropyForward(losses.data(), logits.data(), target.data(), 1, v, &pool_);
  EXPECT_NEAR(losses[0], std::log(256.0), 1e-12);
}

TEST_F(OpsGradcheck, VocabSliceEmbedding) {
  // Two slices [0, 3) and [3, 7) of a 7-token vocabulary: the lookups sum to the full lookup,
  // and each slice's table gets the gradient of the tokens that fall in it.
  const int n = 13, c = 5, vocab = 7;
  const int v0[2] = {0, 3}, vl[2] = {3, 4};
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = (i * 5 + 2) % vocab;
  Vec full = RandomVector(vocab * c, 21), r = RandomVector(n * c, 22);
  Vec tables[2] = {Vec(full.begin(), full.begin() + 3 * c), Vec(full.begin() + 3 * c, full.end())};
  auto loss = [&] {
    Vec sum(n * c, 0.0), out(n * c);
    for (int q = 0; q < 2; ++q) {
      VocabSliceEmbeddingForward(out.data(), tokens.data(), tables[q].data(), v0[q], vl[q], n, c,
                                 &pool_);
      for (int i = 0; i < n * c; ++i) sum[i] += out[i];
    }
    return Dot(sum, r);
  };
  Vec whole(n * c), sum(n * c, 0.0), out(n * c);
  EmbeddingForward(whole.data(), tokens.data(), full.data(), n, c, &pool_);
  for (int q = 0; q < 2; ++q) {
    VocabSliceEmbeddingForward(out.data(), tokens.data(), tables[q].data(), v0[q], vl[q], n, c,
                               &pool_);
    for (int i = 0; i < n * c; ++i) sum[i] += out[i];
  }
  for (int i = 0; i < n * c; ++i) EXPECT_EQ(sum[i], whole[i]);
  for (int q = 0; q < 2; ++q) {
    Vec dtable(vl[q] * c, 0.0);
    VocabSliceEmbeddingBackward(dtable.data(), r.data(), tokens.data(), v0[q], vl[q], n, c,
                                &pool_);
    EXPECT_LT(GradError(&tables[q], dtable, loss), kTol) << "slice " << q;
  }
}

// The vocabulary-parallel cross-entropy over three slices of a padded vocabulary (true size 10,
// padded to 12; the last slice holds 2 true and 2 padded columns), with the TP reductions done
// here: the losses equal the full cross-entropy of the 10 true columns, and the slices'
// gradients are its gradient (0 on the padded columns).
TEST_F(OpsGradcheck, VocabParallelCrossEntropy) {
  const int n = 6, vocab = 10, q_count = 3, vl = 4;
  std::vector<int32_t> targets = {0, 9, 3, 4, 8, 7};
  Vec logits = RandomVector(n * vocab, 23, 3.0);  // the true columns, (N, vocab)
  const double pad_value = 5.0;                   // overwritten by MaskPaddedVocab
  auto slice = [&](int q) {
    Vec local(n * vl, pad_value);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < vl && q * vl + j < vocab; ++j) {
        local[i * vl + j] = logits[i * vocab + q * vl + j];
      }
    }
    MaskPaddedVocab(local.data(), n, vl, std::min(vl, vocab - q * vl), &pool_);
    return local;
  };
  Vec losses(n), lse(n);
  auto forward = [&] {
    Vec local[q_count], row_max(n, -std::numeric_limits<double>::infinity()), sum(n, 0.0),
        target(n, 0.0), m(n), s(n), t(n);
    for (int q = 0; q < q_count; ++q) {
      local[q] = slice(q);
      VocabParallelRowMax(m.data(), local[q].data(), n, vl, &pool_);
      for (int i = 0; i < n; ++i) row_max[i] = std::max(row_max[i], m[i]);
    }
    for (int q = 0; q < q_count; ++q) {
      VocabParallelSumExp(s.data(), t.data(), local[q].data(), row_max.data(), targets.data(),
                          q * vl, n, vl, &pool_);
      for (int i = 0; i < n; ++i) sum[i] += s[i], target[i] += t[i];
    }
    VocabParallelLoss(losses.data(), lse.data(), row_max.data(), sum.data(), target.data(), n,
                      &pool_);
    double total = 0;
    for (double l : losses) total += l;
    return total / n;
  };
  forward();
  Vec want(n);
  CrossEntropyForward(want.data(), logits.data(), targets.data(), n, vocab, &pool_);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(losses[i], want[i], 1e-12);
  // Each slice's gradient, in place on its logits, assembled into (N, vocab).
  Vec dlogits(n * vocab);
  for (int q = 0; q < q_count; ++q) {
    Vec local = slice(q);
    VocabParallelCrossEntropyBackward(local.data(), local.data(), lse.data(), targets.data(),
                                      1.0 / n, q * vl, n, vl, &pool_);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < vl; ++j) {
        if (q * vl + j < vocab) {
          dlogits[i * vocab + q * vl + j] = local[i * vl + j];
        } else {
          EXPECT_EQ(local[i * vl + j], 0.0) << "padded column " << q * vl + j;
        }
      }
    }
  }
  Vec want_d(n * vocab);
  CrossEntropyBackward(want_d.data(), logits.data(), targets.data(), 1.0 / n, n, vocab, &pool_);
  for (int i = 0; i < n * vocab; ++i) EXPECT_NEAR(dlogits[i], want_d[i], 1e-12);
  EXPECT_LT(GradError(&logits, dlogits, forward), kTol);
}

TEST_F(OpsGradcheck, AdamWMatchesClosedForm) {
  Vec p = {1.0, -2.0}, g = {0.5, -0.25}, m = {0, 0}, v = {0, 0};
  AdamWParams hp;
  hp.lr = 0.1;
  hp.beta1 = 0.9;
  hp.beta2 = 0.95;
  hp.eps = 1e-8;
  hp.weight_decay = 0.1;
  hp.step = 1;
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), 2, hp, &pool_);
  // Step 1: mhat = g, vhat = g^2, so the update is lr * (sign(g) + wd * p).
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.1 * 1.0), 1e-12);
  EXPECT_NEAR(p[1], -2.0 - 0.1 * (-0.25 / (0.25 + 1e-8) + 0.1 * -2.0), 1e-12);
  EXPECT_NEAR(m[0], 0.05, 1e-15);
  EXPECT_NEAR(v[1], 0.05 * 0.0625, 1e-15);
}

}  // namespace
}  // namespace satdar::core::cpu
