// ControlState: the workers' calls (registration, heartbeats and their assignments, exits,
// logs, the rendezvous store) and lost workers.
#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/control_state.h"
#include "core/check.h"
#include "nlohmann/json.hpp"
#include "proto/rpc.h"

namespace satdar::coordinator {

namespace v1 = satdar::v1;
using Json = nlohmann::json;

namespace {

constexpr size_t kMaxLineBytes = 4096;
constexpr int kMaxLinesPerUpload = 1000;
constexpr size_t kMaxKvBytes = 1 << 20;

// The last non-empty line, for a one-line reason.
// The line that says why a rank failed: its last "...error: ..." line ("satdar train: error:
// ...", "satdar: error: out of memory"), else its last line.
std::string ErrorLine(const google::protobuf::RepeatedPtrField<std::string>& lines) {
  for (int i = lines.size() - 1; i >= 0; --i) {
    if (lines[i].find("error: ") != std::string::npos) return lines[i];
  }
  for (int i = lines.size() - 1; i >= 0; --i) {
    if (!lines[i].empty()) return lines[i];
  }
  return "";
}

}  // namespace

absl::StatusOr<v1::RegisterWorkerResponse> ControlState::Register(
    const v1::RegisterWorkerRequest& req) {
  if (req.name().empty() || req.name().size() > 128) {
    return absl::InvalidArgumentError("name: 1 to 128 bytes");
  }
  if (req.slots() < 1 || req.slots() > 4096) return absl::InvalidArgumentError("slots: 1 to 4096");
  if (req.device() != "cpu" && req.device() != "cuda") {
    return absl::InvalidArgumentError("device: \"cpu\" or \"cuda\"");
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, w] : workers_) {
    if (w.worker().name() == req.name() && w.worker().state() == "ALIVE") {
      return absl::AlreadyExistsError(absl::StrCat(
          "a live worker is registered as \"", req.name(), "\" (", id,
          "); a worker restarted under the same name can register once that one's lease ended"));
    }
  }
  WorkerRecord rec;
  v1::Worker* w = rec.mutable_worker();
  std::string id;
  do {  // 64 random bits: no worker can guess another's id
    id = absl::StrCat("worker-", rpc::RandomHex(8));
  } while (workers_.count(id));
  w->set_worker_id(id);
  const std::string session = rpc::RandomHex(32);
  rec.set_session_sha256(rpc::Sha256Hex(session));
  w->set_name(req.name());
  w->set_host(req.host());
  w->set_slots(req.slots());
  w->set_device(req.device());
  w->set_state("ALIVE");
  rec.set_registered_ms(Now());
  SATDAR_RETURN_IF_ERROR(store_->PutWorker(rec));
  sessions_[rec.session_sha256()] = id;
  last_heartbeat_[id] = Now();
  workers_[id] = std::move(rec);
  Schedule();
  v1::RegisterWorkerResponse resp;
  resp.set_worker_id(id);
  resp.set_heartbeat_ms(static_cast<int>(options_.heartbeat_ms));
  resp.set_lease_ms(static_cast<int>(options_.lease_ms));
  resp.set_session(session);
  return resp;
}

void ControlState::TakeRecords(const std::string& job_id,
                               const google::protobuf::RepeatedPtrField<std::string>& records) {
  if (records.empty()) return;
  JobSeries& series = series_[job_id];
  for (const std::string& text : records) {
    if (text.size() > kMaxRecordBytes) continue;  // not a step record of ours
    const nlohmann::json record = nlohmann::json::parse(text, nullptr, false);
    if (series.Add(record, Now())) series_dirty_.insert(job_id);
  }
}

