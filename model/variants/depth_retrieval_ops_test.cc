// The depth retrieval ops of AttnRes and DAR (depth_retrieval_ops.h): the CPU side by f64
// central differences (queries w, norm weight g, keys, values; the single op with cross and
// shared sources, and the Dual op on three routes, every input of both streams), and the CUDA
// side against the CPU side, f32 and bf16 (tag gpu: skipped without a GPU), on the inputs the
// former CheckDepthRetrieval of layers_cuda_test used, plus the Dual ops on a cross route.
//
// Tolerances. CPU: GradError (max |analytic - numeric| / max |numeric|, h = 1e-6) < 1e-7.
// CUDA (gpu_test_util's ExpectClose: |gpu - cpu| <= rtol * max(|cpu|, rms(cpu))):
//   f32: 1e-5 everywhere (fp32 on both sides; only the order of additions differs).
//   bf16: the CPU runs in f32 on the same bf16-rounded inputs and initial values. Outputs
//   stored in bf16 (out, dkeys, dvalues, the Dual's dstreams) get 1e-2 (one bf16 rounding is
//   <= 2^-9 relative); fp32 outputs (alpha, dw, dg) get 1e-4.
#include "model/variants/depth_retrieval_ops.h"

#include <array>
#include <memory>
#include <string>
#include <vector>

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

constexpr int kRows = 5, kC = 7, kSources = 3;
constexpr double kEps = 1e-6;
constexpr double kGradTol = 1e-7;

// loss = <gout, out>. shared: AttnRes (keys == values, dkeys == dvalues, the backward's
// one-pass branch); otherwise keys and values are different arrays.
void CheckSingle(bool shared) {
  core::ThreadPool pool(2);
  const size_t nc = static_cast<size_t>(kRows) * kC;
  std::vector<Vec> k, v, dk(kSources, Vec(nc, 0.0)), dv(kSources, Vec(nc, 0.0));
  for (int i = 0; i < kSources; ++i) {
    k.push_back(RandomVector(nc, 1 + i));
    v.push_back(RandomVector(nc, 11 + i));
  }
  Vec w = RandomVector(kC, 21, 0.5), g = RandomVector(kC, 22, 0.5, 1.0);
  const Vec gout = RandomVector(nc, 23);
  Vec out(nc), alpha(static_cast<size_t>(kRows) * kSources);
  std::vector<const double*> kp(kSources), vp(kSources);
  std::vector<double*> dkp(kSources), dvp(kSources);
  for (int i = 0; i < kSources; ++i) {
    kp[i] = k[i].data();
    vp[i] = shared ? kp[i] : v[i].data();
    dkp[i] = dk[i].data();
    dvp[i] = shared ? dkp[i] : dv[i].data();
  }
  auto loss = [&] {
    cpu::DepthRetrievalForward(out.data(), alpha.data(), kp.data(), vp.data(), kSources,
                               w.data(), g.data(), kRows, kC, kEps, &pool);
    return Dot(gout, out);
  };
  loss();
  Vec dw(kC, 0.0), dg(kC, 0.0);
  cpu::DepthRetrievalBackward(dkp.data(), dvp.data(), dw.data(), dg.data(), gout.data(),
                              alpha.data(), kp.data(), vp.data(), kSources, w.data(), g.data(),
                              kRows, kC, kEps, &pool);
  const std::string tag = shared ? " (shared)" : " (cross)";
  for (int i = 0; i < kSources; ++i) {
    EXPECT_LT(GradError(&k[i], dk[i], loss), kGradTol) << "keys " << i << tag;
    if (!shared) {
      EXPECT_LT(GradError(&v[i], dv[i], loss), kGradTol) << "values " << i << tag;
    }
  }
  EXPECT_LT(GradError(&w, dw, loss), kGradTol) << "w" << tag;
  EXPECT_LT(GradError(&g, dg, loss), kGradTol) << "g" << tag;
}

