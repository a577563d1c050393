// The NCCL communicator on the GPUs of this machine: the shared conformance checks on 2 ranks
// (threads, one GPU each) when there are 2 GPUs, else on 1 rank. Skips without an NCCL build
// or without a GPU.
#include "comm/nccl_communicator.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/runtime.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"
#include "comm/communicator_conformance_testutil.h"

namespace satdar::comm {
namespace {

ConformanceOptions DeviceOptions(int device) {
  ConformanceOptions o;
  o.rank_order_reductions = false;  // NCCL reduces in its ring/tree order
  o.tags_match = false;             // NCCL matches Send/Recv by order only
  o.timeout = absl::Seconds(2);
  o.memory = CudaMemory(device);
  return o;
}

TEST(NcclCommunicator, Conformance) {
  if (!NcclBuilt()) GTEST_SKIP() << "built without NCCL (no nccl.h / libnccl.so at build time)";
  const int gpus = core::cuda::DeviceCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const int n = gpus >= 2 ? 2 : 1;
  const std::string dir = core::testing::TestTmpDir(absl::StrCat("nccl_conformance_", ::getpid()));
  auto rank = [&](int r) {
    NcclOptions o;
    o.rank = r;
    o.world_size = n;
    o.device = r;
    o.store_dir = dir;
    o.timeout = absl::Seconds(60);
    auto world = NcclWorld(o);
    ASSERT_TRUE(world.ok()) << world.status();
    RunCommunicatorConformance(world->get(), r, n, DeviceOptions(r));
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rank, r);
  for (auto& t : threads) t.join();
}

// CollectiveOptions::enqueue_now: a Send that nothing else on its communicator follows still
// reaches its Recv (without it the Send waits for the next call, and the Recv times out).
TEST(NcclCommunicator, EnqueueNowStartsASendAtOnce) {
  if (!NcclBuilt()) GTEST_SKIP() << "built without NCCL (no nccl.h / libnccl.so at build time)";
  if (core::cuda::DeviceCount() < 2) GTEST_SKIP() << "needs 2 CUDA GPUs";
  const std::string dir = core::testing::TestTmpDir(absl::StrCat("nccl_enqueue_", ::getpid()));
  std::atomic<bool> received{false};
  auto rank = [&](int r) {
    NcclOptions o;
    o.rank = r;
    o.world_size = 2;
    o.device = r;
    o.store_dir = dir;
    o.timeout = absl::Seconds(60);
    auto world = NcclWorld(o);
    ASSERT_TRUE(world.ok()) << world.status();
    const ConformanceMemory mem = CudaMemory(r);
    const double value = 42 + r;
    void* buf = mem.alloc(sizeof(double));
    mem.to_device(buf, &value, sizeof(double));
    CollectiveOptions c;
    c.timeout = absl::Seconds(5);
    c.enqueue_now = true;
    if (r == 0) {
      auto sent = (*world)->Send(buf, 1, core::DType::kF64, 1, 0, c);
      // Nothing more from this rank until the receiver has its message.
      for (int i = 0; i < 1000 && !received; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_TRUE(received) << "the Send never started";
      EXPECT_TRUE(sent->Wait().ok());
    } else {
      const absl::Status s = (*world)->Recv(buf, 1, core::DType::kF64, 0, 0, c)->Wait();
      EXPECT_TRUE(s.ok()) << s;
      double got = 0;
      mem.to_host(&got, buf, sizeof(double));
      EXPECT_EQ(got, 42);
      received = true;
    }
    mem.free(buf);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back(rank, r);
  for (auto& t : threads) t.join();
}

TEST(NcclCommunicator, BadArguments) {
  NcclOptions o;
  o.rank = 2;
  o.world_size = 2;
  auto world = NcclWorld(o);
  ASSERT_FALSE(world.ok());
  if (!NcclBuilt()) {
    EXPECT_EQ(world.status().code(), absl::StatusCode::kFailedPrecondition) << world.status();
  } else {
    EXPECT_EQ(world.status().code(), absl::StatusCode::kInvalidArgument) << world.status();
    EXPECT_NE(world.status().message().find("rank 2 is not in 0..1"), std::string::npos);
  }
}

}  // namespace
}  // namespace satdar::comm