absl::StatusOr<v1::HeartbeatResponse> ControlState::Heartbeat(const std::string& session,
                                                              const v1::HeartbeatRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  auto wit = workers_.find(req.worker_id());
  if (wit == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker \"", req.worker_id(), "\"; register first"));
  }
  SATDAR_RETURN_IF_ERROR(CheckCaller(session, req.worker_id()));
  if (wit->second.worker().state() != "ALIVE") {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", req.worker_id(), " was declared lost; stop its ranks and register again"));
  }
  const std::string& wid = req.worker_id();
  // A worker reports only ranks it was given (of any attempt): another's progress, loss or
  // metrics address is not its to report.
  for (const v1::RankStatus& st : req.ranks()) {
    const JobRecord* job = FindJob(st.job_id());
    if (job == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("heartbeat: no job \"", st.job_id(), "\" ran on worker ", wid));
    }
    if (!RankOf(*job, st.attempt(), st.rank(), wid)) {
      return NotAssigned("heartbeat", *job, st.attempt(), st.rank(), wid);
    }
  }
  last_heartbeat_[wid] = Now();
  wit->second.mutable_worker()->set_last_heartbeat_ms(Now());
  v1::HeartbeatResponse resp;
  std::map<std::pair<std::string, int>, std::vector<int>> running;  // (job, attempt) -> ranks
  std::set<std::tuple<std::string, int, int>> reported;              // (job, attempt, rank)
  for (const v1::RankStatus& st : req.ranks()) {
    reported.insert({st.job_id(), st.attempt(), st.rank()});
    JobRecord* job = FindJob(st.job_id());
    RankRecord* rank = nullptr;
    const bool current = job != nullptr && st.attempt() == job->job().attempts() && st.rank() >= 0 &&
                         st.rank() < job->ranks_size();
    if (current) rank = job->mutable_ranks(st.rank());
    const bool keep = rank != nullptr && rank->worker_id() == wid &&
                      (rank->state() == "ASSIGNED" || rank->state() == "RUNNING");
    if (!keep) {  // an older attempt, a stopped gang, a cancelled job: fenced off
      v1::RankRef* stop = resp.add_stop();
      stop->set_job_id(st.job_id());
      stop->set_attempt(st.attempt());
      stop->set_rank(st.rank());
      continue;
    }
    running[{st.job_id(), st.attempt()}].push_back(st.rank());
    if (rank->state() == "ASSIGNED" || rank->pid() != st.pid()) {
      rank->set_state("RUNNING");
      rank->set_pid(st.pid());
      RecordRankOutcome(job, *rank);
      (void)Save(job);
    }
    if (rank->metrics_address() != st.metrics_address()) {
      rank->set_metrics_address(st.metrics_address());
      progress_dirty_[job->job().job_id()] = true;
    }
    if (st.rank() == 0) TakeRecords(job->job().job_id(), st.records());
    if (st.rank() == 0 && st.step() > job->job().step()) {
      v1::Job* j = job->mutable_job();
      j->set_step(st.step());
      j->set_loss(st.loss());
      j->set_tokens_per_second(st.tokens_per_second());
      progress_dirty_[job->job().job_id()] = true;
      Event(job, "progress", absl::StrFormat("step %d/%d, loss %.4f, %.0f tokens/s", st.step(),
                                             j->steps(), st.loss(), st.tokens_per_second()));
    }
  }
  ReleaseUnreportedStops(wid, reported);
  // What this worker should run and is not running yet (sent until it reports them).
  for (auto& [id, job] : jobs_) {
    if (Final(job)) continue;
    const v1::Job& j = job.job();
    for (const RankRecord& r : job.ranks()) {
      if (r.worker_id() != wid || r.state() != "ASSIGNED") continue;
      const auto& mine = running[{id, j.attempts()}];
      if (std::find(mine.begin(), mine.end(), r.rank()) != mine.end()) continue;
      v1::RankAssignment* a = resp.add_start();
      a->set_job_id(id);
      a->set_attempt(j.attempts());
      a->set_rank(r.rank());
      a->set_world_size(j.world_size());
      a->set_config_json(j.spec().config_json());
      for (const std::string& arg : job.train_args()) a->add_train_args(arg);
      a->set_data_path(job.data_path());
      a->set_threads(std::max(1, j.spec().resources().threads_per_rank()));
      a->set_device(j.spec().resources().device().empty() ? "cpu" : j.spec().resources().device());
    }
  }
  return resp;
}

