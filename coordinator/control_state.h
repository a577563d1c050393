// coordinator/control_state.h: what the coordinator knows and decides: jobs, their attempts and
// ranks, workers and their leases, the rendezvous store, events and logs. The gRPC services
// (server.h) are thin wrappers over it; tests drive it directly with a fake clock.
//
// Every state change is written to the Store before the call returns (a coordinator killed
// with SIGKILL loses nothing it answered). Rank progress from heartbeats is kept in memory and
// written every few seconds. One mutex guards everything; waits (WatchJob, GetLogs, KvGet)
// block on a condition variable, never holding it.
//
// Failure policy: a rank that exits 2 (bad input) fails the job at once; a rank that exits
// otherwise, is killed by a signal, or whose worker misses its lease fails the attempt: the
// gang is stopped and, up to max_restarts, started again (backoff 1, 2, 4 ... 30 s) from the
// newest complete checkpoint, possibly on other workers. The attempt number fences reports:
// anything from an older attempt is ignored and its ranks are told to stop.
#ifndef SATDAR_COORDINATOR_CONTROL_STATE_H_
#define SATDAR_COORDINATOR_CONTROL_STATE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/job_series.h"
#include "coordinator/state.pb.h"
#include "nlohmann/json.hpp"
#include "coordinator/store.h"
#include "proto/satdar/v1/control.pb.h"

namespace satdar::coordinator {

struct ControlOptions {
  int64_t heartbeat_ms = 1000;
  int64_t lease_ms = 10000;         // a worker silent this long is lost
  int64_t max_backoff_ms = 30000;
  int max_active_jobs = 10000;      // jobs not yet final
  int64_t max_log_lines = 200000;   // per job; later lines are counted, not kept
  std::function<int64_t()> now_ms;  // the clock (tests); default: the system clock
  // Called (with the lock held: keep it short) when a job's gang is placed, with the seconds
  // it waited since submit or since its retry's backoff ended.
  std::function<void(double)> on_placed;
};

// A running rank that serves /metrics (Prometheus service discovery).
struct MetricsTarget {
  std::string job_id;
  int rank = 0;
  std::string address;  // HOST:PORT
  std::string worker;   // the worker's name
};

class ControlState {
 public:
  // Loads every job and worker from the store (workers get a fresh lease: the coordinator's
  // own downtime is not theirs).
  static absl::StatusOr<std::unique_ptr<ControlState>> Create(std::unique_ptr<Store> store,
                                                              ControlOptions options);

  // ---- users ----
  absl::StatusOr<satdar::v1::SubmitJobResponse> Submit(const satdar::v1::SubmitJobRequest& req);
  absl::StatusOr<satdar::v1::Job> GetJob(const std::string& job_id, bool full);
  std::vector<satdar::v1::Job> ListJobs(const satdar::v1::ListJobsRequest& req);
  absl::StatusOr<satdar::v1::Job> Cancel(const std::string& job_id);
  // Events after `after`; waits up to `wait_ms` for one when there are none. *final: the job
  // is final and every event was returned.
  absl::Status Events(const std::string& job_id, int64_t after, int64_t wait_ms,
                      std::vector<satdar::v1::JobEvent>* out, bool* final);
  absl::Status Logs(const std::string& job_id, int rank, int64_t after, int64_t limit, bool tail,
                    int64_t wait_ms, std::vector<satdar::v1::LogLine>* out, bool* final);
  std::vector<satdar::v1::Worker> ListWorkers();

  // ---- workers ----
  // Registration gives the worker a random id and a session (a secret bound to that id). Every
  // later call names its caller by `session` (the "satdar-worker-session" metadata of the
  // worker and of the ranks it starts) and may touch only what was assigned to that worker:
  // its own heartbeat, exits, logs and rank leases of ranks placed on it (in any attempt),
  // the rendezvous keys of attempts it holds a rank of. Anything else is PermissionDenied
  // (an unknown or missing session too).
  absl::StatusOr<satdar::v1::RegisterWorkerResponse> Register(
      const satdar::v1::RegisterWorkerRequest& req);
  absl::StatusOr<satdar::v1::HeartbeatResponse> Heartbeat(const std::string& session,
                                                          const satdar::v1::HeartbeatRequest& req);
  absl::Status ReportExit(const std::string& session, const satdar::v1::RankExit& exit);
  absl::Status UploadLogs(const std::string& session, const satdar::v1::LogUpload& upload);
  absl::Status KvSet(const std::string& session, const satdar::v1::KvSetRequest& req);
  absl::StatusOr<satdar::v1::KvGetResponse> KvGet(const std::string& session,
                                                  const satdar::v1::KvGetRequest& req);
  // A rank's own lease (lease_ms long): FailedPrecondition once its attempt is fenced.
  absl::StatusOr<satdar::v1::RankLeaseResponse> RenewRankLease(
      const std::string& session, const satdar::v1::RankLeaseRequest& req);

