// runtime/cka.cc: linear CKA in the feature-space form, from blocked cross products X^T Y of
// centred states (see cka.h).
#include "runtime/cka.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace satdar::runtime {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Tiles of the cross product: kRowBlock rows of the states at a time, and an output tile of
// kIBlock x kJBlock doubles (64 KiB) updated by four rows at once.
constexpr int64_t kRowBlock = 128;
constexpr int kIBlock = 32;
constexpr int kJBlock = 256;

// x (n x p, row-major) with every column's mean subtracted. A column whose values are all equal
// becomes exactly 0 (its mean need not be exactly representable as that value).
std::vector<double> Centered(const double* x, int64_t n, int p) {
  std::vector<double> mean(p, 0.0);
  std::vector<char> constant(p, 1);
  for (int64_t k = 0; k < n; ++k) {
    const double* row = x + k * p;
    for (int i = 0; i < p; ++i) {
      mean[i] += row[i];
      if (row[i] != x[i]) constant[i] = 0;
    }
  }
  for (int i = 0; i < p; ++i) mean[i] /= static_cast<double>(n);
  std::vector<double> out(static_cast<size_t>(n) * p);
  for (int64_t k = 0; k < n; ++k) {
    const double* row = x + k * p;
    double* o = out.data() + k * p;
    for (int i = 0; i < p; ++i) o[i] = constant[i] ? 0.0 : row[i] - mean[i];
  }
  return out;
}

// c (p x q, row-major) = a^T b for a (n x p) and b (n x q), both row-major. With upper_only
// (a == b, p == q) only the elements with j >= i are computed; the others are left 0. Every
// element is summed over the rows in the same order whatever the tiling, so a^T b and (b^T a)^T
// agree exactly.
void CrossProduct(const double* a, int p, const double* b, int q, int64_t n, bool upper_only,
                  double* c) {
  std::fill(c, c + static_cast<int64_t>(p) * q, 0.0);
  for (int64_t k0 = 0; k0 < n; k0 += kRowBlock) {
    const int64_t k1 = std::min(n, k0 + kRowBlock);
    for (int i0 = 0; i0 < p; i0 += kIBlock) {
      const int i1 = std::min(p, i0 + kIBlock);
      for (int j0 = 0; j0 < q; j0 += kJBlock) {
        const int j1 = std::min(q, j0 + kJBlock);
        if (upper_only && j1 <= i0) continue;  // the tile lies below the diagonal
        int64_t k = k0;
        for (; k + 4 <= k1; k += 4) {
          const double* a0 = a + k * p;
          const double* a1 = a0 + p;
          const double* a2 = a1 + p;
          const double* a3 = a2 + p;
          const double* b0 = b + k * q;
          const double* b1 = b0 + q;
          const double* b2 = b1 + q;
          const double* b3 = b2 + q;
          for (int i = i0; i < i1; ++i) {
            const int js = upper_only ? std::max(j0, i) : j0;
            const double x0 = a0[i], x1 = a1[i], x2 = a2[i], x3 = a3[i];
            double* ci = c + static_cast<int64_t>(i) * q;
#pragma omp simd
            for (int j = js; j < j1; ++j) {
              ci[j] += x0 * b0[j] + x1 * b1[j] + x2 * b2[j] + x3 * b3[j];
            }
          }
        }
        for (; k < k1; ++k) {
          const double* a0 = a + k * p;
          const double* b0 = b + k * q;
          for (int i = i0; i < i1; ++i) {
            const int js = upper_only ? std::max(j0, i) : j0;
            const double x0 = a0[i];
            double* ci = c + static_cast<int64_t>(i) * q;
#pragma omp simd
            for (int j = js; j < j1; ++j) ci[j] += x0 * b0[j];
          }
        }
      }
    }
  }
}