// A rank told to stop that its worker no longer reports runs nowhere: it was stopped before it
// started (a cancel or a failed attempt right after placement, whose start the worker never
// got or never acted on: the worker lists every rank it runs, and starts ranks only from a
// heartbeat's answer, before its next heartbeat), or it ended and its exit report is on the
// way. Its slot is free now: waiting for a report that may never come would keep it busy, and
// every later job pending, forever.
void ControlState::ReleaseUnreportedStops(
    const std::string& wid, const std::set<std::tuple<std::string, int, int>>& reported) {
  bool freed = false;
  for (auto& [id, job] : jobs_) {
    for (RankRecord& r : *job.mutable_ranks()) {
      if (r.worker_id() != wid || r.state() != "STOPPING") continue;
      if (reported.count({id, job.job().attempts(), r.rank()})) continue;
      r.set_state("EXITED");
      RecordRankOutcome(&job, r);
      MaybeReleaseStoppedGang(&job);
      (void)Save(&job);
      freed = true;
    }
  }
  if (freed) Schedule();
}

absl::Status ControlState::ReportExit(const std::string& session, const v1::RankExit& exit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!workers_.count(exit.worker_id())) {
    return absl::NotFoundError(absl::StrCat("no worker \"", exit.worker_id(), "\""));
  }
  SATDAR_RETURN_IF_ERROR(CheckCaller(session, exit.worker_id()));
  JobRecord* job = FindJob(exit.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", exit.job_id(), "\""));
  if (!RankOf(*job, exit.attempt(), exit.rank(), exit.worker_id())) {
    return NotAssigned("exit", *job, exit.attempt(), exit.rank(), exit.worker_id());
  }
  if (exit.attempt() != job->job().attempts()) {
    return absl::OkStatus();  // an older attempt: fenced off, nothing changes
  }
  RankRecord* rank = job->mutable_ranks(exit.rank());
  if (rank->worker_id() != exit.worker_id() || rank->state() == "EXITED" || rank->state() == "LOST") {
    return absl::OkStatus();
  }
  const bool was_stopping = rank->state() == "STOPPING";
  rank->set_state("EXITED");
  rank->set_exit_code(exit.exit_code());
  rank->set_signal(exit.signal());
  RecordRankOutcome(job, *rank);
  const std::string who = absl::StrCat("rank ", exit.rank(), " on ",
                                       workers_[exit.worker_id()].worker().name());
  const std::string how = exit.signal() != 0
                              ? absl::StrCat("was killed by signal ", exit.signal())
                              : absl::StrCat("exited with code ", exit.exit_code());
  Event(job, "rank_exited", absl::StrCat(who, " ", how));
  if (exit.rank() == 0) TakeRecords(exit.job_id(), exit.records());
  std::vector<std::string> last(exit.last_lines().begin(), exit.last_lines().end());
  if (exit.rank() == 0 && !exit.summary_json().empty() && exit.summary_json().size() < (1 << 20)) {
    v1::Job* j = job->mutable_job();
    j->set_summary_json(exit.summary_json());
    // The last step's numbers, which a heartbeat may not have carried.
    const Json summary = Json::parse(exit.summary_json(), nullptr, false);
    auto number = [&](const char* key) -> const Json* {
      return summary.is_object() && summary.contains(key) && summary[key].is_number() ? &summary[key]
                                                                                    : nullptr;
    };
    if (const Json* steps = number("steps")) j->set_step(steps->get<int64_t>());
    if (const Json* loss = number("final_loss")) j->set_loss(loss->get<double>());
    if (const Json* tps = number("tokens_per_second")) j->set_tokens_per_second(tps->get<double>());
  }
  if (job->job().state() == v1::RUNNING && !was_stopping) {
    if (exit.signal() == 0 && exit.exit_code() == 0) {
      bool all = true;
      for (const RankRecord& r : job->ranks()) all &= r.state() == "EXITED" && r.exit_code() == 0;
      if (all) FinishJob(job, v1::SUCCEEDED, 0, "");
    } else {
      const std::string line = ErrorLine(exit.last_lines());
      FailAttempt(job, exit.rank(), absl::StrCat(who, " ", how, line.empty() ? "" : ": ", line), last,
                  exit.signal() != 0 ? -1 : exit.exit_code());
    }
  }
  MaybeReleaseStoppedGang(job);
  return Save(job);
}

