// The MoE FFN's ops (moe_ops.h): the CPU side by f64 central differences (the router backward
// with the aux and z losses, with and without norm_topk; combine backward's dweight and dy;
// permute backward), the top-k tie order and the dispatch plan, and the CUDA side against the
// CPU side, f32 and bf16 (tag gpu: skipped without a GPU), on the shapes the router and
// permute kernels were tested on before (E up to kMoeMaxExperts, k up to kMoeMaxTopK, tied
// logits), plus non-finite logits and the shape limits.
//
// Tolerances (gpu_test_util's ExpectClose: |gpu - cpu| <= rtol * max(|cpu|, rms(cpu))):
//   Integer outputs (choices, counts, slots, row_of_slot) and the permute (a copy) are exactly
//   equal. The choices are compared with a stable top-k of the GPU's own probabilities (expf
//   and the sum order differ by ulps, which may reorder near-ties); the plan, losses and
//   backward run on both sides from the GPU's routing.
//   Routing values (fp32 on both sides): probs, lse, weight 1e-5 (the CPU computes its own
//   softmax with std::exp, the GPU with expf: the deleted transcription test copied the GPU's
//   values and could use 1e-6); fraction and the loss 1e-6
//   (exact counts over T*k; the loss's sums in fp64 on both sides, fp32 probs).
//   Row outputs: f32 1e-5 (the order of additions and fused multiply-adds differ). bf16: the
//   CPU runs in f32 on the same bf16-rounded inputs; outputs stored in bf16 (dlogits, combine,
//   dy, permute backward) get 1e-2 (one bf16 rounding is <= 2^-9 relative), dweight (fp32, a
//   dot product of exactly representable products) 1e-4.
#include "model/variants/moe_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/ops/gradcheck_testutil.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"
#include "model/variants/ops_test_exec.h"

