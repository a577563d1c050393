// runtime/cka_test.cc: linear CKA against its definition (the n x n kernel form, a hand-computed
// case) and its invariances; CkaMatrix against LinearCka; constant states.
#include "runtime/cka.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace satdar::runtime {
namespace {

// n x d standard normal values, row-major.
std::vector<double> RandomMatrix(int64_t n, int d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> m(static_cast<size_t>(n) * d);
  for (double& v : m) v = normal(rng);
  return m;
}

// a (n x k) times b (k x m), row-major.
std::vector<double> MatMul(const std::vector<double>& a, const std::vector<double>& b, int64_t n,
                           int k, int m) {
  std::vector<double> c(static_cast<size_t>(n) * m, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int t = 0; t < k; ++t) {
      for (int j = 0; j < m; ++j) c[r * m + j] += a[r * k + t] * b[t * m + j];
    }
  }
  return c;
}

// A d x d orthogonal matrix: modified Gram-Schmidt on the columns of a random matrix.
std::vector<double> RandomOrthogonal(int d, uint64_t seed) {
  std::vector<double> q = RandomMatrix(d, d, seed);
  for (int c = 0; c < d; ++c) {
    for (int prev = 0; prev < c; ++prev) {
      double dot = 0.0;
      for (int r = 0; r < d; ++r) dot += q[r * d + c] * q[r * d + prev];
      for (int r = 0; r < d; ++r) q[r * d + c] -= dot * q[r * d + prev];
    }
    double norm = 0.0;
    for (int r = 0; r < d; ++r) norm += q[r * d + c] * q[r * d + c];
    norm = std::sqrt(norm);
    for (int r = 0; r < d; ++r) q[r * d + c] /= norm;
  }
  return q;
}

// CKA in the n x n kernel form, <Kx, Ky>_F / (||Kx||_F ||Ky||_F) with K = Xc Xc^T.
double KernelFormCka(const std::vector<double>& x, const std::vector<double>& y, int64_t n, int p,
                     int q) {
  auto centred_kernel = [n](const std::vector<double>& m, int d) {
    std::vector<double> mc = m;
    for (int c = 0; c < d; ++c) {
      double mean = 0.0;
      for (int64_t r = 0; r < n; ++r) mean += m[r * d + c];
      mean /= n;
      for (int64_t r = 0; r < n; ++r) mc[r * d + c] -= mean;
    }
    std::vector<double> k(n * n, 0.0);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t s = 0; s < n; ++s) {
        for (int c = 0; c < d; ++c) k[r * n + s] += mc[r * d + c] * mc[s * d + c];
      }
    }
    return k;
  };
  const std::vector<double> kx = centred_kernel(x, p), ky = centred_kernel(y, q);
  double xy = 0.0, xx = 0.0, yy = 0.0;
  for (size_t i = 0; i < kx.size(); ++i) {
    xy += kx[i] * ky[i];
    xx += kx[i] * kx[i];
    yy += ky[i] * ky[i];
  }
  return xy / std::sqrt(xx * yy);
}

TEST(LinearCka, WithItselfIsOne) {
  const std::vector<double> x = RandomMatrix(257, 19, 1);
  EXPECT_NEAR(LinearCka(x.data(), x.data(), 257, 19, 19), 1.0, 1e-12);
  const std::vector<double> copy = x;
  EXPECT_NEAR(LinearCka(x.data(), copy.data(), 257, 19, 19), 1.0, 1e-12);
}

// n not a multiple of 4 or of the row block, p over one i tile, q over one j tile.
TEST(LinearCka, MatchesKernelForm) {
  const int64_t n = 301;
  const int p = 40, q = 260;
  const std::vector<double> x = RandomMatrix(n, p, 2);
  // y shares structure with x, so the CKA is far from 0.
  std::vector<double> y = MatMul(x, RandomMatrix(p, q, 3), n, p, q);
  const std::vector<double> noise = RandomMatrix(n, q, 4);
  for (size_t i = 0; i < y.size(); ++i) y[i] += 3.0 * noise[i];
  const double expected = KernelFormCka(x, y, n, p, q);
  EXPECT_GT(expected, 0.2);
  EXPECT_NEAR(LinearCka(x.data(), y.data(), n, p, q), expected, 1e-12);
}

TEST(LinearCka, TwoScalarsGiveSquaredPearsonCorrelation) {
  // x = (1, 2, 4), y = (1, 3, 2): centred (-4/3, -1/3, 5/3) and (-1, 1, 0), so
  // r^2 = 1^2 / ((14/3) * 2) = 3/28.
  const double x[] = {1, 2, 4};
  const double y[] = {1, 3, 2};
  EXPECT_NEAR(LinearCka(x, y, 3, 1, 1), 3.0 / 28.0, 1e-12);
}

