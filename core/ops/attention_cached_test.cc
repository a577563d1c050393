// The KV-cache attention of inference (attention.h AttentionCachedForward) against the training
// forward: with past = 0 and tn = cap = t the same bits; with past = k the rows k.. of a full
// pass over the same keys and values (other GEMM shapes: to rounding). Shapes cover T across the
// 64-row block, MHA, GQA and MQA, a cache with room left (cap > past + tn) and B > 1.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/gemm.h"
#include "core/ops/gradcheck_testutil.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"

namespace satdar::core::cpu {
namespace {

using testing::RandomVector;

struct Shape {
  int b, t, nh, nkv, hs;
};

template <typename T>
std::vector<T> Cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Rows [r0, r0 + rows) of each sequence of x (B, T, width) into (B, rows, width); with
// cap > t also the reverse: (B, T, width) into a zero-padded (B, cap, width).
template <typename T>
std::vector<T> Rows(const std::vector<T>& x, int b, int t, int width, int r0, int rows) {
  std::vector<T> out(static_cast<size_t>(b) * rows * width);
  for (int bi = 0; bi < b; ++bi) {
    std::copy_n(x.begin() + (static_cast<size_t>(bi) * t + r0) * width,
                static_cast<size_t>(rows) * width,
                out.begin() + static_cast<size_t>(bi) * rows * width);
  }
  return out;
}
template <typename T>
std::vector<T> Padded(const std::vector<T>& x, int b, int t, int width, int cap) {
  std::vector<T> out(static_cast<size_t>(b) * cap * width, T(0));
  for (int bi = 0; bi < b; ++bi) {
    std::copy_n(x.begin() + static_cast<size_t>(bi) * t * width, static_cast<size_t>(t) * width,
                out.begin() + static_cast<size_t>(bi) * cap * width);
  }
  return out;
}

template <typename T>
void Check(const Shape& s, double tol) {
  SCOPED_TRACE(::testing::Message() << "b" << s.b << " t" << s.t << " nh" << s.nh << " nkv"
                                    << s.nkv << " hs" << s.hs);
  ThreadPool pool(3);
  const CpuExec x{&pool};
  const int qd = s.nh * s.hs, kd = s.nkv * s.hs;
  const std::vector<T> q = Cast<T>(RandomVector(static_cast<size_t>(s.b) * s.t * qd, 1, 2.0));
  const std::vector<T> k = Cast<T>(RandomVector(static_cast<size_t>(s.b) * s.t * kd, 2, 2.0));
  const std::vector<T> v = Cast<T>(RandomVector(static_cast<size_t>(s.b) * s.t * kd, 3));
  std::vector<T> full(q.size()), probs(static_cast<size_t>(s.b) * s.nh * s.t * s.t);
  AttentionForward(full.data(), probs.data(), q.data(), k.data(), v.data(), s.b, s.t, s.nh,
                   s.nkv, s.hs, &pool);

  // past = 0, tn = cap = t: bit for bit.
  std::vector<T> out(q.size(), T(-7));
  ASSERT_TRUE(ops::AttentionCachedForward(x, out.data(), q.data(), k.data(), v.data(), s.b, s.t,
                                          0, s.t, s.nh, s.nkv, s.hs)
                  .ok());
  EXPECT_EQ(out, full);

  // A cache with room for 5 more positions, the queries of rows [past, past + tn).
  const int cap = s.t + 5;
  const std::vector<T> kc = Padded(k, s.b, s.t, kd, cap), vc = Padded(v, s.b, s.t, kd, cap);
  for (int past : {0, 1, s.t / 2, s.t - 1}) {
    for (int tn : {1, s.t - past}) {
      if (past + tn > s.t || tn < 1) continue;
      SCOPED_TRACE(::testing::Message() << "past " << past << " tn " << tn);
      const std::vector<T> qn = Rows(q, s.b, s.t, qd, past, tn);
      std::vector<T> got(qn.size());
      ASSERT_TRUE(ops::AttentionCachedForward(x, got.data(), qn.data(), kc.data(), vc.data(),
                                              s.b, tn, past, cap, s.nh, s.nkv, s.hs)
                      .ok());
      const std::vector<T> want = Rows(full, s.b, s.t, qd, past, tn);
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
      }
      EXPECT_LT(worst, tol);
    }
  }
}

const Shape kShapes[] = {{1, 1, 2, 1, 4},  {2, 7, 4, 2, 8},  {2, 70, 4, 4, 16},
                         {1, 130, 4, 1, 8}, {3, 65, 6, 3, 32}};

TEST(AttentionCached, MatchesFullPassDouble) {
  InitBlas();
  for (const Shape& s : kShapes) Check<double>(s, 1e-12);
}

TEST(AttentionCached, MatchesFullPassFloat) {
  InitBlas();
  for (const Shape& s : kShapes) Check<float>(s, 1e-5);
}

}  // namespace
}  // namespace satdar::core::cpu