namespace satdar::model {
namespace {

using core::testing::Dot;
using core::testing::GradError;
using core::testing::RandomVector;
using Vec = std::vector<double>;

size_t Sz(int a, int b) { return static_cast<size_t>(a) * b; }

// loss = <cw, weight> + scale (aux + z-loss) as a function of the logits; the choices stay
// put under the perturbation (random logits, no near-ties).
TEST(MoeOps, RouterGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int b = 2, t = 5, e = 6, k = 2, n = b * t;
  const double aux_coef = 0.3, z_coef = 0.2, scale = 1.7;
  for (bool norm : {false, true}) {
    Vec logits = RandomVector(Sz(n, e), 1, 1.5);
    const Vec cw = RandomVector(Sz(n, k), 2);
    Vec probs(Sz(n, e)), lse(n), weight(Sz(n, k)), fraction(Sz(b, e));
    std::vector<int> sel(Sz(n, k));
    auto loss = [&] {
      cpu::MoeRoute(probs.data(), lse.data(), sel.data(), weight.data(), logits.data(), n, e, k,
                    norm, &pool);
      double l = 0;
      cpu::MoeRouterLoss(&l, fraction.data(), probs.data(), lse.data(), sel.data(), b, t, e, k,
                         aux_coef, z_coef, scale);
      return l + Dot(cw, weight);
    };
    loss();
    const std::vector<int> sel0 = sel;
    Vec dlogits(logits.size(), 7.0);  // overwritten
    cpu::MoeRouteBackward(dlogits.data(), probs.data(), lse.data(), sel.data(), weight.data(),
                          cw.data(), fraction.data(), b, t, e, k, norm,
                          scale * aux_coef * e / (b * t), scale * z_coef * 2.0 / n, &pool);
    EXPECT_LT(GradError(&logits, dlogits, loss), 1e-7) << "norm_topk " << norm;
    EXPECT_EQ(sel, sel0) << "the choices moved under the perturbation";
    // Each sequence's fractions sum to 1.
    for (int bb = 0; bb < b; ++bb) {
      EXPECT_NEAR(std::accumulate(&fraction[bb * e], &fraction[bb * e] + e, 0.0), 1.0, 1e-12);
    }
  }
}

// Dispatch of random choices; loss = <g, combine(y, weight)> and <g, permute(x)>.
TEST(MoeOps, CombineAndPermuteGradientsMatchFiniteDifferences) {
  core::ThreadPool pool(2);
  const int n = 7, e = 5, k = 3, d = 4, rows = n * k;
  Vec logits = RandomVector(Sz(n, e), 3), probs(Sz(n, e)), lse(n), weight(Sz(n, k));
  std::vector<int> sel(Sz(n, k)), counts(e), slots(rows), row_of_slot(rows);
  cpu::MoeRoute(probs.data(), lse.data(), sel.data(), weight.data(), logits.data(), n, e, k,
                true, &pool);
  cpu::MoePlan(counts.data(), slots.data(), row_of_slot.data(), sel.data(), n, e, k);
  Vec y = RandomVector(Sz(rows, d), 4), x = RandomVector(Sz(n, d), 5);
  const Vec g = RandomVector(Sz(n, d), 6), gp = RandomVector(Sz(rows, d), 7);
  Vec out(Sz(n, d)), xp(Sz(rows, d));
  auto combine = [&] {
    cpu::MoeCombine(out.data(), y.data(), weight.data(), row_of_slot.data(), n, k, d, &pool);
    return Dot(g, out);
  };
  Vec dy(y.size(), 7.0), dweight(weight.size(), 7.0);
  cpu::MoeCombineBackward(dy.data(), dweight.data(), g.data(), y.data(), weight.data(),
                          slots.data(), rows, k, d, &pool);
  EXPECT_LT(GradError(&y, dy, combine), 1e-7) << "dy";
  EXPECT_LT(GradError(&weight, dweight, combine), 1e-7) << "dweight";
  auto permute = [&] {
    cpu::MoePermute(xp.data(), x.data(), slots.data(), rows, k, d, &pool);
    return Dot(gp, xp);
  };
  const Vec dx0 = RandomVector(x.size(), 8);
  Vec dx = dx0;  // accumulated into
  cpu::MoePermuteBackward(dx.data(), gp.data(), row_of_slot.data(), n, k, d, &pool);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx0[i];
  EXPECT_LT(GradError(&x, dx, permute), 1e-7) << "permute dx";
}

// Ties go to the lower index (the stable sort); the plan lists slots in (expert, token) order.
TEST(MoeOps, TopKTiesAndPlanOrder) {
  core::ThreadPool pool(2);
  const int n = 3, e = 6, k = 3;
  const std::vector<float> logits = {0, 0, 0, 0, 0, 0,  1, 3, 3, 0, 3, 2,  5, 1, 2, 1, 4, 1};
  std::vector<float> probs(Sz(n, e)), lse(n), weight(Sz(n, k));
  std::vector<int> sel(Sz(n, k)), counts(e), slots(n * k), row_of_slot(n * k);
  cpu::MoeRoute(probs.data(), lse.data(), sel.data(), weight.data(), logits.data(), n, e, k,
                false, &pool);
  EXPECT_EQ(sel, (std::vector<int>{0, 1, 2, 1, 2, 4, 0, 4, 2}));
  for (int j = 0; j < k; ++j) EXPECT_EQ(weight[j], probs[0]);
  cpu::MoePlan(counts.data(), slots.data(), row_of_slot.data(), sel.data(), n, e, k);
  EXPECT_EQ(counts, (std::vector<int>{2, 2, 3, 0, 2, 0}));
  EXPECT_EQ(slots, (std::vector<int>{0, 6, 1, 3, 2, 4, 8, 5, 7}));
  for (int r = 0; r < n * k; ++r) EXPECT_EQ(row_of_slot[slots[r]], r);
  std::vector<int> inv(n * k, 5);
  cpu::MoeInvertSlots(inv.data(), slots.data(), n * k - 2, n, k);
  EXPECT_EQ(inv[slots[n * k - 1]], -1);
  EXPECT_EQ(inv[slots[0]], 0);
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceArray;
using core::gpu_test::DeviceVector;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

template <typename V>
std::vector<V> Down(const DeviceVector<V>& v) {
  std::vector<V> h(v.size());
  EXPECT_TRUE(core::cuda::CopyToHost(h.data(), v.get(), h.size() * sizeof(V)).ok());
  return h;
}

// The k largest of each token's probabilities, ties to the lower index.
std::vector<int> StableTopK(const std::vector<float>& probs, int n, int e, int k) {
  std::vector<int> sel(Sz(n, k)), order(e);
  for (int r = 0; r < n; ++r) {
    const float* pr = probs.data() + Sz(r, e);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return pr[a] > pr[c]; });
    std::copy(order.begin(), order.begin() + k, sel.begin() + Sz(r, k));
  }
  return sel;
}

struct Case {
  int b, t, e, k, d;
  bool norm, ties;
};

template <typename T>
void CheckCase(const Case& c) {
  const double stored = kIsBf16<T> ? 1e-2 : 1e-5, dot = kIsBf16<T> ? 1e-4 : 1e-5;
  const int n = c.b * c.t, e = c.e, k = c.k, d = c.d, rows = n * k;
  const double aux_coef = 0.01, z_coef = 0.001, scale = 0.5;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  SCOPED_TRACE(testing::Message() << "b " << c.b << " t " << c.t << " e " << e << " k " << k);
  auto logits = RandomNormal(Sz(n, e), 31 + e, 2.0f);
  for (int r = 0; c.ties && r < n; r += 4) std::fill_n(logits.begin() + Sz(r, e), e, 0.5f);
  // Route: the CPU on the same logits; the choices against the GPU's own probabilities.
  std::vector<float> probs(Sz(n, e)), lse(n), weight(Sz(n, k));
  std::vector<int> sel(Sz(n, k));
  EXPECT_TRUE(ops::MoeRoute(ex.cpu, probs.data(), lse.data(), sel.data(), weight.data(),
                            logits.data(), n, e, k, c.norm)
                  .ok());
  DeviceArray<float> glogits(logits), gprobs(probs.size()), glse(n), gweight(weight.size());
  DeviceVector<int> gsel(std::vector<int>(rows, -1)), gcounts(std::vector<int>(e, -1));
  DeviceVector<int> gslots(std::vector<int>(rows, -1)), ginv(std::vector<int>(rows, -1));
  ASSERT_TRUE(ops::MoeRoute(ex.gpu, gprobs.get(), glse.get(), gsel.get(), gweight.get(),
                            glogits.get(), n, e, k, c.norm)
                  .ok());
  const std::vector<float> gp = gprobs.Download(), gl = glse.Download(), gw = gweight.Download();
  const std::vector<int> gs = Down(gsel);
  ExpectClose(gp, probs, 1e-5, "probs");
  ExpectClose(gl, lse, 1e-5, "lse");
  // The CPU's choices are the GPU's but where ulps reorder a near-tie (probabilities within
  // 1e-6): there the weight follows the GPU's choice.
  for (size_t s = 0; s < sel.size(); ++s) {
    if (sel[s] == gs[s]) continue;
    const size_t row = s / k * e;
    EXPECT_NEAR(gp[row + sel[s]], gp[row + gs[s]], 1e-6 * gp[row + gs[s]]) << "slot " << s;
    weight[s] = gw[s];
  }
  ExpectClose(gw, weight, 1e-5, "weight");
  EXPECT_EQ(gs, StableTopK(gp, n, e, k)) << "top-k choices";
  for (int r = 0; c.ties && r < n; r += 4) {
    for (int j = 0; j < k; ++j) EXPECT_EQ(gs[Sz(r, k) + j], j) << "tie at token " << r;
  }
  // Plan, on both sides from the GPU's choices.
  std::vector<int> counts(e), slots(rows), row_of_slot(rows);
  EXPECT_TRUE(
      ops::MoePlan(ex.cpu, counts.data(), slots.data(), row_of_slot.data(), gs.data(), n, e, k)
          .ok());
  ASSERT_TRUE(
      ops::MoePlan(ex.gpu, gcounts.get(), gslots.get(), ginv.get(), gsel.get(), n, e, k).ok());
  EXPECT_EQ(Down(gcounts), counts) << "counts";
  EXPECT_EQ(Down(gslots), slots) << "slots";
  EXPECT_EQ(Down(ginv), row_of_slot) << "row_of_slot";
  std::vector<int> inv(rows);
  EXPECT_TRUE(ops::MoeInvertSlots(ex.cpu, inv.data(), slots.data(), rows - 1, n, k).ok());
  ASSERT_TRUE(ops::MoeInvertSlots(ex.gpu, ginv.get(), gslots.get(), rows - 1, n, k).ok());
  EXPECT_EQ(Down(ginv), inv) << "inverted slots";
  ASSERT_TRUE(ops::MoeInvertSlots(ex.gpu, ginv.get(), gslots.get(), rows, n, k).ok());
  // Losses, from the GPU's routing.
  std::vector<double> fraction(Sz(c.b, e));
  double loss = 0.25;
  EXPECT_TRUE(ops::MoeRouterLoss(ex.cpu, &loss, fraction.data(), gp.data(), gl.data(), gs.data(),
                                 c.b, c.t, e, k, aux_coef, z_coef, scale)
                  .ok());
  DeviceArray<float> gfraction(fraction.size());
  DeviceVector<double> gloss(std::vector<double>{0.25});
  ASSERT_TRUE(ops::MoeRouterLoss(ex.gpu, gloss.get(), gfraction.get(), gprobs.get(), glse.get(),
                                 gsel.get(), c.b, c.t, e, k, aux_coef, z_coef, scale)
                  .ok());
  EXPECT_NEAR(Down(gloss)[0], loss, 1e-6 * std::abs(loss)) << "aux + z loss";
  ExpectClose(gfraction.Download(), std::vector<float>(fraction.begin(), fraction.end()), 1e-6,
              "fraction");
  // Router backward.
  const auto dweight_in = RandomNormal(weight.size(), 41);
  const double aux_grad = scale * aux_coef * e / n, z_grad = scale * z_coef * 2.0 / n;
  std::vector<float> dlogits(probs.size());
  EXPECT_TRUE(ops::MoeRouteBackward(ex.cpu, dlogits.data(), gp.data(), gl.data(), gs.data(),
                                    gw.data(), dweight_in.data(), fraction.data(), c.b, c.t, e, k,
                                    c.norm, aux_grad, z_grad)
                  .ok());
  DeviceArray<float> gdweight_in(dweight_in);
  DeviceArray<T> gdlogits(dlogits.size());
  ASSERT_TRUE(ops::MoeRouteBackward(ex.gpu, gdlogits.get(), gprobs.get(), glse.get(), gsel.get(),
                                    gweight.get(), gdweight_in.get(), gfraction.get(), c.b, c.t, e,
                                    k, c.norm, aux_grad, z_grad)
                  .ok());
  ExpectClose(gdlogits.Download(), dlogits, stored, "dlogits");
  // Permute, combine and their backward on the plan.
  const auto x = Quantize<T>(RandomNormal(Sz(n, d), 51));
  const auto y = Quantize<T>(RandomNormal(Sz(rows, d), 52));
  const auto dout = Quantize<T>(RandomNormal(Sz(n, d), 53));
  const auto dxp = Quantize<T>(RandomNormal(Sz(rows, d), 54));
  const auto dx0 = Quantize<T>(RandomNormal(Sz(n, d), 55));
  std::vector<float> xp(y.size()), out(x.size()), dy(y.size()), dweight(weight.size()), dx = dx0;
  EXPECT_TRUE(ops::MoePermute(ex.cpu, xp.data(), x.data(), slots.data(), rows, k, d).ok());
  EXPECT_TRUE(
      ops::MoeCombine(ex.cpu, out.data(), y.data(), gw.data(), row_of_slot.data(), n, k, d).ok());
  EXPECT_TRUE(ops::MoeCombineBackward(ex.cpu, dy.data(), dweight.data(), dout.data(), y.data(),
                                      gw.data(), slots.data(), rows, k, d)
                  .ok());
  EXPECT_TRUE(
      ops::MoePermuteBackward(ex.cpu, dx.data(), dxp.data(), row_of_slot.data(), n, k, d).ok());
  DeviceArray<T> gx(x), gy(y), gdout(dout), gdxp(dxp), gdx(dx0), gxp(xp.size()),
      gout(out.size()), gdy(dy.size());
  DeviceArray<float> gdweight(dweight.size());
  ASSERT_TRUE(ops::MoePermute(ex.gpu, gxp.get(), gx.get(), gslots.get(), rows, k, d).ok());
  ASSERT_TRUE(
      ops::MoeCombine(ex.gpu, gout.get(), gy.get(), gweight.get(), ginv.get(), n, k, d).ok());
  ASSERT_TRUE(ops::MoeCombineBackward(ex.gpu, gdy.get(), gdweight.get(), gdout.get(), gy.get(),
                                      gweight.get(), gslots.get(), rows, k, d)
                  .ok());
  ASSERT_TRUE(ops::MoePermuteBackward(ex.gpu, gdx.get(), gdxp.get(), ginv.get(), n, k, d).ok());
  EXPECT_EQ(gxp.Download(), xp) << "permute";
  ExpectClose(gout.Download(), out, stored, "combine");
  ExpectClose(gdy.Download(), dy, stored, "combine backward dy");
  ExpectClose(gdweight.Download(), dweight, dot, "combine backward dweight");
  ExpectClose(gdx.Download(), dx, stored, "permute backward");
}

// A diverged run's NaN or Inf logits give a NaN loss (as on the CPU), not an illegal address:
// every choice stays a valid expert and every slot is dispatched.
void CheckNonFinite() {
  const int b = 2, t = 3, e = 8, k = 2, n = b * t;
  OpsTestExec ex(nullptr);
  auto logits = RandomNormal(Sz(n, e), 5);
  logits[1 * e + 3] = std::nanf("");
  logits[4 * e + 0] = INFINITY;
  DeviceArray<float> glogits(logits), gprobs(Sz(n, e)), glse(n), gweight(Sz(n, k)),
      gfraction(Sz(b, e));
  DeviceVector<int> gsel(std::vector<int>(n * k, -1)), gcounts(std::vector<int>(e, 0));
  DeviceVector<int> gslots(std::vector<int>(n * k, -1)), ginv(std::vector<int>(n * k, -1));
  DeviceVector<double> gloss(std::vector<double>{0.0});
  ASSERT_TRUE(ops::MoeRoute(ex.gpu, gprobs.get(), glse.get(), gsel.get(), gweight.get(),
                            glogits.get(), n, e, k, false)
                  .ok());
  ASSERT_TRUE(
      ops::MoePlan(ex.gpu, gcounts.get(), gslots.get(), ginv.get(), gsel.get(), n, e, k).ok());
  // Without a loss accumulator only the fraction is computed.
  ASSERT_TRUE(ops::MoeRouterLoss(ex.gpu, nullptr, gfraction.get(), gprobs.get(), glse.get(),
                                 gsel.get(), b, t, e, k, 0.01, 0.001, 1.0)
                  .ok());
  const std::vector<float> fraction = gfraction.Download();
  ASSERT_TRUE(ops::MoeRouterLoss(ex.gpu, gloss.get(), gfraction.get(), gprobs.get(), glse.get(),
                                 gsel.get(), b, t, e, k, 0.01, 0.001, 1.0)
                  .ok());
  const std::vector<int> sel = Down(gsel), counts = Down(gcounts);
  for (int s : sel) EXPECT_TRUE(s >= 0 && s < e) << s;
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), n * k);
  EXPECT_NEAR(std::accumulate(fraction.begin(), fraction.end(), 0.0), b, 1e-5);
  EXPECT_FALSE(std::isfinite(Down(gloss)[0]));
}

