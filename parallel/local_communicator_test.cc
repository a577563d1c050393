// Closed-form checks of every collective on the in-process communicator (each rank a thread),
// in the style of c10d's and nccl-tests' tests, plus ordering, splitting and timeouts.
#include "parallel/local_communicator.h"

#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "parallel/mesh.h"

namespace satdar::parallel {
namespace {

using core::DType;

// Runs body(rank, comm) on one thread per rank and joins them.
void OnRanks(std::vector<std::unique_ptr<Communicator>>& comms,
             const std::function<void(int, Communicator*)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { body(static_cast<int>(r), comms[r].get()); });
  }
  for (auto& t : threads) t.join();
}

TEST(LocalCommunicator, AllReduceClosedForms) {
  for (int n : {1, 2, 3, 4}) {
    auto comms = MakeLocalCommunicators(n);
    OnRanks(comms, [&](int r, Communicator* c) {
      EXPECT_EQ(c->rank(), r);
      EXPECT_EQ(c->size(), n);
      std::vector<double> sum = {static_cast<double>(r), 1.0};
      ASSERT_TRUE(c->AllReduce(sum.data(), 2, DType::kF64, ReduceOp::kSum, {})->Wait().ok());
      EXPECT_EQ(sum[0], n * (n - 1) / 2.0);
      EXPECT_EQ(sum[1], n);
      std::vector<int64_t> mx = {r * 10};
      ASSERT_TRUE(c->AllReduce(mx.data(), 1, DType::kI64, ReduceOp::kMax, {})->Wait().ok());
      EXPECT_EQ(mx[0], (n - 1) * 10);
      std::vector<float> avg = {static_cast<float>(r)};
      ASSERT_TRUE(c->AllReduce(avg.data(), 1, DType::kF32, ReduceOp::kAvg, {})->Wait().ok());
      EXPECT_FLOAT_EQ(avg[0], (n - 1) / 2.0f);
    });
  }
}

TEST(LocalCommunicator, FloatSumsAreIdenticalOnEveryRank) {
  const int n = 4;
  auto comms = MakeLocalCommunicators(n);
  std::vector<float> results(n);
  OnRanks(comms, [&](int r, Communicator* c) {
    std::vector<float> x = {0.1f * (r + 1) + 1e-7f * r};
    ASSERT_TRUE(c->AllReduce(x.data(), 1, DType::kF32, ReduceOp::kSum, {})->Wait().ok());
    results[r] = x[0];
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]);
}

TEST(LocalCommunicator, ReduceScatterAllGatherBroadcast) {
  const int n = 3;
  auto comms = MakeLocalCommunicators(n);
  OnRanks(comms, [&](int r, Communicator* c) {
    // Block b of rank r holds r + 100 b; rank r receives sum_p (p + 100 r).
    std::vector<int32_t> in(2 * n), out(2);
    for (int b = 0; b < n; ++b) in[2 * b] = in[2 * b + 1] = r + 100 * b;
    ASSERT_TRUE(c->ReduceScatter(in.data(), out.data(), 2, DType::kI32, ReduceOp::kSum, {})->Wait().ok());
    EXPECT_EQ(out[0], 3 + 300 * r);
    std::vector<int32_t> mine = {r, -r}, all(2 * n);
    ASSERT_TRUE(c->AllGather(mine.data(), all.data(), 2, DType::kI32, {})->Wait().ok());
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(all[2 * p], p);
      EXPECT_EQ(all[2 * p + 1], -p);
    }
    for (int root = 0; root < n; ++root) {
      std::vector<double> v = {r == root ? 42.0 + root : -1.0};
      ASSERT_TRUE(c->Broadcast(v.data(), 1, DType::kF64, root, {})->Wait().ok());
      EXPECT_EQ(v[0], 42.0 + root);
    }
  });
}

TEST(LocalCommunicator, AllToAllVWithUnevenCounts) {
  const int n = 3;
  auto comms = MakeLocalCommunicators(n);
  OnRanks(comms, [&](int r, Communicator* c) {
    // Rank r sends p + 1 copies of (10 r + p) to rank p.
    std::vector<size_t> send(n), recv(n);
    std::vector<int32_t> in;
    for (int p = 0; p < n; ++p) {
      send[p] = p + 1;
      recv[p] = r + 1;
      for (int k = 0; k <= p; ++k) in.push_back(10 * r + p);
    }
    std::vector<int32_t> out(n * (r + 1));
    ASSERT_TRUE(c->AllToAllV(in.data(), send, out.data(), recv, DType::kI32, {})->Wait().ok());
    for (int p = 0; p < n; ++p) {
      for (int k = 0; k <= r; ++k) EXPECT_EQ(out[p * (r + 1) + k], 10 * p + r);
    }
  });
}

TEST(LocalCommunicator, SendRecvInOrderAndAsync) {
  auto comms = MakeLocalCommunicators(2);
  OnRanks(comms, [&](int r, Communicator* c) {
    if (r == 0) {
      for (int i = 0; i < 5; ++i) {
        int64_t v = i;
        ASSERT_TRUE(c->Send(&v, 1, DType::kI64, 1, 7, {})->Wait().ok());
      }
    } else {
      std::vector<int64_t> got(5);
      std::vector<std::unique_ptr<Work>> works;
      for (int i = 0; i < 5; ++i) works.push_back(c->Recv(&got[i], 1, DType::kI64, 0, 7, {}));
      for (auto& w : works) ASSERT_TRUE(w->Wait().ok());
      for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i], i);
    }
    ASSERT_TRUE(c->Barrier({})->Wait().ok());
  });
}

TEST(LocalCommunicator, SplitIntoMeshGroups) {
  const MeshShape shape{2, 2, 1, 1};  // dp=2 x tp=2
  auto comms = MakeLocalCommunicators(shape.size());
  OnRanks(comms, [&](int r, Communicator* c) {
    SplitKey tp = GroupAlong(shape, r, "tp");
    auto sub = c->Split(tp.color, tp.key, {});
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_EQ((*sub)->size(), 2);
    EXPECT_EQ((*sub)->rank(), CoordOf(shape, r).tp);
    std::vector<int32_t> v = {r};
    ASSERT_TRUE((*sub)->AllReduce(v.data(), 1, DType::kI32, ReduceOp::kSum, {})->Wait().ok());
    const int dp = CoordOf(shape, r).dp;  // TP groups are {0, 1} and {2, 3}
    EXPECT_EQ(v[0], dp == 0 ? 1 : 5);
  });
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
  EXPECT_NE(s.message().find("the world has 12 ranks but --dp x --tp x --pp x --ep"),
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
}  // namespace satdar::parallel