  // ---- observability ----
  StateCounts Counts();
  std::vector<MetricsTarget> MetricsTargets();
  // The job's dashboard series (job_series.h) as JSON; NotFound for an unknown job.
  absl::StatusOr<nlohmann::json> Series(const std::string& job_id);

  // Leases, retries after their backoff, placement; called every few hundred milliseconds.
  void Tick();
  // Writes the progress and series held in memory (shutdown).
  void Flush();
  // Wakes every waiter (shutdown).
  void WakeAll();

 private:
  ControlState(std::unique_ptr<Store> store, ControlOptions options);
  int64_t Now() const { return options_.now_ms(); }
  // The helpers below run with mu_ held.
  JobRecord* FindJob(const std::string& job_id);
  absl::Status Save(JobRecord* job);
  void Event(JobRecord* job, const std::string& kind, const std::string& message);
  satdar::v1::Attempt* CurrentAttempt(JobRecord* job);
  void RecordRankOutcome(JobRecord* job, const RankRecord& rank);
  void StopRanks(JobRecord* job);
  void FailAttempt(JobRecord* job, int rank, const std::string& reason,
                   const std::vector<std::string>& last_lines, int exit_code);
  void FinishJob(JobRecord* job, satdar::v1::JobState state, int exit_code,
                 const std::string& reason);
  void MaybeReleaseStoppedGang(JobRecord* job);
  void ReleaseUnreportedStops(const std::string& worker_id,
                              const std::set<std::tuple<std::string, int, int>>& reported);
  void LoseWorker(WorkerRecord* worker, const std::string& why);
  // control_identity.cc: who calls, and what was assigned to them.
  // The worker id `session` belongs to; PermissionDenied when none does.
  absl::StatusOr<std::string> Caller(const std::string& session) const;
  // Caller(session), which must be `worker_id` (a call naming its worker in the request).
  absl::Status CheckCaller(const std::string& session, const std::string& worker_id) const;
  // Whether `rank` of `attempt` of `job` was placed on `worker_id` (the current attempt's
  // ranks, an older one's history).
  bool RankOf(const JobRecord& job, int attempt, int rank, const std::string& worker_id) const;
  // Whether any rank of `attempt` of `job` was placed on `worker_id`.
  bool AttemptOf(const JobRecord& job, int attempt, const std::string& worker_id) const;
  // PermissionDenied "<what>: rank R of attempt A of JOB is not assigned to worker W".
  absl::Status NotAssigned(const std::string& what, const JobRecord& job, int attempt, int rank,
                           const std::string& worker_id) const;
  // Places what fits, and sets every PENDING job's pending_reason.
  void Schedule();
  // Why a PENDING job may not be placed yet whatever the slots: its failed attempt's ranks
  // still stop, or its retry's backoff has not ended; "" when neither.
  std::string RetryWait(const JobRecord& job) const;
  // Sets Job.pending_reason; a reason that says the job can never fit is also an event.
  void SetPendingReason(JobRecord* job, const std::string& reason, bool never_fits);
  void FlushProgress();
  // Global rank 0's step records (JSON text) into the job's dashboard series.
  static constexpr size_t kMaxRecordBytes = 1 << 20;
  void TakeRecords(const std::string& job_id,
                   const google::protobuf::RepeatedPtrField<std::string>& records);
  bool Final(const JobRecord& job) const;

  std::unique_ptr<Store> store_;
  ControlOptions options_;
  std::mutex mu_;
  std::condition_variable changed_;  // any event, log line or key
  std::map<std::string, JobRecord> jobs_;
  std::map<std::string, std::string> request_ids_;  // request id -> job id
  std::map<std::string, WorkerRecord> workers_;
  std::map<std::string, std::string> sessions_;     // session SHA-256 -> worker id
  std::map<std::string, int64_t> last_heartbeat_;    // worker id -> ms
  std::map<std::string, int64_t> log_sequence_;      // job id -> last log sequence
  std::map<std::string, int64_t> dropped_lines_;     // job id -> lines beyond the bound
  std::map<std::string, bool> progress_dirty_;
  std::map<std::string, JobSeries> series_;          // job id -> dashboard series
  std::set<std::string> series_dirty_;
  int64_t next_submit_order_ = 1;
  int64_t last_flush_ms_ = 0;
};

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_CONTROL_STATE_H_
