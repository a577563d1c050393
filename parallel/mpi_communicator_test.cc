// The MPI communicator under mpirun (parallel/BUILD.bazel: 3 ranks): the conformance checks
// every communicator passes, on real processes.
#include "parallel/mpi_communicator.h"

#include "gtest/gtest.h"
#include "parallel/communicator_conformance_testutil.h"

namespace satdar::parallel {
namespace {

Communicator* g_world = nullptr;

// The shared closed-form checks (parallel/communicator_conformance_testutil.h), including the
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
