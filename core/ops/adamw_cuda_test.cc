// AdamW on the GPU against the CPU reference. Skips without a CUDA build or without a GPU.
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/testing/gpu_test_util.h"
#include "core/exec.h"
#include "core/ops/adamw.h"
#include "core/ops/ops.h"
#include "gtest/gtest.h"

namespace satdar::core {
namespace {

TEST(AdamWCuda, MatchesCpu) {
  SATDAR_SKIP_WITHOUT_GPU();
#ifdef SATDAR_WITH_CUDA
  const int64_t n = 100003;
  std::vector<float> p(n), g(n), m(n, 0.f), v(n, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    g[i] = 0.001f * static_cast<float>((i * 31) % 101) - 0.05f;
  }
  std::vector<float> cp = p, cm = m, cv = v;
  AdamWParams hp;
  hp.lr = 1e-2;
  hp.grad_scale = 0.5;
  ThreadPool pool(2);
  const CpuExec on_cpu{&pool};
  const CudaExec on_gpu{};  // the legacy default stream
  float *dp, *dg, *dm, *dv;
  size_t bytes = n * sizeof(float);
  dp = static_cast<float*>(*cuda::Malloc(bytes, 0));
  dg = static_cast<float*>(*cuda::Malloc(bytes, 0));
  dm = static_cast<float*>(*cuda::Malloc(bytes, 0));
  dv = static_cast<float*>(*cuda::Malloc(bytes, 0));
  ASSERT_TRUE(cuda::CopyToDevice(dp, p.data(), bytes).ok());
  ASSERT_TRUE(cuda::CopyToDevice(dg, g.data(), bytes).ok());
  ASSERT_TRUE(cuda::CopyToDevice(dm, m.data(), bytes).ok());
  ASSERT_TRUE(cuda::CopyToDevice(dv, v.data(), bytes).ok());
  for (int step = 1; step <= 3; ++step) {
    hp.step = step;
    ASSERT_TRUE(ops::AdamWUpdate(on_cpu, cp.data(), g.data(), cm.data(), cv.data(), n, hp).ok());
    ASSERT_TRUE(ops::AdamWUpdate(on_gpu, dp, dg, dm, dv, n, hp).ok());
  }
  ASSERT_TRUE(cuda::Synchronize().ok());
  std::vector<float> out(n);
  ASSERT_TRUE(cuda::CopyToHost(out.data(), dp, bytes).ok());
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(out[i], cp[i], 1e-6f) << "element " << i;
  cuda::Free(dp);
  cuda::Free(dg);
  cuda::Free(dm);
  cuda::Free(dv);
#endif
}

}  // namespace
}  // namespace satdar::core
