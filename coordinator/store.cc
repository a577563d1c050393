#include "coordinator/store.h"

#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"

namespace satdar::coordinator {

namespace {

// One prepared statement, finalized on destruction.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  absl::Status error(const char* what) const {
    return absl::InternalError(absl::StrCat("state store: ", what, ": ", sqlite3_errmsg(db_)));
  }
  void Text(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void Blob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void Int(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  int Step() { return sqlite3_step(stmt_); }
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  std::string ColumnBlob(int i) const {
    const void* p = sqlite3_column_blob(stmt_, i);
    return std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, i));
  }
  std::string ColumnText(int i) const {
    const unsigned char* p = sqlite3_column_text(stmt_, i);
    return p == nullptr ? "" : std::string(reinterpret_cast<const char*>(p),
                                           sqlite3_column_bytes(stmt_, i));
  }
  int64_t ColumnInt(int i) const { return sqlite3_column_int64(stmt_, i); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

absl::Status Done(Statement& s, const char* what) {
  return s.Step() == SQLITE_DONE ? absl::OkStatus() : s.error(what);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir) {
  SATDAR_RETURN_IF_ERROR(core::CheckFolder(dir));
  const std::string path = dir + "/state.db";
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InvalidArgumentError(absl::StrCat("--state-dir: cannot open ", path, ": ", msg));
  }
  auto store = std::unique_ptr<Store>(new Store(db));
  sqlite3_busy_timeout(db, 5000);
  // Another coordinator on the same folder would corrupt the state: take it exclusively.
  for (const char* sql : {"PRAGMA locking_mode=EXCLUSIVE", "PRAGMA journal_mode=WAL",
                          "PRAGMA synchronous=FULL", "BEGIN EXCLUSIVE", "COMMIT"}) {
    absl::Status s = store->Exec(sql);
    if (!s.ok()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "--state-dir: ", path, " is in use by another coordinator or unreadable (", s.message(), ")"));
    }
  }
  SATDAR_RETURN_IF_ERROR(store->Exec(
      "CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, record BLOB NOT NULL);"
      "CREATE TABLE IF NOT EXISTS workers (worker_id TEXT PRIMARY KEY, record BLOB NOT NULL);"
      "CREATE TABLE IF NOT EXISTS events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, "
      "  event BLOB NOT NULL, PRIMARY KEY (job_id, seq));"
      "CREATE TABLE IF NOT EXISTS logs (job_id TEXT NOT NULL, seq INTEGER NOT NULL, "
      "  attempt INTEGER NOT NULL, rank INTEGER NOT NULL, line TEXT NOT NULL, "
      "  PRIMARY KEY (job_id, seq));"
      "CREATE TABLE IF NOT EXISTS kv (job_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
      "  key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (job_id, attempt, key));"
      "CREATE TABLE IF NOT EXISTS series (job_id TEXT PRIMARY KEY, data TEXT NOT NULL);"));
  return store;
}

Store::~Store() { sqlite3_close(db_); }

absl::Status Store::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("state store: ", msg));
  }
  return absl::OkStatus();
}

absl::Status Store::LoadJobs(std::vector<JobRecord>* jobs) {
  Statement s(db_, "SELECT record FROM jobs");
  if (!s.ok()) return s.error("load jobs");
  while (s.Step() == SQLITE_ROW) {
    JobRecord r;
    if (!r.ParseFromString(s.ColumnBlob(0))) return absl::DataLossError("state store: a job record is corrupted");
    jobs->push_back(std::move(r));
  }
  return absl::OkStatus();
}

absl::Status Store::LoadWorkers(std::vector<WorkerRecord>* workers) {
  Statement s(db_, "SELECT record FROM workers");
  if (!s.ok()) return s.error("load workers");
  while (s.Step() == SQLITE_ROW) {
    WorkerRecord r;
    if (!r.ParseFromString(s.ColumnBlob(0))) return absl::DataLossError("state store: a worker record is corrupted");
    workers->push_back(std::move(r));
  }
  return absl::OkStatus();
}

absl::Status Store::PutJob(const JobRecord& job) {
  Statement s(db_, "INSERT OR REPLACE INTO jobs (job_id, record) VALUES (?, ?)");
  if (!s.ok()) return s.error("put job");
  s.Text(1, job.job().job_id());
  s.Blob(2, job.SerializeAsString());
  return Done(s, "put job");
}

absl::Status Store::PutSeries(const std::string& job_id, const std::string& data) {
  Statement s(db_, "INSERT OR REPLACE INTO series (job_id, data) VALUES (?, ?)");
  if (!s.ok()) return s.error("put series");
  s.Text(1, job_id);
  s.Text(2, data);
  return Done(s, "put series");
}

absl::Status Store::LoadSeries(std::map<std::string, std::string>* out) {
  Statement s(db_, "SELECT job_id, data FROM series");
  if (!s.ok()) return s.error("load series");
  while (s.Step() == SQLITE_ROW) (*out)[s.ColumnText(0)] = s.ColumnText(1);
  return absl::OkStatus();
}

