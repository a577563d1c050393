// The MPI communicator under mpirun (tests/BUILD: 3 ranks): the same closed forms as the
// in-process communicator's test, on real processes.
#include "parallel/mpi_communicator.h"

#include <vector>

#include "gtest/gtest.h"
#include "parallel/mesh.h"

namespace satdar::parallel {
namespace {

using core::DType;

Communicator* g_world = nullptr;

TEST(MpiCommunicator, Collectives) {
  Communicator* c = g_world;
  const int n = c->size(), r = c->rank();
  ASSERT_GE(n, 2) << "run under mpirun with at least 2 ranks";
  std::vector<double> sum = {static_cast<double>(r), 1.0};
  ASSERT_TRUE(c->AllReduce(sum.data(), 2, DType::kF64, ReduceOp::kSum, {})->Wait().ok());
  EXPECT_EQ(sum[0], n * (n - 1) / 2.0);
  EXPECT_EQ(sum[1], n);
  std::vector<int64_t> mx = {r * 10};
  ASSERT_TRUE(c->AllReduce(mx.data(), 1, DType::kI64, ReduceOp::kMax, {})->Wait().ok());
  EXPECT_EQ(mx[0], (n - 1) * 10);
  std::vector<int32_t> in(2 * n), out(2);
  for (int b = 0; b < n; ++b) in[2 * b] = in[2 * b + 1] = r + 100 * b;
  ASSERT_TRUE(c->ReduceScatter(in.data(), out.data(), 2, DType::kI32, ReduceOp::kSum, {})->Wait().ok());
  EXPECT_EQ(out[0], n * (n - 1) / 2 + 100 * r * n);
  std::vector<int32_t> mine = {r, -r}, all(2 * n);
  ASSERT_TRUE(c->AllGather(mine.data(), all.data(), 2, DType::kI32, {})->Wait().ok());
  for (int p = 0; p < n; ++p) EXPECT_EQ(all[2 * p + 1], -p);
  for (int root = 0; root < n; ++root) {
    double v = r == root ? 42.0 + root : -1.0;
    ASSERT_TRUE(c->Broadcast(&v, 1, DType::kF64, root, {})->Wait().ok());
    EXPECT_EQ(v, 42.0 + root);
  }
  std::vector<size_t> send(n), recv(n);
  std::vector<int32_t> a2a_in;
  for (int p = 0; p < n; ++p) {
    send[p] = p + 1;
    recv[p] = r + 1;
    for (int k = 0; k <= p; ++k) a2a_in.push_back(10 * r + p);
  }
  std::vector<int32_t> a2a_out(n * (r + 1));
  ASSERT_TRUE(c->AllToAllV(a2a_in.data(), send, a2a_out.data(), recv, DType::kI32, {})->Wait().ok());
  for (int p = 0; p < n; ++p) EXPECT_EQ(a2a_out[p * (r + 1)], 10 * p + r);
  // A ring of point-to-point messages.
  int64_t token = r, got = -1;
  auto s = c->Send(&token, 1, DType::kI64, (r + 1) % n, 5, {});
  auto q = c->Recv(&got, 1, DType::kI64, (r + n - 1) % n, 5, {});
  ASSERT_TRUE(q->Wait().ok());
  ASSERT_TRUE(s->Wait().ok());
  EXPECT_EQ(got, (r + n - 1) % n);
  ASSERT_TRUE(c->Barrier({})->Wait().ok());
}

TEST(MpiCommunicator, FloatSumIdenticalOnEveryRankAndSplit) {
  Communicator* c = g_world;
  const int n = c->size(), r = c->rank();
  float x = 0.1f * (r + 1) + 1e-7f * r;
  ASSERT_TRUE(c->AllReduce(&x, 1, DType::kF32, ReduceOp::kSum, {})->Wait().ok());
  std::vector<float> all(n);
  ASSERT_TRUE(c->AllGather(&x, all.data(), 1, DType::kF32, {})->Wait().ok());
  for (int p = 1; p < n; ++p) EXPECT_EQ(all[p], all[0]);  // bit-identical
  auto sub = c->Split(r % 2, r, {});
  ASSERT_TRUE(sub.ok()) << sub.status();
  int32_t v = r;
  ASSERT_TRUE((*sub)->AllReduce(&v, 1, DType::kI32, ReduceOp::kSum, {})->Wait().ok());
  int32_t expect = 0;
  for (int p = r % 2; p < n; p += 2) expect += p;
  EXPECT_EQ(v, expect);
  EXPECT_EQ((*sub)->rank(), r / 2);
}

}  // namespace
}  // namespace satdar::parallel

int main(int argc, char** argv) {
  auto world = satdar::parallel::MpiWorld(&argc, &argv);
  if (!world.ok()) return 1;
  satdar::parallel::g_world = world->get();
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  world->reset();
  satdar::parallel::MpiFinalize();
  return rc;
}