TEST(DepthRetrievalOps, GradientsMatchFiniteDifferences) {
  CheckSingle(false);
  CheckSingle(true);
}

// A null gradient entry is skipped; the others, dw and dg are those of the full backward.
TEST(DepthRetrievalOps, NullGradientEntriesAreSkipped) {
  core::ThreadPool pool(2);
  const size_t nc = static_cast<size_t>(kRows) * kC;
  std::vector<Vec> k, v;
  for (int i = 0; i < kSources; ++i) {
    k.push_back(RandomVector(nc, 31 + i));
    v.push_back(RandomVector(nc, 41 + i));
  }
  const Vec w = RandomVector(kC, 51, 0.5), g = RandomVector(kC, 52, 0.5, 1.0);
  const Vec dout = RandomVector(nc, 53);
  Vec out(nc), alpha(static_cast<size_t>(kRows) * kSources);
  std::vector<const double*> kp, vp;
  for (int i = 0; i < kSources; ++i) {
    kp.push_back(k[i].data());
    vp.push_back(v[i].data());
  }
  cpu::DepthRetrievalForward(out.data(), alpha.data(), kp.data(), vp.data(), kSources, w.data(),
                             g.data(), kRows, kC, kEps, &pool);
  std::array<std::vector<Vec>, 2> dk, dv;
  std::array<Vec, 2> dw, dg;
  for (int run = 0; run < 2; ++run) {
    dk[run].assign(kSources, Vec(nc, 0.0));
    dv[run].assign(kSources, Vec(nc, 0.0));
    dw[run].assign(kC, 0.0);
    dg[run].assign(kC, 0.0);
    std::vector<double*> dkp, dvp;
    for (int i = 0; i < kSources; ++i) {
      dkp.push_back(run == 1 && i == 1 ? nullptr : dk[run][i].data());
      dvp.push_back(run == 1 && i == 2 ? nullptr : dv[run][i].data());
    }
    cpu::DepthRetrievalBackward(dkp.data(), dvp.data(), dw[run].data(), dg[run].data(),
                                dout.data(), alpha.data(), kp.data(), vp.data(), kSources,
                                w.data(), g.data(), kRows, kC, kEps, &pool);
  }
  for (int i = 0; i < kSources; ++i) {
    EXPECT_EQ(dk[1][i], i == 1 ? Vec(nc, 0.0) : dk[0][i]) << i;
    EXPECT_EQ(dv[1][i], i == 2 ? Vec(nc, 0.0) : dv[0][i]) << i;
  }
  EXPECT_EQ(dw[1], dw[0]);
  EXPECT_EQ(dg[1], dg[0]);
}