absl::Status Store::PutWorker(const WorkerRecord& worker) {
  Statement s(db_, "INSERT OR REPLACE INTO workers (worker_id, record) VALUES (?, ?)");
  if (!s.ok()) return s.error("put worker");
  s.Text(1, worker.worker().worker_id());
  s.Blob(2, worker.SerializeAsString());
  return Done(s, "put worker");
}

absl::Status Store::AddEvent(const std::string& job_id, const satdar::v1::JobEvent& event) {
  Statement s(db_, "INSERT INTO events (job_id, seq, event) VALUES (?, ?, ?)");
  if (!s.ok()) return s.error("add event");
  s.Text(1, job_id);
  s.Int(2, event.sequence());
  s.Blob(3, event.SerializeAsString());
  return Done(s, "add event");
}

absl::Status Store::LoadEvents(const std::string& job_id, int64_t after,
                               std::vector<satdar::v1::JobEvent>* out) {
  Statement s(db_, "SELECT event FROM events WHERE job_id = ? AND seq > ? ORDER BY seq");
  if (!s.ok()) return s.error("load events");
  s.Text(1, job_id);
  s.Int(2, after);
  while (s.Step() == SQLITE_ROW) {
    satdar::v1::JobEvent e;
    if (!e.ParseFromString(s.ColumnBlob(0))) return absl::DataLossError("state store: an event is corrupted");
    out->push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status Store::AddLogs(const std::string& job_id, int attempt, int rank,
                            const std::vector<std::string>& lines, int64_t first_sequence) {
  if (lines.empty()) return absl::OkStatus();
  SATDAR_RETURN_IF_ERROR(Exec("BEGIN"));
  absl::Status status;
  {
    Statement s(db_, "INSERT INTO logs (job_id, seq, attempt, rank, line) VALUES (?, ?, ?, ?, ?)");
    status = s.ok() ? absl::OkStatus() : s.error("add logs");
    for (size_t i = 0; status.ok() && i < lines.size(); ++i) {
      s.Reset();
      s.Text(1, job_id);
      s.Int(2, first_sequence + static_cast<int64_t>(i));
      s.Int(3, attempt);
      s.Int(4, rank);
      s.Text(5, lines[i]);
      status = Done(s, "add logs");
    }
  }
  if (!status.ok()) {
    (void)Exec("ROLLBACK");
    return status;
  }
  return Exec("COMMIT");
}

absl::Status Store::LoadLogs(const std::string& job_id, int rank, int64_t after, int64_t limit,
                             bool tail, std::vector<satdar::v1::LogLine>* out) {
  const char* sql =
      tail ? "SELECT seq, attempt, rank, line FROM (SELECT * FROM logs WHERE job_id = ?1 AND "
             "seq > ?2 AND (?3 < 0 OR rank = ?3) ORDER BY seq DESC LIMIT ?4) ORDER BY seq"
           : "SELECT seq, attempt, rank, line FROM logs WHERE job_id = ?1 AND seq > ?2 AND "
             "(?3 < 0 OR rank = ?3) ORDER BY seq LIMIT ?4";
  Statement s(db_, sql);
  if (!s.ok()) return s.error("load logs");
  s.Text(1, job_id);
  s.Int(2, after);
  s.Int(3, rank);
  s.Int(4, limit);
  while (s.Step() == SQLITE_ROW) {
    satdar::v1::LogLine l;
    l.set_sequence(s.ColumnInt(0));
    l.set_attempt(static_cast<int>(s.ColumnInt(1)));
    l.set_rank(static_cast<int>(s.ColumnInt(2)));
    l.set_text(s.ColumnText(3));
    out->push_back(std::move(l));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Store::LastLogSequence(const std::string& job_id) {
  Statement s(db_, "SELECT COALESCE(MAX(seq), 0) FROM logs WHERE job_id = ?");
  if (!s.ok()) return s.error("log sequence");
  s.Text(1, job_id);
  if (s.Step() != SQLITE_ROW) return s.error("log sequence");
  return s.ColumnInt(0);
}

absl::Status Store::KvSet(const std::string& job_id, int attempt, const std::string& key,
                          const std::string& value) {
  Statement s(db_, "INSERT OR REPLACE INTO kv (job_id, attempt, key, value) VALUES (?, ?, ?, ?)");
  if (!s.ok()) return s.error("kv set");
  s.Text(1, job_id);
  s.Int(2, attempt);
  s.Text(3, key);
  s.Blob(4, value);
  return Done(s, "kv set");
}

absl::StatusOr<std::optional<std::string>> Store::KvGet(const std::string& job_id, int attempt,
                                                        const std::string& key) {
  Statement s(db_, "SELECT value FROM kv WHERE job_id = ? AND attempt = ? AND key = ?");
  if (!s.ok()) return s.error("kv get");
  s.Text(1, job_id);
  s.Int(2, attempt);
  s.Text(3, key);
  if (s.Step() == SQLITE_ROW) return std::optional<std::string>(s.ColumnBlob(0));
  return std::optional<std::string>();
}

}  // namespace satdar::coordinator
