// agent/rank_lease.h: a rank's own lease on its job's attempt, for ranks a worker starts.
//
//   SATDAR_ASSIGN_OR_RETURN(auto lease, RankLease::Start(options));   // first renewal
//   ... before each checkpoint and log line: SATDAR_RETURN_IF_ERROR(lease->MayWrite());
//
// The worker's heartbeat keeps its ranks' attempt alive at the coordinator; but a worker that
// is stopped (SIGSTOP, a frozen VM) or cut off cannot stop its ranks, and they would train on
// beside the retry the coordinator starts elsewhere. So each rank renews a lease of its own
// (RenewRankLease) every quarter lease. The coordinator answers FAILED_PRECONDITION once the
// attempt is fenced; the rank then stops at once (exit code 1). When no answer comes for a
// whole lease, the rank stops too. The coordinator starts no newer attempt before a lost
// rank's lease has run out, and MayWrite refuses once it has: a fenced attempt never writes a
// checkpoint or a log line.
#ifndef SATDAR_AGENT_RANK_LEASE_H_
#define SATDAR_AGENT_RANK_LEASE_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "agent/grpc_kv_store.h"

namespace satdar::agent {

struct RankLeaseOptions {
  CoordinatorStoreOptions coordinator;  // address, token, TLS, job id, attempt
  int rank = 0;
};

class RankLease {
 public:
  // Renews once (an attempt already fenced is Aborted: exit code 1, never bad input), then
  // keeps renewing on a thread of its own.
  static absl::StatusOr<std::unique_ptr<RankLease>> Start(const RankLeaseOptions& options);
  ~RankLease();
  RankLease(const RankLease&) = delete;
  RankLease& operator=(const RankLease&) = delete;

  // OK while the last renewal's lease lasts; Aborted once it has run out.
  absl::Status MayWrite() const;

 private:
  struct Impl;
  explicit RankLease(std::unique_ptr<Impl> impl);
  void Loop();
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace satdar::agent

#endif  // SATDAR_AGENT_RANK_LEASE_H_
