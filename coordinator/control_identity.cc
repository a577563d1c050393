// ControlState: who a worker call comes from (its session) and what was assigned to it. A
// holder of the worker token alone can register a worker of its own, nothing more: it cannot
// speak for another worker, nor touch a job none of whose ranks it runs.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/control_state.h"
#include "core/check.h"
#include "proto/rpc.h"

namespace satdar::coordinator {

namespace v1 = satdar::v1;

absl::StatusOr<std::string> ControlState::Caller(const std::string& session) const {
  if (session.empty()) {
    return absl::PermissionDeniedError(
        "this call carries no worker session (satdar-worker-session, from RegisterWorker)");
  }
  auto it = sessions_.find(rpc::Sha256Hex(session));
  if (it == sessions_.end()) {
    return absl::PermissionDeniedError(
        "the worker session is not one this coordinator gave; register the worker");
  }
  return it->second;
}

absl::Status ControlState::CheckCaller(const std::string& session,
                                       const std::string& worker_id) const {
  SATDAR_ASSIGN_OR_RETURN(const std::string caller, Caller(session));
  if (caller != worker_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the call names worker \"", worker_id, "\" but its session is worker ", caller, "'s"));
  }
  return absl::OkStatus();
}

bool ControlState::RankOf(const JobRecord& job, int attempt, int rank,
                          const std::string& worker_id) const {
  if (rank < 0) return false;
  if (attempt == job.job().attempts()) {
    return rank < job.ranks_size() && job.ranks(rank).worker_id() == worker_id;
  }
  for (const v1::Attempt& a : job.job().history()) {
    if (a.number() != attempt) continue;
    if (rank >= a.ranks_size()) return false;
    const v1::RankOutcome& o = a.ranks(rank);
    if (!o.worker_id().empty()) return o.worker_id() == worker_id;
    // An attempt recorded before outcomes named worker ids: by name (unique among live
    // workers when it ran).
    auto w = workers_.find(worker_id);
    return w != workers_.end() && o.worker() == w->second.worker().name();
  }
  return false;
}

bool ControlState::AttemptOf(const JobRecord& job, int attempt,
                             const std::string& worker_id) const {
  const int world = std::max(job.ranks_size(), job.job().world_size());
  for (int r = 0; r < world; ++r) {
    if (RankOf(job, attempt, r, worker_id)) return true;
  }
  return false;
}

absl::Status ControlState::NotAssigned(const std::string& what, const JobRecord& job, int attempt,
                                       int rank, const std::string& worker_id) const {
  return absl::PermissionDeniedError(absl::StrCat(
      what, ": ", rank >= 0 ? absl::StrCat("rank ", rank, " of ") : "", "attempt ", attempt,
      " of ", job.job().job_id(), " is not assigned to worker ", worker_id));
}

}  // namespace satdar::coordinator
