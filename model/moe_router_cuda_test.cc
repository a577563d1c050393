// The MoE router kernels (variants/moe_router_cuda.h) against host loops written as
// model/variants/moe.cc's Route, Dispatch, aux/z loss and router backward. Skips without a CUDA
// build or without a GPU.
//
// The discrete steps are checked exactly against the GPU's own probabilities (so a last-bit
// difference in a probability cannot flip a reference choice): top-k choices and their order,
// the dispatch plan (counts, slots in (expert, token) order, inverse map), the fraction f_e^b.
// Tolerances (max |gpu - ref| / max |ref|, reference in double):
//   probabilities 1e-6, lse 1e-6, weights 1e-6, loss 1e-6 (relative), dlogits f32 1e-5 and
//   bf16 1e-2 (stored bf16).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/dtype.h"
#include "gtest/gtest.h"
#include "model/variants/moe_router_cuda.h"

namespace satdar::model {
namespace {

using core::DType;
namespace rt = core::cuda;

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceBuffer;
using core::gpu_test::DeviceVector;
using core::gpu_test::RelErr;

struct Case {
  int b, t, e, k;
  bool norm_topk;
  bool ties;  // every fourth token has all-equal logits (its choice must be experts 0..k-1)
};

std::vector<int> DownloadInts(const DeviceVector<int>& v) {
  std::vector<int> h(v.size());
  EXPECT_TRUE(rt::CopyToHost(h.data(), v.get(), h.size() * sizeof(int)).ok());
  return h;
}

void Check(const Case& c, DType dt) {
  SCOPED_TRACE(std::string(core::DTypeName(dt)) + " b=" + std::to_string(c.b) + " t=" +
               std::to_string(c.t) + " e=" + std::to_string(c.e) + " k=" + std::to_string(c.k) +
               (c.norm_topk ? " norm_topk" : ""));
  const int n = c.b * c.t, e = c.e, k = c.k;
  const size_t ne = static_cast<size_t>(n) * e, nk = static_cast<size_t>(n) * k;
  std::vector<float> logits = core::gpu_test::RandomNormal(ne, 21, 2.0f);
  if (c.ties) {
    for (int r = 0; r < n; r += 4) {
      std::fill(logits.begin() + r * e, logits.begin() + (r + 1) * e, 0.5f);
    }
  }
  DeviceBuffer glogits(logits, DType::kF32);
  DeviceBuffer gprobs(ne, DType::kF32), glse(n, DType::kF32), gweight(nk, DType::kF32);
  DeviceBuffer gfraction(static_cast<size_t>(c.b) * e, DType::kF32);
  DeviceVector<int> gsel(std::vector<int>(nk, -1)), gcounts(std::vector<int>(e, -1));
  DeviceVector<int> gslots(std::vector<int>(nk, -1)), ginv(std::vector<int>(nk, -1));
  DeviceVector<double> gloss(std::vector<double>{0.25}), gscratch(std::vector<double>(c.b));
  ASSERT_TRUE(cuda::MoeRoute(gprobs.f32(), glse.f32(), gsel.get(), gweight.f32(), glogits.f32(),
                             n, e, k, c.norm_topk)
                  .ok());
  ASSERT_TRUE(cuda::MoePlan(gcounts.get(), gslots.get(), ginv.get(), gsel.get(), n, e, k).ok());
  const double aux_coef = 0.01, z_coef = 0.001, scale = 0.5;
  ASSERT_TRUE(cuda::MoeRouterLoss(gloss.get(), gfraction.f32(), gscratch.get(), gprobs.f32(),
                                  glse.f32(), gsel.get(), c.b, c.t, e, k, aux_coef, z_coef, scale)
                  .ok());
  const std::vector<float> probs = gprobs.Download(), lse = glse.Download();
  const std::vector<float> weight = gweight.Download(), fraction = gfraction.Download();
  const std::vector<int> sel = DownloadInts(gsel), counts = DownloadInts(gcounts);
  const std::vector<int> slots = DownloadInts(gslots), inv = DownloadInts(ginv);

  // Route: softmax and logsumexp in double; top-k by a stable sort of the GPU's probabilities.
  std::vector<float> probs_ref(ne), lse_ref(n), weight_ref(nk);
  std::vector<int> sel_ref(nk);
  for (int r = 0; r < n; ++r) {
    const float* x = logits.data() + static_cast<size_t>(r) * e;
    const double mx = *std::max_element(x, x + e);
    double sum = 0;
    for (int j = 0; j < e; ++j) sum += std::exp(x[j] - mx);
    for (int j = 0; j < e; ++j) {
      probs_ref[r * e + j] = static_cast<float>(std::exp(x[j] - mx) / sum);
    }
    lse_ref[r] = static_cast<float>(mx + std::log(sum));
    const float* pr = probs.data() + static_cast<size_t>(r) * e;
    std::vector<int> order(e);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pr[a] > pr[b]; });
    double total = 0;
    for (int j = 0; j < k; ++j) total += pr[order[j]];
    for (int j = 0; j < k; ++j) {
      sel_ref[r * k + j] = order[j];
      weight_ref[r * k + j] = static_cast<float>(c.norm_topk ? pr[order[j]] / total : pr[order[j]]);
    }
    if (c.ties && r % 4 == 0) {
      for (int j = 0; j < k; ++j) EXPECT_EQ(sel[r * k + j], j) << "tie at token " << r;
    }
  }
  EXPECT_LT(RelErr(probs, probs_ref), 1e-6) << "probabilities";
  EXPECT_LT(RelErr(lse, lse_ref), 1e-6) << "lse";
  EXPECT_EQ(sel, sel_ref) << "top-k choices";
  EXPECT_LT(RelErr(weight, weight_ref), 1e-6) << "routing weights";