template <typename T>
void CheckCudaAgainstCpu() {
  for (const Case& c : {Case{1, 1, 4, 1, 8, false, false}, Case{2, 37, 8, 2, 24, true, true},
                        Case{3, 64, 64, 8, 40, false, true}, Case{2, 50, 256, 16, 16, true, false},
                        Case{1, 40, 5, 5, 8, true, true}, Case{4, 300, 33, 3, 64, false, false},
                        Case{1, 9, 6, 2, 513, false, false}, Case{2, 5, 4, 2, 200, true, false}}) {
    CheckCase<T>(c);
  }
  // Shapes beyond the kernels' limits: refused before launching.
  OpsTestExec ex(nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(ops::MoeRoute(ex.gpu, nullptr, nullptr, nullptr, nullptr,
                                                    nullptr, 4, kMoeMaxExperts + 1, 2, false)));
  EXPECT_TRUE(
      absl::IsInvalidArgument(ops::MoePlan(ex.gpu, nullptr, nullptr, nullptr, nullptr, 4, 4, 5)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ops::MoeCombine<T>(ex.gpu, nullptr, nullptr, nullptr, nullptr, 4, kMoeMaxTopK + 1, 8)));
  if (!kIsBf16<T>) CheckNonFinite();  // the router is fp32 in both
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(MoeOps, CheckCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
