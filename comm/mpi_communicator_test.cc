// The MPI communicator under mpirun (comm/BUILD.bazel: 3 ranks): the conformance checks
// every communicator passes, on real processes.
#include "comm/mpi_communicator.h"

#include "gtest/gtest.h"
#include "comm/communicator_conformance_testutil.h"

namespace satdar::comm {
namespace {

Communicator* g_world = nullptr;

// The shared closed-form checks (comm/communicator_conformance_testutil.h), including the
// bit-identical rank-order float sums, splits and a Recv that times out (MPI's message names
// only the waiting rank).
TEST(MpiCommunicator, Conformance) {
  Communicator* c = g_world;
  ASSERT_GE(c->size(), 2) << "run under mpirun with at least 2 ranks";
  ConformanceOptions o;
  o.timeout_names_peer = false;
  RunCommunicatorConformance(c, c->rank(), c->size(), o);
}

}  // namespace
}  // namespace satdar::comm

int main(int argc, char** argv) {
  auto world = satdar::comm::MpiWorld(&argc, &argv);
  if (!world.ok()) return 1;
  satdar::comm::g_world = world->get();
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  world->reset();
  satdar::comm::MpiFinalize();
  return rc;
}
