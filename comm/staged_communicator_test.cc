// The staged communicator: the shared conformance checks with its buffers in "device" memory
// of their own (host allocations reached only through the copier, so a call that read or
// wrote a buffer in place instead of staging it would be caught by the copy counts below), the
// copier's failures, and, on a GPU, two ranks sharing one GPU (tag gpu; skipped without one).
#include "comm/staged_communicator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/cuda/runtime.h"
#include "gtest/gtest.h"
#include "comm/communicator_conformance_testutil.h"
#include "comm/local_communicator.h"

namespace satdar::comm {
namespace {

using core::DType;

// Every rank's host communicator wrapped in a staged one.
std::vector<std::unique_ptr<Communicator>> StagedGroup(int n, const DeviceCopier& copier) {
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& c : MakeLocalCommunicators(n)) out.push_back(StageThroughHost(std::move(c), copier));
  return out;
}

ConformanceOptions SeparateMemory() {
  ConformanceOptions o;
  o.memory.alloc = [](size_t bytes) { return std::malloc(bytes == 0 ? 1 : bytes); };
  o.memory.free = [](void* p) { std::free(p); };
  o.memory.to_device = [](void* d, const void* h, size_t n) { std::memcpy(d, h, n); };
  o.memory.to_host = [](void* h, const void* d, size_t n) { std::memcpy(h, d, n); };
  return o;
}

TEST(StagedCommunicator, Conformance) {
  for (int n : {1, 2, 3, 4}) {
    auto comms = StagedGroup(n, HostCopier());
    OnRanks(comms, [&](int r, Communicator* c) { RunCommunicatorConformance(c, r, n, SeparateMemory()); });
  }
}

// Each call copies exactly its input out and its result back (bytes counted per direction).
TEST(StagedCommunicator, CopiesInputsOutAndResultsBack) {
  std::atomic<size_t> out{0}, back{0}, events{0};
  DeviceCopier counting = HostCopier();
  DeviceCopier inner = HostCopier();
  counting.to_host = [&](void* h, const void* d, size_t n) { out += n; return inner.to_host(h, d, n); };
  counting.to_device = [&](void* d, const void* h, size_t n) { back += n; return inner.to_device(d, h, n); };
  counting.wait_event = [&](void*) { ++events; return absl::OkStatus(); };
  auto comms = StagedGroup(2, counting);
  int event_stand_in = 0;
  OnRanks(comms, [&](int r, Communicator* c) {
    std::vector<float> x(10, static_cast<float>(r + 1));
    CollectiveOptions o;
    o.ready_event = &event_stand_in;
    ASSERT_TRUE(c->AllReduce(x.data(), x.size(), DType::kF32, ReduceOp::kSum, o)->Wait().ok());
    EXPECT_EQ(x[0], 3.0f);
    std::vector<float> gathered(20);
    ASSERT_TRUE(c->AllGather(x.data(), gathered.data(), 10, DType::kF32, {})->Wait().ok());
  });
  // Per rank: AllReduce 40 out and 40 back; AllGather 40 out and 80 back.
  EXPECT_EQ(out.load(), 2u * (40 + 40));
  EXPECT_EQ(back.load(), 2u * (40 + 80));
  EXPECT_EQ(events.load(), 2u);  // only the call that had a ready event waited
}

TEST(StagedCommunicator, CopyFailureIsTheCallsErrorNamingTheRank) {
  DeviceCopier broken = HostCopier();
  broken.to_host = [](void*, const void*, size_t) {
    return absl::InternalError("cudaMemcpy failed: an illegal memory access");
  };
  auto comms = StagedGroup(1, broken);
  float x = 1;
  absl::Status s = comms[0]->AllReduce(&x, 1, DType::kF32, ReduceOp::kSum, {})->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("rank 0: staging a device buffer: cudaMemcpy failed"),
            std::string::npos) << s;
  // Every later call fails at once with the first error: this rank skipped a collective, so
  // nothing after it may pair with its peers' operations.
  for (absl::Status later : {comms[0]->Barrier({})->Wait(),
                             comms[0]->Recv(&x, 1, DType::kF32, 0, 0, {})->Wait()}) {
    EXPECT_EQ(later, s);
  }
}

// Two ranks on one GPU (NCCL would refuse them): the conformance checks with CUDA memory.
TEST(StagedCommunicator, TwoRanksShareOneGpu) {
  if (core::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  ConformanceOptions o;
  o.memory = CudaMemory(0);
  auto comms = StagedGroup(2, CudaCopier());
  OnRanks(comms, [&](int r, Communicator* c) { RunCommunicatorConformance(c, r, 2, o); });
}

}  // namespace
}  // namespace satdar::comm