absl::Status ControlState::UploadLogs(const std::string& session, const v1::LogUpload& upload) {
  if (upload.lines_size() > kMaxLinesPerUpload) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxLinesPerUpload, " lines per upload"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!workers_.count(upload.worker_id())) {
    return absl::NotFoundError(absl::StrCat("no worker \"", upload.worker_id(), "\""));
  }
  SATDAR_RETURN_IF_ERROR(CheckCaller(session, upload.worker_id()));
  JobRecord* job = FindJob(upload.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", upload.job_id(), "\""));
  if (!RankOf(*job, upload.attempt(), upload.rank(), upload.worker_id())) {
    return NotAssigned("logs", *job, upload.attempt(), upload.rank(), upload.worker_id());
  }
  if (upload.attempt() != job->job().attempts()) return absl::OkStatus();  // fenced
  const std::string& id = upload.job_id();
  int64_t& seq = log_sequence_[id];
  std::vector<std::string> lines;
  for (const std::string& l : upload.lines()) {
    if (seq + static_cast<int64_t>(lines.size()) >= options_.max_log_lines) {
      ++dropped_lines_[id];
      continue;
    }
    lines.push_back(l.size() > kMaxLineBytes ? l.substr(0, kMaxLineBytes) : l);
  }
  SATDAR_RETURN_IF_ERROR(store_->AddLogs(id, upload.attempt(), upload.rank(), lines, seq + 1));
  seq += static_cast<int64_t>(lines.size());
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status ControlState::KvSet(const std::string& session, const v1::KvSetRequest& req) {
  if (req.key().empty() || req.key().size() > 1024 || req.value().size() > kMaxKvBytes) {
    return absl::InvalidArgumentError("key: 1 to 1024 bytes, value: at most 1 MiB");
  }
  std::lock_guard<std::mutex> lock(mu_);
  SATDAR_ASSIGN_OR_RETURN(const std::string wid, Caller(session));
  JobRecord* job = FindJob(req.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", req.job_id(), "\""));
  if (!AttemptOf(*job, req.attempt(), wid)) return NotAssigned("store", *job, req.attempt(), -1, wid);
  if (req.attempt() != job->job().attempts() || Final(*job)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attempt ", req.attempt(), " of ", req.job_id(), " is not the running one"));
  }
  SATDAR_RETURN_IF_ERROR(store_->KvSet(req.job_id(), req.attempt(), req.key(), req.value()));
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<v1::RankLeaseResponse> ControlState::RenewRankLease(
    const std::string& session, const v1::RankLeaseRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  SATDAR_ASSIGN_OR_RETURN(const std::string wid, Caller(session));
  JobRecord* job = FindJob(req.job_id());
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", req.job_id(), "\""));
  if (!RankOf(*job, req.attempt(), req.rank(), wid)) {
    return NotAssigned("rank lease", *job, req.attempt(), req.rank(), wid);
  }
  const int current = job->job().attempts();
  if (req.attempt() != current) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attempt ", req.attempt(), " of ", req.job_id(), " is over (the job is at attempt ",
        current, ")"));
  }
  if (req.rank() < 0 || req.rank() >= job->ranks_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", req.rank(), " of ", req.job_id(),
                                                   " does not exist"));
  }
  const RankRecord& r = job->ranks(req.rank());
  if (r.state() != "ASSIGNED" && r.state() != "RUNNING") {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", req.rank(), " of attempt ", current, " of ", req.job_id(), " is ", r.state(),
        Final(*job) ? " (the job is over)" : ""));
  }
  v1::RankLeaseResponse resp;
  resp.set_lease_ms(options_.lease_ms);
  return resp;
}