// loss = <gout_0, out_0> + <gout_1, out_1> over the Dual op on `route` ({key, value} stream of
// each target); every source of both streams, both queries and the shared norm weight. The
// outputs also equal two single retrievals (to rounding: the Dual reassociates w*g).
void CheckDual(const std::array<std::array<int, 2>, 2>& route) {
  core::ThreadPool pool(3);
  const size_t nc = static_cast<size_t>(kRows) * kC, ns = static_cast<size_t>(kRows) * kSources;
  std::array<std::vector<Vec>, 2> x, dx;
  std::array<std::vector<const double*>, 2> xp;
  std::array<std::vector<double*>, 2> dxp;
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < kSources; ++i) {
      x[t].push_back(RandomVector(nc, 100 + 10 * t + i));
      dx[t].push_back(Vec(nc, 0.0));
    }
    for (int i = 0; i < kSources; ++i) {
      xp[t].push_back(x[t][i].data());
      dxp[t].push_back(dx[t][i].data());
    }
  }
  std::array<Vec, 2> w = {RandomVector(kC, 131, 0.5), RandomVector(kC, 132, 0.5)};
  Vec g = RandomVector(kC, 133, 0.5, 1.0);
  const std::array<Vec, 2> gout = {RandomVector(nc, 134), RandomVector(nc, 135)};
  std::array<Vec, 2> out = {Vec(nc), Vec(nc)}, alpha = {Vec(ns), Vec(ns)};
  DualRetrieval<double> r;
  r.streams[0] = xp[0].data();
  r.streams[1] = xp[1].data();
  r.sources = kSources;
  for (int s = 0; s < 2; ++s) {
    r.key[s] = route[s][0];
    r.value[s] = route[s][1];
    r.w[s] = w[s].data();
  }
  r.g = g.data();
  double* const outp[2] = {out[0].data(), out[1].data()};
  double* const alphap[2] = {alpha[0].data(), alpha[1].data()};
  auto loss = [&] {
    cpu::DualDepthRetrievalForward(outp, alphap, r, kRows, kC, kEps, &pool);
    return Dot(gout[0], out[0]) + Dot(gout[1], out[1]);
  };
  loss();
  const std::string tag =
      " (route " + std::to_string(route[0][0]) + std::to_string(route[0][1]) + " " +
      std::to_string(route[1][0]) + std::to_string(route[1][1]) + ")";
  for (int s = 0; s < 2; ++s) {
    Vec single(nc), single_alpha(ns);
    cpu::DepthRetrievalForward(single.data(), single_alpha.data(), xp[route[s][0]].data(),
                               xp[route[s][1]].data(), kSources, w[s].data(), g.data(), kRows,
                               kC, kEps, &pool);
    for (size_t e = 0; e < nc; ++e) EXPECT_NEAR(out[s][e], single[e], 1e-12) << s << tag;
    for (size_t e = 0; e < ns; ++e) EXPECT_NEAR(alpha[s][e], single_alpha[e], 1e-12) << s << tag;
  }
  std::array<Vec, 2> dw = {Vec(kC, 0.0), Vec(kC, 0.0)};
  Vec dg(kC, 0.0);
  double* const* const dstreams[2] = {dxp[0].data(), dxp[1].data()};
  double* const dwp[2] = {dw[0].data(), dw[1].data()};
  const double* const doutp[2] = {gout[0].data(), gout[1].data()};
  const double* const calpha[2] = {alpha[0].data(), alpha[1].data()};
  cpu::DualDepthRetrievalBackward(dstreams, dwp, dg.data(), doutp, calpha, r, kRows, kC, kEps,
                                  &pool);
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < kSources; ++i) {
      EXPECT_LT(GradError(&x[t][i], dx[t][i], loss), kGradTol)
          << "stream " << t << " source " << i << tag;
    }
    EXPECT_LT(GradError(&w[t], dw[t], loss), kGradTol) << "w " << t << tag;
  }
  EXPECT_LT(GradError(&g, dg, loss), kGradTol) << "g" << tag;
}

// DAR's routes: each stream its own keys and values; keys crossed; both targets keyed on
// stream 0 and valued from stream 1 (stream 1 is never a key, stream 0 never a value).
TEST(DepthRetrievalOps, DualGradientsMatchFiniteDifferences) {
  CheckDual({{{0, 0}, {1, 1}}});
  CheckDual({{{1, 0}, {0, 1}}});
  CheckDual({{{0, 1}, {0, 1}}});
}

#ifdef SATDAR_WITH_CUDA

using core::gpu_test::DeviceArray;
using core::gpu_test::DeviceVector;
using core::gpu_test::ExpectClose;
using core::gpu_test::kIsBf16;
using core::gpu_test::Quantize;
using core::gpu_test::RandomNormal;

template <typename T>
double Tol(double bf16_tol) {
  return kIsBf16<T> ? bf16_tol : 1e-5;
}