TEST(LinearCka, InvariantToOrthogonalTransformAndScale) {
  const int64_t n = 500;
  const int p = 12, q = 7;
  const std::vector<double> x = RandomMatrix(n, p, 5);
  std::vector<double> y = MatMul(x, RandomMatrix(p, q, 6), n, p, q);
  const std::vector<double> noise = RandomMatrix(n, q, 7);
  for (size_t i = 0; i < y.size(); ++i) y[i] += noise[i];
  const double base = LinearCka(x.data(), y.data(), n, p, q);
  ASSERT_GT(base, 0.1);

  const std::vector<double> rot = RandomOrthogonal(p, 8);
  const std::vector<double> qtq = MatMul(
      [&] {
        std::vector<double> t(p * p);
        for (int r = 0; r < p; ++r)
          for (int c = 0; c < p; ++c) t[c * p + r] = rot[r * p + c];
        return t;
      }(),
      rot, p, p, p);
  for (int r = 0; r < p; ++r) {
    for (int c = 0; c < p; ++c) ASSERT_NEAR(qtq[r * p + c], r == c ? 1.0 : 0.0, 1e-12);
  }
  const std::vector<double> xq = MatMul(x, rot, n, p, p);
  EXPECT_NEAR(LinearCka(xq.data(), y.data(), n, p, q), base, 1e-10);

  std::vector<double> scaled = x;
  for (double& v : scaled) v *= 3.7;
  EXPECT_NEAR(LinearCka(scaled.data(), y.data(), n, p, q), base, 1e-10);
  // A shift of every column changes nothing either (the columns are centred).
  std::vector<double> shifted = y;
  for (size_t i = 0; i < shifted.size(); ++i) shifted[i] += 10.0 + static_cast<double>(i % q);
  EXPECT_NEAR(LinearCka(x.data(), shifted.data(), n, p, q), base, 1e-10);
}

TEST(LinearCka, SymmetricAndInUnitInterval) {
  const int64_t n = 200;
  for (uint64_t seed = 10; seed < 16; ++seed) {
    const int p = 3 + static_cast<int>(seed % 5), q = 9 - static_cast<int>(seed % 4);
    const std::vector<double> x = RandomMatrix(n, p, seed);
    std::vector<double> y = RandomMatrix(n, q, seed + 100);
    for (int64_t r = 0; r < n; ++r) y[r * q] += x[r * p] * static_cast<double>(seed - 10);
    const double xy = LinearCka(x.data(), y.data(), n, p, q);
    const double yx = LinearCka(y.data(), x.data(), n, q, p);
    EXPECT_NEAR(xy, yx, 1e-14) << "seed " << seed;
    EXPECT_GE(xy, 0.0) << "seed " << seed;
    EXPECT_LE(xy, 1.0) << "seed " << seed;
  }
}

TEST(LinearCka, IndependentStatesAreFarApart) {
  const int64_t n = 4000;
  const int d = 8;
  const std::vector<double> x = RandomMatrix(n, d, 20);
  const std::vector<double> y = RandomMatrix(n, d, 21);
  EXPECT_LT(LinearCka(x.data(), y.data(), n, d, d), 0.1);
}

TEST(LinearCka, ConstantStateGivesNaN) {
  const int64_t n = 30;
  const int d = 4;
  const std::vector<double> x = RandomMatrix(n, d, 30);
  // 0.1 has no exact mean over 30 rows: the centring must still give exact zeros.
  const std::vector<double> flat(n * d, 0.1);
  EXPECT_TRUE(std::isnan(LinearCka(x.data(), flat.data(), n, d, d)));
  EXPECT_TRUE(std::isnan(LinearCka(flat.data(), x.data(), n, d, d)));
  // Every row the same, the columns different.
  std::vector<double> rows(n * d);
  for (int64_t r = 0; r < n; ++r)
    for (int c = 0; c < d; ++c) rows[r * d + c] = 0.3 * c - 1.7;
  EXPECT_TRUE(std::isnan(LinearCka(rows.data(), x.data(), n, d, d)));
  // One example, or no features.
  EXPECT_TRUE(std::isnan(LinearCka(x.data(), x.data(), 1, d, d)));
  EXPECT_TRUE(std::isnan(LinearCka(x.data(), x.data(), n, 0, d)));
}

TEST(CkaMatrix, EqualsPairwiseLinearCka) {
  const int64_t n = 150;
  const int d = 6;
  std::vector<std::vector<double>> s;
  for (uint64_t seed = 0; seed < 4; ++seed) s.push_back(RandomMatrix(n, d, 40 + seed));
  for (int64_t r = 0; r < n; ++r) s[1][r * d] += 2.0 * s[0][r * d];  // s0 and s1 related
  const std::vector<double> flat(n * d, -2.5);
  // a and b share states, in both orders.
  const std::vector<const double*> a = {s[0].data(), s[1].data(), s[2].data(), flat.data()};
  const std::vector<const double*> b = {s[1].data(), s[3].data(), s[0].data()};
  const std::vector<double> m = CkaMatrix(a, b, n, d);
  ASSERT_EQ(m.size(), a.size() * b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < b.size(); ++j) {
      const double expected = LinearCka(a[i], b[j], n, d, d);
      if (a[i] == flat.data()) {
        EXPECT_TRUE(std::isnan(m[i * b.size() + j])) << i << "," << j;
        EXPECT_TRUE(std::isnan(expected));
      } else {
        EXPECT_NEAR(m[i * b.size() + j], expected, 1e-13) << i << "," << j;
      }
    }
  }
  EXPECT_NEAR(m[0 * b.size() + 2], 1.0, 1e-12);                  // s0 with itself
  EXPECT_NEAR(m[1 * b.size() + 0], 1.0, 1e-12);                  // s1 with itself
  EXPECT_NEAR(m[0 * b.size() + 0], m[1 * b.size() + 2], 1e-15);  // (s0, s1) and (s1, s0)
}

TEST(CkaMatrix, EmptyListsGiveEmptyMatrix) {
  const std::vector<double> x = RandomMatrix(10, 2, 50);
  EXPECT_TRUE(CkaMatrix({}, {x.data()}, 10, 2).empty());
  EXPECT_TRUE(CkaMatrix({x.data()}, {}, 10, 2).empty());
}

}  // namespace
}  // namespace satdar::runtime