  // Plan: slots in (expert, token) order.
  std::vector<int> counts_ref(e, 0), slots_ref;
  for (int x = 0; x < e; ++x) {
    for (size_t s = 0; s < nk; ++s) {
      if (sel[s] == x) slots_ref.push_back(static_cast<int>(s));
    }
    counts_ref[x] = static_cast<int>(slots_ref.size()) -
                    std::accumulate(counts_ref.begin(), counts_ref.begin() + x, 0);
  }
  EXPECT_EQ(counts, counts_ref) << "counts";
  EXPECT_EQ(slots, slots_ref) << "slots";
  for (size_t r = 0; r < nk; ++r) EXPECT_EQ(inv[slots_ref[r]], static_cast<int>(r)) << "inverse";

  // Loss: aux (per sequence) and z.
  std::vector<float> fraction_ref(static_cast<size_t>(c.b) * e, 0.0f);
  double aux = 0, zl = 0;
  for (int b = 0; b < c.b; ++b) {
    std::vector<double> f(e, 0.0), p(e, 0.0);
    for (int r = b * c.t; r < (b + 1) * c.t; ++r) {
      for (int j = 0; j < k; ++j) f[sel[r * k + j]] += 1.0 / (static_cast<double>(c.t) * k);
      for (int x = 0; x < e; ++x) p[x] += probs[static_cast<size_t>(r) * e + x] / c.t;
    }
    double s = 0;
    for (int x = 0; x < e; ++x) {
      s += f[x] * p[x];
      fraction_ref[b * e + x] = static_cast<float>(f[x]);
    }
    aux += e * s;
  }
  for (int r = 0; r < n; ++r) zl += static_cast<double>(lse[r]) * lse[r];
  const double loss_ref = 0.25 + scale * (aux_coef * aux / c.b + z_coef * zl / n);
  std::vector<double> loss(1);
  ASSERT_TRUE(rt::CopyToHost(loss.data(), gloss.get(), sizeof(double)).ok());
  EXPECT_NEAR(loss[0], loss_ref, 1e-6 * std::abs(loss_ref)) << "aux + z loss";
  EXPECT_LT(RelErr(fraction, fraction_ref), 1e-6) << "fraction";

  // Backward from a random routing-weight gradient.
  const std::vector<float> dweight = core::gpu_test::RandomNormal(nk, 33);
  const double aux_grad = scale * aux_coef * e / (static_cast<double>(c.b) * c.t);
  const double z_grad = scale * z_coef * 2.0 / n;
  std::vector<float> dlogits_ref(ne);
  for (int r = 0; r < n; ++r) {
    const int b = r / c.t;
    std::vector<double> dp(e);
    for (int x = 0; x < e; ++x) dp[x] = aux_grad * fraction[b * e + x];
    const int* s = sel.data() + static_cast<size_t>(r) * k;
    const float* w = weight.data() + static_cast<size_t>(r) * k;
    const float* dw = dweight.data() + static_cast<size_t>(r) * k;
    const float* pr = probs.data() + static_cast<size_t>(r) * e;
    if (c.norm_topk) {
      double sum = 0, dot = 0;
      for (int j = 0; j < k; ++j) {
        sum += pr[s[j]];
        dot += static_cast<double>(dw[j]) * w[j];
      }
      for (int j = 0; j < k; ++j) dp[s[j]] += (dw[j] - dot) / sum;
    } else {
      for (int j = 0; j < k; ++j) dp[s[j]] += dw[j];
    }
    double pdp = 0;
    for (int x = 0; x < e; ++x) pdp += pr[x] * dp[x];
    for (int x = 0; x < e; ++x) {
      dlogits_ref[r * e + x] = static_cast<float>(pr[x] * (dp[x] - pdp) + z_grad * lse[r] * pr[x]);
    }
  }
  DeviceBuffer gdw(dweight, DType::kF32), gdlogits(ne, dt);
  ASSERT_TRUE(cuda::MoeRouteBackward(dt, gdlogits.get(), gprobs.f32(), glse.f32(), gsel.get(),
                                     gweight.f32(), gdw.f32(), gfraction.f32(), c.b, c.t, e, k,
                                     c.norm_topk, aux_grad, z_grad)
                  .ok());
  EXPECT_LT(RelErr(gdlogits.Download(), dlogits_ref), dt == DType::kBF16 ? 1e-2 : 1e-5)
      << "dlogits";
}