// same_sources: AttnRes (keys == values, dkeys == dvalues); otherwise DAR's cross-stream form
// (keys and values from different arrays) with one key gradient skipped (null). Gradients
// accumulate into nonzero initial values.
template <typename T>
void CheckSingleCuda(bool same_sources) {
  const int s = 5, n = 19, c = 48;
  const double eps = 1e-6;
  const size_t nc = static_cast<size_t>(n) * c;
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  std::vector<std::vector<float>> k(s), v(s), dk0(s), dv0(s);
  for (int i = 0; i < s; ++i) {
    k[i] = Quantize<T>(RandomNormal(nc, 100 + i));
    v[i] = same_sources ? k[i] : Quantize<T>(RandomNormal(nc, 200 + i));
    dk0[i] = Quantize<T>(RandomNormal(nc, 300 + i, 0.1f));
    dv0[i] = same_sources ? dk0[i] : Quantize<T>(RandomNormal(nc, 400 + i, 0.1f));
  }
  const auto w = Quantize<T>(RandomNormal(c, 61, 0.5f));
  const auto g = Quantize<T>(RandomNormal(c, 62, 0.5f));
  const auto dout = Quantize<T>(RandomNormal(nc, 63));
  const auto dw0 = RandomNormal(c, 64, 0.1f), dg0 = RandomNormal(c, 65, 0.1f);
  const int skipped = same_sources ? -1 : 2;  // this source's key gradient is not wanted
  // CPU.
  std::vector<std::vector<float>> dk = dk0, dv = dv0;
  std::vector<const float*> kp(s), vp(s);
  std::vector<float*> dkp(s), dvp(s);
  for (int i = 0; i < s; ++i) {
    kp[i] = k[i].data();
    vp[i] = same_sources ? kp[i] : v[i].data();
    dkp[i] = i == skipped ? nullptr : dk[i].data();
    dvp[i] = same_sources ? dkp[i] : dv[i].data();
  }
  std::vector<float> out(nc), alpha(static_cast<size_t>(n) * s), dw = dw0, dg = dg0;
  EXPECT_TRUE(ops::DepthRetrievalForward(ex.cpu, out.data(), alpha.data(), kp.data(), vp.data(), s,
                                         w.data(), g.data(), n, c, eps)
                  .ok());
  EXPECT_TRUE(ops::DepthRetrievalBackward(ex.cpu, dkp.data(), dvp.data(), dw.data(), dg.data(),
                                          dout.data(), alpha.data(), kp.data(), vp.data(), s,
                                          w.data(), g.data(), n, c, eps)
                  .ok());
  // GPU.
  std::vector<std::unique_ptr<DeviceArray<T>>> gk, gv, gdk, gdv;
  std::vector<const T*> gkp(s), gvp(s);
  std::vector<T*> gdkp(s), gdvp(s);
  for (int i = 0; i < s; ++i) {
    gk.push_back(std::make_unique<DeviceArray<T>>(k[i]));
    gdk.push_back(std::make_unique<DeviceArray<T>>(dk0[i]));
    if (!same_sources) {
      gv.push_back(std::make_unique<DeviceArray<T>>(v[i]));
      gdv.push_back(std::make_unique<DeviceArray<T>>(dv0[i]));
    }
    gkp[i] = gk[i]->get();
    gvp[i] = same_sources ? gkp[i] : gv[i]->get();
    gdkp[i] = i == skipped ? nullptr : gdk[i]->get();
    gdvp[i] = same_sources ? gdkp[i] : gdv[i]->get();
  }
  DeviceVector<const T*> dkeys(gkp), dvalues(gvp);
  DeviceVector<T*> ddkeys(gdkp), ddvalues(gdvp);
  DeviceArray<T> gw(w), gg(g), gdout(dout), gout(nc);
  DeviceArray<float> galpha(alpha.size()), gdw(dw0), gdg(dg0);
  ASSERT_TRUE(ops::DepthRetrievalForward(ex.gpu, gout.get(), galpha.get(), dkeys.get(),
                                         dvalues.get(), s, gw.get(), gg.get(), n, c,
                                         static_cast<float>(eps))
                  .ok());
  ASSERT_TRUE(ops::DepthRetrievalBackward(ex.gpu, ddkeys.get(), ddvalues.get(), gdw.get(),
                                          gdg.get(), gdout.get(), galpha.get(), dkeys.get(),
                                          dvalues.get(), s, gw.get(), gg.get(), n, c,
                                          static_cast<float>(eps))
                  .ok());
  const std::string tag = same_sources ? " (same sources)" : " (cross sources)";
  ExpectClose(gout.Download(), out, Tol<T>(1e-2), "retrieval out" + tag);
  ExpectClose(galpha.Download(), alpha, Tol<T>(1e-4), "retrieval alpha" + tag);
  for (int i = 0; i < s; ++i) {
    const std::string src = " of source " + std::to_string(i) + tag;
    ExpectClose(gdk[i]->Download(), dk[i], Tol<T>(1e-2), "retrieval dkeys" + src);
    if (!same_sources) {
      ExpectClose(gdv[i]->Download(), dv[i], Tol<T>(1e-2), "retrieval dvalues" + src);
    }
  }
  ExpectClose(gdw.Download(), dw, Tol<T>(1e-4), "retrieval dw" + tag);
  ExpectClose(gdg.Download(), dg, Tol<T>(1e-4), "retrieval dg" + tag);
}

