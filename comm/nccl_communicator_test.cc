// The NCCL communicator on the GPUs of this machine: the shared conformance checks on 2 ranks
// (threads, one GPU each) when there are 2 GPUs, else on 1 rank. Skips without an NCCL build
// or without a GPU.
#include "comm/nccl_communicator.h"

#include <unistd.h>

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
