// comm/gloo_communicator.h: the Communicator over Gloo's TCP transport, for CPU ranks that
// are started by anything (a shell loop, a scheduler, fork) rather than mpirun. The ranks meet
// through a KvStore (by default a FileKvStore in a directory all of them can reach): each one
// publishes the address it listens on and connects to every other rank.
//
//   GlooOptions o;
//   o.rank = 1;
//   o.world_size = 4;
//   o.store_dir = "/shared/job42";              // fresh for every launch
//   SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, GlooWorld(o));
//
// Or, with the options taken from the environment (see GlooOptionsFromEnv):
//   for r in 0 1 2; do
//     SATDAR_RANK=$r SATDAR_WORLD_SIZE=3 SATDAR_RENDEZVOUS_DIR=/tmp/job ./program &
//   done; wait
//
// Semantics are those of MpiCommunicator: every call posts its transfers at once (Gloo's
// device thread moves the bytes) and returns a Work; Wait() waits for them up to the
// operation's timeout. Every collective is a direct exchange between all pairs of ranks, so a
// rank knows exactly which peers did not deliver: a timeout is DeadlineExceeded naming the
// ranks that never arrived, a peer that died is Unavailable naming it. Reductions gather every
// contribution and add them in rank order, so every rank gets bit-identical results, equal to
// LocalCommunicator's and MpiCommunicator's.
//
// After any failed operation the communicator is broken (Gloo cannot cancel a posted
// transfer): later calls fail at once with FailedPrecondition quoting the first error; make a
// new world. A Work destroyed before Wait() waits first (its buffers are still in use).
// REQUIRES: one thread at a time issues and waits; buffers stay untouched until Wait().
// Mismatched counts between a sender and a receiver are a programmer error (Gloo aborts).
// GlooWorld ignores SIGPIPE in the process (if it had the default action): a write to a dead
// peer's socket must be an error, not the end of the survivors.
#ifndef SATDAR_COMM_GLOO_COMMUNICATOR_H_
#define SATDAR_COMM_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/kv_store.h"

namespace satdar::comm {

struct GlooOptions {
  int rank = -1;       // 0 <= rank < world_size
  int world_size = 0;  // >= 1
  // Directory of the FileKvStore the ranks meet in (created if missing). Ignored when `store`
  // is set.
  std::string store_dir;
  std::shared_ptr<KvStore> store;  // any other store shared by the ranks
  // Namespace of this job's keys inside the store; two jobs may share a store with different
  // prefixes.
  std::string prefix;
  // Where this rank listens: a network interface name ("eth0"; wins when set) or a hostname or
  // address ("127.0.0.1": loopback, for ranks on one machine).
  std::string interface;
  std::string hostname = "127.0.0.1";
  // How long to wait for the other ranks to arrive and connect (also used by Split).
  absl::Duration timeout = absl::Seconds(300);
};

// Joins the world: publishes this rank's address, waits for every other rank and connects to
// them. InvalidArgument for a bad rank, world size, interface or hostname; Unavailable when the
// store cannot be reached or a peer cannot be connected to; DeadlineExceeded naming the ranks
// that did not arrive within options.timeout.
absl::StatusOr<std::unique_ptr<Communicator>> GlooWorld(const GlooOptions& options);

// Options from the environment: SATDAR_RANK, SATDAR_WORLD_SIZE, SATDAR_RENDEZVOUS_DIR
// (required), SATDAR_RENDEZVOUS_PREFIX, SATDAR_GLOO_IFACE, SATDAR_GLOO_HOST and
// SATDAR_TIMEOUT_S (optional). InvalidArgument naming the variable that is missing or bad.
absl::StatusOr<GlooOptions> GlooOptionsFromEnv();

}  // namespace satdar::comm

#endif  // SATDAR_COMM_GLOO_COMMUNICATOR_H_