class MoeRouterCuda : public ::testing::TestWithParam<DType> {};

TEST_P(MoeRouterCuda, MatchesMoeCc) {
  SATDAR_SKIP_WITHOUT_GPU();
  for (const Case& c : {Case{1, 1, 4, 1, false, false}, Case{2, 37, 8, 2, true, true},
                        Case{3, 64, 64, 8, false, true}, Case{2, 50, 256, 16, true, false},
                        Case{1, 40, 5, 5, true, true}, Case{4, 300, 33, 3, false, false}}) {
    Check(c, GetParam());
  }
}

// A diverged run's NaN or Inf logits must give a NaN loss (as on the CPU), not an illegal
// address: every choice stays a valid expert and every slot is dispatched.
TEST(MoeRouterCudaNonFinite, ChoicesStayValidAndTheLossIsNan) {
  SATDAR_SKIP_WITHOUT_GPU();
  const int b = 2, t = 3, e = 8, k = 2, n = b * t;
  std::vector<float> logits = core::gpu_test::RandomNormal(static_cast<size_t>(n) * e, 5);
  logits[1 * e + 3] = std::nanf("");
  logits[4 * e + 0] = INFINITY;
  DeviceBuffer glogits(logits, DType::kF32), gprobs(n * e, DType::kF32), glse(n, DType::kF32);
  DeviceBuffer gweight(n * k, DType::kF32), gfraction(b * e, DType::kF32);
  DeviceVector<int> gsel(std::vector<int>(n * k, -1)), gcounts(std::vector<int>(e, 0));
  DeviceVector<int> gslots(std::vector<int>(n * k, -1)), ginv(std::vector<int>(n * k, -1));
  DeviceVector<double> gloss(std::vector<double>{0.0});
  DeviceVector<double> gscratch(std::vector<double>(static_cast<size_t>(b)));
  ASSERT_TRUE(cuda::MoeRoute(gprobs.f32(), glse.f32(), gsel.get(), gweight.f32(), glogits.f32(),
                             n, e, k, false)
                  .ok());
  ASSERT_TRUE(cuda::MoePlan(gcounts.get(), gslots.get(), ginv.get(), gsel.get(), n, e, k).ok());
  // Without a loss accumulator only the fraction is computed.
  ASSERT_TRUE(cuda::MoeRouterLoss(nullptr, gfraction.f32(), gscratch.get(), gprobs.f32(),
                                  glse.f32(), gsel.get(), b, t, e, k, 0.01, 0.001, 1.0)
                  .ok());
  const std::vector<float> fraction = gfraction.Download();
  ASSERT_TRUE(cuda::MoeRouterLoss(gloss.get(), gfraction.f32(), gscratch.get(), gprobs.f32(),
                                  glse.f32(), gsel.get(), b, t, e, k, 0.01, 0.001, 1.0)
                  .ok());
  ASSERT_TRUE(rt::Synchronize().ok());
  const std::vector<int> sel = DownloadInts(gsel), counts = DownloadInts(gcounts);
  for (int x : sel) EXPECT_TRUE(x >= 0 && x < e) << x;
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), n * k);
  double fsum = 0;
  for (float f : fraction) fsum += f;
  EXPECT_NEAR(fsum, b, 1e-5);  // each sequence's fractions sum to 1
  std::vector<double> loss(1);
  ASSERT_TRUE(rt::CopyToHost(loss.data(), gloss.get(), sizeof(double)).ok());
  EXPECT_FALSE(std::isfinite(loss[0]));
}

TEST_P(MoeRouterCuda, RejectsBadShapes) {
  SATDAR_SKIP_WITHOUT_GPU();
  EXPECT_EQ(cuda::MoeRoute(nullptr, nullptr, nullptr, nullptr, nullptr, 4,
                           cuda::kMoeMaxExperts + 1, 2, false)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::MoePlan(nullptr, nullptr, nullptr, nullptr, 4, 4, 5).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(DTypes, MoeRouterCuda, ::testing::Values(DType::kF32, DType::kBF16),
                         core::gpu_test::DTypeParamName);

#else  // !SATDAR_WITH_CUDA

TEST(MoeRouterCuda, Skipped) { SATDAR_SKIP_WITHOUT_GPU(); }

#endif  // SATDAR_WITH_CUDA

}  // namespace
}  // namespace satdar::model
