#include "coordinator/store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// satdar's tables and their columns, as the CREATE statements below make them.
const std::map<std::string, std::set<std::string>>& SatdarTables() {
  static const auto* tables = new std::map<std::string, std::set<std::string>>{
      {"jobs", {"job_id", "record"}},
      {"workers", {"worker_id", "record"}},
      {"events", {"job_id", "seq", "event"}},
      {"logs", {"job_id", "seq", "attempt", "rank", "line"}},
      {"kv", {"job_id", "attempt", "key", "value"}},
      {"series", {"job_id", "data"}}};
  return *tables;
}

// PRAGMA application_id of a satdar state database ("SATD").
constexpr int64_t kApplicationId = 0x53415444;

}  // namespace

absl::Status Store::CheckSchema(const std::string& path, bool* empty) {
  const auto not_ours = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state_dir: ", path, " is not a satdar coordinator's state (", why,
        "); give a folder of its own to state_dir"));
  };
  // A failed read: not SQLite at all, held by another program, or a real error.
  const auto failed = [&](const Statement& s) {
    const int code = sqlite3_errcode(db_) & 0xff;
    if (code == SQLITE_NOTADB) return not_ours("not a SQLite database");
    if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
      return absl::AlreadyExistsError(absl::StrCat("state_dir: ", path,
                                                   " is in use by another program (",
                                                   sqlite3_errmsg(db_), ")"));
    }
    return s.error("schema");
  };
  {
    Statement s(db_, "PRAGMA application_id");
    if (!s.ok() || s.Step() != SQLITE_ROW) return failed(s);
    const int64_t id = s.ColumnInt(0);
    if (id != 0 && id != kApplicationId) {
      return not_ours(absl::StrCat("its SQLite application id is ", id));
    }
  }
  std::vector<std::string> tables;
  {
    Statement s(db_, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                     "ORDER BY name");
    if (!s.ok()) return failed(s);
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) tables.push_back(s.ColumnText(0));
    if (rc != SQLITE_DONE) return failed(s);
  }
  *empty = tables.empty();
  for (const std::string& table : tables) {
    auto want = SatdarTables().find(table);
    if (want == SatdarTables().end()) return not_ours(absl::StrCat("it holds a table \"", table, "\""));
    std::set<std::string> columns;
    Statement s(db_, absl::StrCat("PRAGMA table_info(\"", table, "\")").c_str());
    if (!s.ok()) return failed(s);
    while (s.Step() == SQLITE_ROW) columns.insert(s.ColumnText(1));
    if (columns != want->second) {
      return not_ours(absl::StrCat("its table \"", table, "\" has columns (",
                                   absl::StrJoin(columns, ", "), "), not (",
                                   absl::StrJoin(want->second, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& dir) {
  if (absl::Status s = core::CheckFolder(dir); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("state_dir: ", s.message()));
  }
  // One coordinator per folder, told apart at once and by name (SQLite's own lock below would
  // only say "database is locked" after its busy timeout).
  std::string note;
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<core::FolderLock> lock,
                          core::FolderLock::Acquire(dir, "coordinator.lock", "state_dir",
                                                    "coordinator", &note));
  if (!note.empty()) std::fprintf(stderr, "coordinator: warning: %s\n", note.c_str());
  const std::string path = dir + "/state.db";
  // coordinator.json is written once a coordinator serves from the folder, after state.db
  // holds its tables: from then on a missing or empty state.db means lost state, which an
  // empty start would hide.
  const std::string served = dir + "/coordinator.json";
  struct stat st;
  const bool has_db = ::stat(path.c_str(), &st) == 0;
  if (has_db && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("state_dir: ", path, " is ",
                                                   core::PathKind(path), ", not a regular file"));
  }
  if (::access(served.c_str(), F_OK) == 0 && (!has_db || st.st_size == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state_dir: ", path, has_db ? " is empty (0 bytes)" : " is missing", ", but ", served,
        " shows that a coordinator served from this folder: its jobs would be lost. Restore ",
        path, ", or remove ", served, " to start with no jobs"));
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InvalidArgumentError(absl::StrCat("state_dir: cannot open ", path, ": ", msg));
  }
  auto store = std::unique_ptr<Store>(new Store(db, std::move(lock)));
  sqlite3_busy_timeout(db, 5000);
  // Exclusive for SQLite too: nothing else may write the state while the coordinator runs.
  // The file is checked before anything is written to it (WAL mode changes its header).
  SATDAR_RETURN_IF_ERROR(store->Exec("PRAGMA locking_mode=EXCLUSIVE"));
  bool empty = false;
  SATDAR_RETURN_IF_ERROR(store->CheckSchema(path, &empty));
  if (empty && ::access(served.c_str(), F_OK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state_dir: ", path, " holds no state, but ", served,
        " shows that a coordinator served from this folder: its jobs would be lost. Restore ",
        path, ", or remove ", served, " to start with no jobs"));
  }
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "BEGIN EXCLUSIVE",
                          "COMMIT"}) {
    absl::Status s = store->Exec(sql);
    if (s.ok()) continue;
    const int code = sqlite3_errcode(db) & 0xff;
    if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
      return absl::AlreadyExistsError(
          absl::StrCat("state_dir: ", path, " is in use by another program (", s.message(), ")"));
    }
    return absl::InternalError(absl::StrCat("state_dir: cannot open ", path, ": ", s.message()));
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
  SATDAR_RETURN_IF_ERROR(store->Exec(absl::StrCat("PRAGMA application_id = ", kApplicationId)));
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
