// The in-process communicator (each rank a thread): the shared conformance checks, plus
// its own timeout messages and the mesh arithmetic.
#include "comm/local_communicator.h"

#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "comm/communicator_conformance_testutil.h"
#include "comm/mesh.h"

namespace satdar::comm {
namespace {

using core::DType;

// The shared closed-form checks (comm/communicator_conformance_testutil.h) on groups of
// 1 to 4 threads.
TEST(LocalCommunicator, Conformance) {
  for (int n : {1, 2, 3, 4}) {
    auto comms = MakeLocalCommunicators(n);
    OnRanks(comms, [&](int r, Communicator* c) { RunCommunicatorConformance(c, r, n); });
  }
}

TEST(LocalCommunicator, MissingPeerTimesOutNamingIt) {
  auto comms = MakeLocalCommunicators(3);
  CollectiveOptions fast;
  fast.timeout = absl::Milliseconds(200);
  // Rank 2 never joins.
  OnRanks(comms, [&](int r, Communicator* c) {
    if (r == 2) return;
    float x = 1;
    absl::Status s = c->AllReduce(&x, 1, DType::kF32, ReduceOp::kSum, fast)->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(s.message().find("ranks that never arrived: 2"), std::string::npos) << s;
  });
  int64_t v;
  absl::Status s = comms[1]->Recv(&v, 1, DType::kI64, 0, 3, fast)->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("Recv from rank 0 (tag 3) timed out"), std::string::npos) << s;
}

TEST(Mesh, CoordinatesAndValidation) {
  const MeshShape shape{2, 2, 2, 2};
  for (int r = 0; r < shape.size(); ++r) EXPECT_EQ(RankOf(shape, CoordOf(shape, r)), r);
  EXPECT_EQ(CoordOf(shape, 1).tp, 1);  // TP innermost
  EXPECT_EQ(CoordOf(shape, 8).dp, 1);  // DP outermost
  EXPECT_TRUE(ValidateMesh(shape, 16).ok());
  absl::Status s = ValidateMesh(shape, 12);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the world has 12 ranks but mesh dp x tp x pp x ep"),
            std::string::npos);
  EXPECT_FALSE(ValidateMesh({0, 1, 1, 1}, 0).ok());
  // Every group along an axis has the axis's size, and its keys are 0..size-1.
  for (const char* axis : {"dp", "tp", "pp", "ep"}) {
    std::map<int, std::vector<int>> groups;
    for (int r = 0; r < shape.size(); ++r) {
      SplitKey k = GroupAlong(shape, r, axis);
      groups[k.color].push_back(k.key);
    }
    EXPECT_EQ(groups.size(), 8u) << axis;
    for (auto& [color, keys] : groups) EXPECT_EQ(keys, (std::vector<int>{0, 1})) << axis;
  }
}

}  // namespace
}  // namespace satdar::comm