// ||Xc^T Xc||_F of a centred state, from the upper triangle of its Gram matrix.
double SelfNorm(const double* xc, int64_t n, int p, std::vector<double>* scratch) {
  scratch->resize(static_cast<size_t>(p) * p);
  CrossProduct(xc, p, xc, p, n, /*upper_only=*/true, scratch->data());
  double diag = 0.0, off = 0.0;
  for (int i = 0; i < p; ++i) {
    const double* gi = scratch->data() + static_cast<int64_t>(i) * p;
    diag += gi[i] * gi[i];
    for (int j = i + 1; j < p; ++j) off += gi[j] * gi[j];
  }
  return std::sqrt(diag + 2.0 * off);
}

// ||Yc^T Xc||_F^2 (= ||Xc^T Yc||_F^2) of two centred states.
double CrossNormSquared(const double* xc, int p, const double* yc, int q, int64_t n,
                        std::vector<double>* scratch) {
  scratch->resize(static_cast<size_t>(p) * q);
  CrossProduct(xc, p, yc, q, n, /*upper_only=*/false, scratch->data());
  double sum = 0.0;
  for (double v : *scratch) sum += v * v;
  return sum;
}

// The CKA from its three terms; NaN for a zero (or NaN) denominator. Rounding can put CKA(X, X)
// a few ulps above 1; it is clamped to 1.
double CkaFromTerms(double cross_squared, double norm_x, double norm_y) {
  const double denominator = norm_x * norm_y;
  if (!(denominator > 0.0)) return kNaN;
  double cka = cross_squared / denominator;
  if (cka > 1.0) cka = 1.0;
  return cka;
}

}  // namespace

double LinearCka(const double* x, const double* y, int64_t n, int p, int q) {
  if (n < 2 || p < 1 || q < 1) return kNaN;
  const std::vector<double> xc = Centered(x, n, p);
  const std::vector<double> yc = Centered(y, n, q);
  std::vector<double> scratch;
  const double norm_x = SelfNorm(xc.data(), n, p, &scratch);
  const double norm_y = SelfNorm(yc.data(), n, q, &scratch);
  if (!(norm_x * norm_y > 0.0)) return kNaN;
  return CkaFromTerms(CrossNormSquared(xc.data(), p, yc.data(), q, n, &scratch), norm_x, norm_y);
}

std::vector<double> CkaMatrix(const std::vector<const double*>& a,
                              const std::vector<const double*>& b, int64_t n, int d) {
  std::vector<double> out(a.size() * b.size(), kNaN);
  if (n < 2 || d < 1 || out.empty()) return out;

  // Distinct states in order of first appearance (a, then b).
  std::vector<const double*> states;
  std::unordered_map<const double*, int> index;
  auto index_of = [&](const double* s) {
    auto [it, inserted] = index.emplace(s, static_cast<int>(states.size()));
    if (inserted) states.push_back(s);
    return it->second;
  };
  std::vector<int> ai, bi;
  for (const double* s : a) ai.push_back(index_of(s));
  for (const double* s : b) bi.push_back(index_of(s));

  const int count = static_cast<int>(states.size());
  std::vector<std::vector<double>> centered(count);
  std::vector<double> norm(count);
  std::vector<double> scratch;
  for (int u = 0; u < count; ++u) {
    centered[u] = Centered(states[u], n, d);
    norm[u] = SelfNorm(centered[u].data(), n, d, &scratch);
  }

  // ||Yc^T Xc||_F^2 of each unordered pair, computed on first use.
  std::vector<double> cross(static_cast<size_t>(count) * count, kNaN);
  std::vector<char> done(static_cast<size_t>(count) * count, 0);
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < b.size(); ++j) {
      const int u = ai[i], v = bi[j];
      if (!(norm[u] * norm[v] > 0.0)) continue;  // NaN
      const size_t key = static_cast<size_t>(std::min(u, v)) * count + std::max(u, v);
      if (!done[key]) {
        const std::vector<double>& lo = centered[std::min(u, v)];
        const std::vector<double>& hi = centered[std::max(u, v)];
        cross[key] = CrossNormSquared(lo.data(), d, hi.data(), d, n, &scratch);
        done[key] = 1;
      }
      out[i * b.size() + j] = CkaFromTerms(cross[key], norm[u], norm[v]);
    }
  }
  return out;
}

}  // namespace satdar::runtime
