// coordinator/store.h: the coordinator's state in SQLite (one file, DIR/state.db, in WAL mode
// with synchronous=FULL: a change is on disk when its call returns), so a coordinator killed
// with SIGKILL and restarted on the same folder finds every job as it was.
//
// Jobs and workers are stored as serialized records (state.proto), events, log lines and the
// rendezvous store's entries as rows of their own. Not thread-safe: the caller serialises
// (the coordinator holds its lock around every call).
//
// One coordinator per folder: Open locks DIR/coordinator.lock (core/folder_lock.h) for the
// Store's lifetime. It refuses, rather than adopts or silently starts empty: a state.db that
// is missing or empty while DIR/coordinator.json shows a coordinator served from the folder
// (its jobs would be lost), and a file that is not satdar's state (not SQLite, another
// program's tables or columns, another application id).
#ifndef SATDAR_COORDINATOR_STORE_H_
#define SATDAR_COORDINATOR_STORE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/state.pb.h"
#include "core/folder_lock.h"

struct sqlite3;

namespace satdar::coordinator {

class Store {
 public:
  // Errors name --state-dir: AlreadyExists when another coordinator holds the folder (naming
  // its pid), InvalidArgument for the refusals above.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& dir);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  absl::Status LoadJobs(std::vector<JobRecord>* jobs);
  absl::Status LoadWorkers(std::vector<WorkerRecord>* workers);
  absl::Status PutJob(const JobRecord& job);
  absl::Status PutWorker(const WorkerRecord& worker);

  // Each job's dashboard series (job_series.h), as JSON text.
  absl::Status PutSeries(const std::string& job_id, const std::string& data);
  absl::Status LoadSeries(std::map<std::string, std::string>* out);

  absl::Status AddEvent(const std::string& job_id, const satdar::v1::JobEvent& event);
  absl::Status LoadEvents(const std::string& job_id, int64_t after,
                          std::vector<satdar::v1::JobEvent>* out);

  // Appends lines with sequence numbers first_sequence, first_sequence + 1, ...
  absl::Status AddLogs(const std::string& job_id, int attempt, int rank,
                       const std::vector<std::string>& lines, int64_t first_sequence);
  // Lines with sequence > after, of `rank` (-1: all), at most `limit` (the last ones when
  // tail is true).
  absl::Status LoadLogs(const std::string& job_id, int rank, int64_t after, int64_t limit,
                        bool tail, std::vector<satdar::v1::LogLine>* out);
  absl::StatusOr<int64_t> LastLogSequence(const std::string& job_id);

  absl::Status KvSet(const std::string& job_id, int attempt, const std::string& key,
                     const std::string& value);
  absl::StatusOr<std::optional<std::string>> KvGet(const std::string& job_id, int attempt,
                                                   const std::string& key);

 private:
  Store(sqlite3* db, std::unique_ptr<core::FolderLock> lock) : db_(db), lock_(std::move(lock)) {}
  absl::Status Exec(const std::string& sql);
  // InvalidArgument naming `path` unless the database holds only satdar's tables (or none).
  absl::Status CheckSchema(const std::string& path, bool* empty);
  sqlite3* db_;
  std::unique_ptr<core::FolderLock> lock_;  // released after db_ is closed
};

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_STORE_H_