// The Dual ops (CUDA: two single calls; CPU: one pass) on DAR's crossed keys, every gradient
// of both streams accumulated into nonzero initial values.
template <typename T>
void CheckDualCuda() {
  const int s = 4, n = 19, c = 48;
  const double eps = 1e-6;
  const size_t nc = static_cast<size_t>(n) * c, ns = static_cast<size_t>(n) * s;
  const int key[2] = {1, 0}, value[2] = {0, 1};
  core::ThreadPool pool(2);
  OpsTestExec ex(&pool);
  std::vector<std::vector<float>> xs[2], dxs0[2];
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < s; ++i) {
      xs[t].push_back(Quantize<T>(RandomNormal(nc, 500 + 10 * t + i)));
      dxs0[t].push_back(Quantize<T>(RandomNormal(nc, 600 + 10 * t + i, 0.1f)));
    }
  }
  std::vector<float> w[2] = {Quantize<T>(RandomNormal(c, 71, 0.5f)),
                             Quantize<T>(RandomNormal(c, 72, 0.5f))};
  const auto g = Quantize<T>(RandomNormal(c, 73, 0.5f));
  std::vector<float> dout[2] = {Quantize<T>(RandomNormal(nc, 74)),
                                Quantize<T>(RandomNormal(nc, 75))};
  std::vector<float> dw0[2] = {RandomNormal(c, 76, 0.1f), RandomNormal(c, 77, 0.1f)};
  const auto dg0 = RandomNormal(c, 78, 0.1f);
  // CPU.
  std::vector<std::vector<float>> dxs[2] = {dxs0[0], dxs0[1]};
  std::vector<const float*> hx[2];
  std::vector<float*> hdx[2];
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < s; ++i) {
      hx[t].push_back(xs[t][i].data());
      hdx[t].push_back(dxs[t][i].data());
    }
  }
  std::vector<float> out[2] = {std::vector<float>(nc), std::vector<float>(nc)};
  std::vector<float> alpha[2] = {std::vector<float>(ns), std::vector<float>(ns)};
  std::vector<float> dw[2] = {dw0[0], dw0[1]}, dg = dg0;
  DualRetrieval<float> hr;
  hr.sources = s;
  hr.g = g.data();
  for (int t = 0; t < 2; ++t) {
    hr.streams[t] = hx[t].data();
    hr.key[t] = key[t];
    hr.value[t] = value[t];
    hr.w[t] = w[t].data();
  }
  {
    float* const o[2] = {out[0].data(), out[1].data()};
    float* const a[2] = {alpha[0].data(), alpha[1].data()};
    float* const* const ds[2] = {hdx[0].data(), hdx[1].data()};
    float* const pdw[2] = {dw[0].data(), dw[1].data()};
    const float* const pd[2] = {dout[0].data(), dout[1].data()};
    const float* const pa[2] = {alpha[0].data(), alpha[1].data()};
    EXPECT_TRUE(ops::DualDepthRetrievalForward(ex.cpu, o, a, hr, n, c, eps).ok());
    EXPECT_TRUE(
        ops::DualDepthRetrievalBackward(ex.cpu, ds, pdw, dg.data(), pd, pa, hr, n, c, eps).ok());
  }
  // GPU.
  std::vector<std::unique_ptr<DeviceArray<T>>> gx[2], gdx[2];
  std::vector<const T*> px[2];
  std::vector<T*> pdx[2];
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < s; ++i) {
      gx[t].push_back(std::make_unique<DeviceArray<T>>(xs[t][i]));
      gdx[t].push_back(std::make_unique<DeviceArray<T>>(dxs0[t][i]));
      px[t].push_back(gx[t].back()->get());
      pdx[t].push_back(gdx[t].back()->get());
    }
  }
  DeviceVector<const T*> lx0(px[0]), lx1(px[1]);
  DeviceVector<T*> ldx0(pdx[0]), ldx1(pdx[1]);
  DeviceArray<T> gw0(w[0]), gw1(w[1]), gg(g), gdout0(dout[0]), gdout1(dout[1]), gout0(nc),
      gout1(nc);
  DeviceArray<float> galpha0(ns), galpha1(ns), gdw0(dw0[0]), gdw1(dw0[1]), gdg(dg0);
  DualRetrieval<T> dr;
  dr.streams[0] = lx0.get();
  dr.streams[1] = lx1.get();
  dr.sources = s;
  dr.w[0] = gw0.get();
  dr.w[1] = gw1.get();
  dr.g = gg.get();
  for (int t = 0; t < 2; ++t) {
    dr.key[t] = key[t];
    dr.value[t] = value[t];
  }
  T* const o[2] = {gout0.get(), gout1.get()};
  float* const a[2] = {galpha0.get(), galpha1.get()};
  T* const* const ds[2] = {ldx0.get(), ldx1.get()};
  float* const pdw[2] = {gdw0.get(), gdw1.get()};
  const T* const pd[2] = {gdout0.get(), gdout1.get()};
  const float* const pa[2] = {galpha0.get(), galpha1.get()};
  const float feps = static_cast<float>(eps);
  ASSERT_TRUE(ops::DualDepthRetrievalForward(ex.gpu, o, a, dr, n, c, feps).ok());
  ASSERT_TRUE(
      ops::DualDepthRetrievalBackward(ex.gpu, ds, pdw, gdg.get(), pd, pa, dr, n, c, feps).ok());
  ExpectClose(gout0.Download(), out[0], Tol<T>(1e-2), "dual out 0");
  ExpectClose(gout1.Download(), out[1], Tol<T>(1e-2), "dual out 1");
  ExpectClose(galpha0.Download(), alpha[0], Tol<T>(1e-4), "dual alpha 0");
  ExpectClose(galpha1.Download(), alpha[1], Tol<T>(1e-4), "dual alpha 1");
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < s; ++i) {
      ExpectClose(gdx[t][i]->Download(), dxs[t][i], Tol<T>(1e-2),
                  "dual dstream " + std::to_string(t) + " source " + std::to_string(i));
    }
  }
  ExpectClose(gdw0.Download(), dw[0], Tol<T>(1e-4), "dual dw 0");
  ExpectClose(gdw1.Download(), dw[1], Tol<T>(1e-4), "dual dw 1");
  ExpectClose(gdg.Download(), dg, Tol<T>(1e-4), "dual dg");
}

template <typename T>
void CheckCudaAgainstCpu() {
  CheckSingleCuda<T>(false);
  CheckSingleCuda<T>(true);
  CheckDualCuda<T>();
}

#endif  // SATDAR_WITH_CUDA

SATDAR_CUDA_MATCHES_CPU_TESTS(DepthRetrievalOps, CheckCudaAgainstCpu)

}  // namespace
}  // namespace satdar::model
