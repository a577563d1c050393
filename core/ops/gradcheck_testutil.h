// core/ops/gradcheck_testutil.h: f64 central-difference checks of Backward functions.
//
//   std::vector<double> x = RandomVector(n, seed);
//   auto loss = [&] { ... forward on x, return sum(out * r) ... };
//   EXPECT_LT(GradError(&x, analytic_dx, loss), 1e-7);
#ifndef SATDAR_CORE_OPS_GRADCHECK_TESTUTIL_H_
#define SATDAR_CORE_OPS_GRADCHECK_TESTUTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/random.h"

namespace satdar::core::testing {

inline std::vector<double> RandomVector(size_t n, uint64_t seed, double scale = 1.0,
                                        double mean = 0.0) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = mean + scale * RandomNormal(seed, 17, i);
  return v;
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Largest |analytic - numeric| over x's elements, relative to the largest |numeric|.
// Perturbs each x[i] by +-h, calls loss(), and restores x.
inline double GradError(std::vector<double>* x, const std::vector<double>& analytic,
                        const std::function<double()>& loss, double h = 1e-6) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < x->size(); ++i) {
    double saved = (*x)[i];
    (*x)[i] = saved + h;
    double up = loss();
    (*x)[i] = saved - h;
    double down = loss();
    (*x)[i] = saved;
    double numeric = (up - down) / (2 * h);
    max_diff = std::max(max_diff, std::fabs(numeric - analytic[i]));
    max_ref = std::max(max_ref, std::fabs(numeric));
  }
  return max_diff / std::max(max_ref, 1e-12);
}

}  // namespace satdar::core::testing

#endif  // SATDAR_CORE_OPS_GRADCHECK_TESTUTIL_H_