absl::StatusOr<v1::KvGetResponse> ControlState::KvGet(const std::string& session,
                                                      const v1::KvGetRequest& req) {
  const int64_t wait = std::min<int64_t>(std::max(req.wait_ms(), 0), 60000);
  std::unique_lock<std::mutex> lock(mu_);
  SATDAR_ASSIGN_OR_RETURN(const std::string wid, Caller(session));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait);
  for (;;) {
    JobRecord* job = FindJob(req.job_id());
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", req.job_id(), "\""));
    if (!AttemptOf(*job, req.attempt(), wid)) {
      return NotAssigned("store", *job, req.attempt(), -1, wid);
    }
    if (req.attempt() != job->job().attempts() || Final(*job)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "attempt ", req.attempt(), " of ", req.job_id(), " is not the running one"));
    }
    SATDAR_ASSIGN_OR_RETURN(std::optional<std::string> v,
                            store_->KvGet(req.job_id(), req.attempt(), req.key()));
    v1::KvGetResponse resp;
    if (v.has_value()) {
      resp.set_found(true);
      resp.set_value(*v);
      return resp;
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return resp;
  }
}

std::vector<v1::Worker> ControlState::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> busy;
  for (const auto& [id, j] : jobs_) {
    for (const RankRecord& r : j.ranks()) {
      if (r.state() != "EXITED" && r.state() != "LOST") ++busy[r.worker_id()];
    }
  }
  std::vector<v1::Worker> out;
  for (const auto& [id, w] : workers_) {
    v1::Worker v = w.worker();
    v.set_busy_slots(busy[id]);
    v.set_last_heartbeat_ms(last_heartbeat_.count(id) ? last_heartbeat_[id] : 0);
    out.push_back(std::move(v));
  }
  return out;
}

// A worker that missed its lease: its ranks are gone (it kills them itself once it notices it
// cannot reach the coordinator), and every job that had ranks on it fails its attempt.
void ControlState::LoseWorker(WorkerRecord* worker, const std::string& why) {
  worker->mutable_worker()->set_state("LOST");
  (void)store_->PutWorker(*worker);
  const std::string& wid = worker->worker().worker_id();
  for (auto& [id, job] : jobs_) {
    int first = -1;
    bool changed = false;
    for (RankRecord& r : *job.mutable_ranks()) {
      if (r.worker_id() != wid || r.state() == "EXITED" || r.state() == "LOST") continue;
      if (first < 0 && r.state() != "STOPPING") first = r.rank();
      r.set_state("LOST");
      RecordRankOutcome(&job, r);
      changed = true;
    }
    if (!changed) continue;
    // A lost rank may still run (a stopped or cut-off worker) until its own lease runs out
    // (rank_lease.h): no newer attempt starts before then, so two never write at once.
    const int64_t leases_end = Now() + options_.lease_ms;
    if (job.job().state() == v1::RUNNING && !job.stopping() && first >= 0) {
      FailAttempt(&job, first,
                  absl::StrCat("worker ", worker->worker().name(), " was lost with rank ", first,
                               " (", why, ")"),
                  {}, -1);
    }
    if (!Final(job)) job.set_not_before_ms(std::max(job.not_before_ms(), leases_end));
    MaybeReleaseStoppedGang(&job);
    (void)Save(&job);
  }
}

}  // namespace satdar::coordinator
