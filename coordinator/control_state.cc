// ControlState: jobs, users' calls, the lifecycle of attempts, and scheduling. The workers'
// calls are in control_workers.cc.
#include "coordinator/control_state.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/job_spec.h"
#include "coordinator/scheduler.h"
#include "core/check.h"
#include "core/timestamp.h"

namespace satdar::coordinator {

namespace v1 = satdar::v1;

namespace {

int64_t SystemMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint32_t RandomTag() {
  static std::mt19937 gen(std::random_device{}());
  return gen() & 0xffff;
}

// The job without its spec and history (lists, events).
v1::Job Brief(const v1::Job& job) {
  v1::Job b = job;
  b.clear_spec();
  b.clear_history();
  return b;
}

// Records written before "failed (retried)" existed left "retrying" on attempts that were
// retried, or whose job ended before its retry started.
void NormalizeOutcomes(v1::Job* job) {
  const bool final =
      job->state() == v1::SUCCEEDED || job->state() == v1::FAILED || job->state() == v1::CANCELLED;
  for (int i = 0; i < job->history_size(); ++i) {
    v1::Attempt* a = job->mutable_history(i);
    if (a->outcome() != "retrying") continue;
    if (i + 1 < job->history_size()) {
      a->set_outcome("failed (retried)");
    } else if (final) {
      a->set_outcome("failed");
    }
  }
  if (final) job->clear_pending_reason();
}

}  // namespace

ControlState::ControlState(std::unique_ptr<Store> store, ControlOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  if (!options_.now_ms) options_.now_ms = SystemMs;
}

absl::StatusOr<std::unique_ptr<ControlState>> ControlState::Create(std::unique_ptr<Store> store,
                                                                   ControlOptions options) {
  auto s = std::unique_ptr<ControlState>(new ControlState(std::move(store), std::move(options)));
  std::vector<JobRecord> jobs;
  SATDAR_RETURN_IF_ERROR(s->store_->LoadJobs(&jobs));
  for (JobRecord& j : jobs) {
    const std::string id = j.job().job_id();
    NormalizeOutcomes(j.mutable_job());
    if (!j.request_id().empty()) s->request_ids_[j.request_id()] = id;
    s->next_submit_order_ = std::max(s->next_submit_order_, j.submit_order() + 1);
    SATDAR_ASSIGN_OR_RETURN(s->log_sequence_[id], s->store_->LastLogSequence(id));
    s->jobs_[id] = std::move(j);
  }
  std::vector<WorkerRecord> workers;
  SATDAR_RETURN_IF_ERROR(s->store_->LoadWorkers(&workers));
  const int64_t now = s->Now();
  for (WorkerRecord& w : workers) {
    const std::string id = w.worker().worker_id();
    // A fresh lease, and one more: the workers were cut off by the coordinator's own downtime
    // and may take a moment to reconnect.
    if (w.worker().state() == "ALIVE") s->last_heartbeat_[id] = now + s->options_.lease_ms;
    if (!w.session_sha256().empty()) s->sessions_[w.session_sha256()] = id;
    s->workers_[id] = std::move(w);
  }
  std::map<std::string, std::string> series;
  SATDAR_RETURN_IF_ERROR(s->store_->LoadSeries(&series));
  for (const auto& [id, text] : series) {
    // A series this build cannot read is dropped (it is only the dashboard's history).
    if (auto js = JobSeries::FromJson(text); js.ok()) s->series_[id] = std::move(*js);
  }
  return s;
}

JobRecord* ControlState::FindJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

bool ControlState::Final(const JobRecord& job) const {
  const v1::JobState s = job.job().state();
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

absl::Status ControlState::Save(JobRecord* job) {
  progress_dirty_.erase(job->job().job_id());
  return store_->PutJob(*job);
}

void ControlState::Event(JobRecord* job, const std::string& kind, const std::string& message) {
  v1::JobEvent e;
  e.set_sequence(job->event_sequence() + 1);
  e.set_time_ms(Now());
  e.set_kind(kind);
  e.set_message(message);
  *e.mutable_job() = Brief(job->job());
  job->set_event_sequence(e.sequence());
  absl::Status s = store_->AddEvent(job->job().job_id(), e);
  if (!s.ok()) {
    std::fprintf(stderr, "%s coordinator: %s\n", core::UtcTimestamp().c_str(),
                 std::string(s.message()).c_str());
  }
  changed_.notify_all();
}

v1::Attempt* ControlState::CurrentAttempt(JobRecord* job) {
  v1::Job* j = job->mutable_job();
  if (j->history_size() == 0) return nullptr;
  return j->mutable_history(j->history_size() - 1);
}

void ControlState::RecordRankOutcome(JobRecord* job, const RankRecord& rank) {
  v1::Attempt* a = CurrentAttempt(job);
  if (a == nullptr || rank.rank() >= a->ranks_size()) return;
  v1::RankOutcome* o = a->mutable_ranks(rank.rank());
  o->set_state(rank.state());
  o->set_exit_code(rank.exit_code());
  o->set_signal(rank.signal());
}

// Asks every rank of the current attempt that still runs to stop.
void ControlState::StopRanks(JobRecord* job) {
  for (RankRecord& r : *job->mutable_ranks()) {
    if (r.state() == "ASSIGNED" || r.state() == "RUNNING") {
      r.set_state("STOPPING");
      RecordRankOutcome(job, r);
    }
  }
}

void ControlState::FinishJob(JobRecord* job, v1::JobState state, int exit_code,
                             const std::string& reason) {
  v1::Job* j = job->mutable_job();
  j->set_state(state);
  j->set_exit_code(exit_code);
  j->set_reason(reason);
  j->set_end_time_ms(Now());
  j->clear_pending_reason();
  if (v1::Attempt* a = CurrentAttempt(job); a != nullptr && a->end_time_ms() == 0) {
    a->set_end_time_ms(Now());
    a->set_outcome(state == v1::SUCCEEDED ? "succeeded"
                   : state == v1::CANCELLED ? "cancelled"
                                            : "failed");
  } else if (a != nullptr && a->outcome() == "retrying") {
    a->set_outcome("failed");  // the job ended before its retry started
  }
  job->set_stopping(false);
  StopRanks(job);
  Event(job, state == v1::SUCCEEDED ? "succeeded" : state == v1::CANCELLED ? "cancelled" : "failed",
        reason.empty() ? "the job succeeded" : reason);
}

// A rank failed in a retryable way (or fatally, exit_code 2): record the root cause, then
// retry the gang or give up.
void ControlState::FailAttempt(JobRecord* job, int rank, const std::string& reason,
                               const std::vector<std::string>& last_lines, int exit_code) {
  v1::Attempt* a = CurrentAttempt(job);
  if (a != nullptr && a->first_failed_rank() < 0) {
    a->set_first_failed_rank(rank);
    a->set_reason(reason);
    a->clear_last_lines();
    for (const std::string& l : last_lines) a->add_last_lines(l);
  }
  v1::Job* j = job->mutable_job();
  if (exit_code == 2) {
    FinishJob(job, v1::FAILED, 2, reason + " (bad input: not retried)");
    return;
  }
  if (j->attempts() > j->max_restarts()) {
    FinishJob(job, v1::FAILED, exit_code,
              absl::StrCat(reason, "; gave up after ", j->attempts(), " attempt(s) (max_restarts ",
                           j->max_restarts(), ")"));
    return;
  }
  if (a != nullptr) {
    a->set_end_time_ms(Now());
    a->set_outcome("retrying");
  }
  j->set_state(v1::PENDING);
  job->set_stopping(true);
  StopRanks(job);
  const int64_t backoff =
      std::min<int64_t>(options_.max_backoff_ms, int64_t{1000} << std::min(j->attempts() - 1, 10));
  job->set_not_before_ms(Now() + backoff);
  Event(job, "retrying",
        absl::StrCat(reason, "; restarting from the newest checkpoint (attempt ", j->attempts() + 1,
                     " of at most ", j->max_restarts() + 1, ")"));
  MaybeReleaseStoppedGang(job);
  SetPendingReason(job, RetryWait(*job), false);
}

std::string ControlState::RetryWait(const JobRecord& job) const {
  const int attempts = job.job().attempts();
  if (job.stopping()) {
    return absl::StrCat("waiting for the ranks of attempt ", attempts, " to stop");
  }
  const int64_t left_ms = job.not_before_ms() - Now();
  if (left_ms > 0) {
    return absl::StrCat("waiting to retry (backoff): attempt ", attempts + 1, " in ",
                        (left_ms + 999) / 1000, " s");
  }
  return "";
}

void ControlState::SetPendingReason(JobRecord* job, const std::string& reason, bool never_fits) {
  v1::Job* j = job->mutable_job();
  if (j->pending_reason() == reason) return;
  j->set_pending_reason(reason);
  progress_dirty_[j->job_id()] = true;  // written with the next flush, or the next Save
  if (never_fits) {
    Event(job, "waiting", reason);  // `submit --follow` says it, once per change
    (void)Save(job);
  }
}

// A retrying job waits until every rank of the failed attempt has ended (or its worker was
// lost), so no two attempts ever run at once.
void ControlState::MaybeReleaseStoppedGang(JobRecord* job) {
  if (!job->stopping()) return;
  for (const RankRecord& r : job->ranks()) {
    if (r.state() != "EXITED" && r.state() != "LOST") return;
  }
  job->set_stopping(false);
}

absl::StatusOr<v1::SubmitJobResponse> ControlState::Submit(const v1::SubmitJobRequest& req) {
  if (req.request_id().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError("request_id: at most 128 bytes");
  }
  SATDAR_ASSIGN_OR_RETURN(ValidJob valid, ValidateJobSpec(req.spec()));
  std::lock_guard<std::mutex> lock(mu_);
  v1::SubmitJobResponse resp;
  if (!req.request_id().empty()) {
    auto it = request_ids_.find(req.request_id());
    if (it != request_ids_.end()) {
      // A retry of the same submission is answered with its job; another spec under the same
      // request id is a client's mistake, never silently read as that job.
      auto job = jobs_.find(it->second);
      if (job != jobs_.end()) {
        v1::JobSpec asked = req.spec();
        asked.set_config_json(valid.config_json);  // stored in canonical form
        if (asked.SerializeAsString() != job->second.job().spec().SerializeAsString()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "request_id: already used by ", it->second,
              " with a different job spec; a new job needs a new request_id"));
        }
      }
      resp.set_job_id(it->second);
      resp.set_created(false);
      return resp;
    }
  }
  int active = 0;
  for (const auto& [id, j] : jobs_) active += Final(j) ? 0 : 1;
  if (active >= options_.max_active_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator holds ", active, " jobs that are not finished (at most ",
        options_.max_active_jobs, "); wait for some to end"));
  }
  JobRecord rec;
  const int64_t order = next_submit_order_++;
  // Unique beyond this coordinator: jobs of another state folder may share the storage.
  const std::string id = absl::StrFormat("job-%06d-%04x", order, RandomTag());
  v1::Job* j = rec.mutable_job();
  j->set_job_id(id);
  j->set_name(req.spec().name());
  j->set_state(v1::PENDING);
  j->set_exit_code(-1);
  j->set_steps(valid.steps);
  j->set_submit_time_ms(Now());
  j->set_world_size(valid.world_size);
  j->set_max_restarts(req.spec().max_restarts());
  *j->mutable_spec() = req.spec();
  j->mutable_spec()->set_config_json(valid.config_json);
  rec.set_request_id(req.request_id());
  for (const std::string& a : valid.train_args) rec.add_train_args(a);
  rec.set_data_path(valid.data_path);
  rec.set_submit_order(order);
  SATDAR_RETURN_IF_ERROR(store_->PutJob(rec));
  if (!req.request_id().empty()) request_ids_[req.request_id()] = id;
  JobRecord& stored = jobs_[id] = std::move(rec);
  Event(&stored, "submitted",
        absl::StrCat("submitted: ", valid.world_size, " rank(s) on ", valid.device));
  SATDAR_RETURN_IF_ERROR(Save(&stored));
  Schedule();
  resp.set_job_id(id);
  resp.set_created(true);
  return resp;
}

absl::StatusOr<v1::Job> ControlState::GetJob(const std::string& job_id, bool full) {
  std::lock_guard<std::mutex> lock(mu_);
  JobRecord* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  return full ? job->job() : Brief(job->job());
}

std::vector<v1::Job> ControlState::ListJobs(const v1::ListJobsRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const JobRecord*> all;
  for (const auto& [id, j] : jobs_) {
    bool wanted = req.states_size() == 0;
    for (int s : req.states()) wanted |= s == j.job().state();
    if (wanted) all.push_back(&j);
  }
  std::sort(all.begin(), all.end(), [](const JobRecord* a, const JobRecord* b) {
    return a->submit_order() > b->submit_order();
  });
  const size_t limit = req.limit() > 0 ? static_cast<size_t>(req.limit()) : 1000;
  std::vector<v1::Job> out;
  for (size_t i = 0; i < all.size() && i < limit; ++i) out.push_back(Brief(all[i]->job()));
  return out;
}

absl::StatusOr<v1::Job> ControlState::Cancel(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  JobRecord* job = FindJob(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  if (!Final(*job)) {
    FinishJob(job, v1::CANCELLED, -1, "cancelled by the user");
    SATDAR_RETURN_IF_ERROR(Save(job));
  }
  return Brief(job->job());
}

absl::Status ControlState::Events(const std::string& job_id, int64_t after, int64_t wait_ms,
                                  std::vector<v1::JobEvent>* out, bool* final) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  for (;;) {
    JobRecord* job = FindJob(job_id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
    if (job->event_sequence() > after) {
      SATDAR_RETURN_IF_ERROR(store_->LoadEvents(job_id, after, out));
      *final = Final(*job) && (out->empty() || out->back().sequence() == job->event_sequence());
      return absl::OkStatus();
    }
    *final = Final(*job);
    if (*final || changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return absl::OkStatus();
    }
  }
}

absl::Status ControlState::Logs(const std::string& job_id, int rank, int64_t after,
                                int64_t limit, bool tail, int64_t wait_ms,
                                std::vector<v1::LogLine>* out, bool* final) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  for (;;) {
    JobRecord* job = FindJob(job_id);
    if (job == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
    const bool was_final = Final(*job);
    if (log_sequence_[job_id] > after) {
      SATDAR_RETURN_IF_ERROR(store_->LoadLogs(job_id, rank, after, limit, tail, out));
      if (!out->empty()) {
        *final = was_final && out->back().sequence() == log_sequence_[job_id];
        return absl::OkStatus();
      }
    }
    *final = was_final;
    if (was_final || changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return absl::OkStatus();
    }
  }
}

void ControlState::WakeAll() { changed_.notify_all(); }

void ControlState::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = Now();
  for (auto& [id, w] : workers_) {
    if (w.worker().state() != "ALIVE") continue;
    const int64_t last = last_heartbeat_[id];
    if (now - last > options_.lease_ms) {
      LoseWorker(&w, absl::StrCat("no heartbeat for ", (now - last) / 1000.0, " s (lease ",
                                  options_.lease_ms / 1000.0, " s)"));
    }
  }
  Schedule();
  if (now - last_flush_ms_ >= 5000) FlushProgress();  // rank progress from heartbeats
}

void ControlState::FlushProgress() {
  last_flush_ms_ = Now();
  for (const auto& [id, dirty] : progress_dirty_) {
    if (JobRecord* job = FindJob(id)) (void)store_->PutJob(*job);
  }
  progress_dirty_.clear();
  for (const std::string& id : series_dirty_) {
    const std::string text =
        series_[id].ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    (void)store_->PutSeries(id, text);
  }
  series_dirty_.clear();
}

void ControlState::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  FlushProgress();
}

StateCounts ControlState::Counts() {
  std::lock_guard<std::mutex> lock(mu_);
  StateCounts c;
  for (const auto& [id, job] : jobs_) {
    ++c.jobs[v1::JobState_Name(job.job().state())];
    c.restarts += std::max(0, job.job().attempts() - 1);
    if (job.job().state() == v1::PENDING) ++c.queue_length;
    for (const RankRecord& r : job.ranks()) {
      // As Schedule() counts: every rank that may still run holds its slot.
      auto w = workers_.find(r.worker_id());
      const bool alive = w != workers_.end() && w->second.worker().state() == "ALIVE";
      if (alive && r.state() != "EXITED" && r.state() != "LOST") ++c.slots_busy;
    }
  }
  int64_t slots = 0;
  for (const auto& [id, w] : workers_) {
    ++c.workers[w.worker().state()];
    if (w.worker().state() == "ALIVE") slots += w.worker().slots();
  }
  c.slots_free = std::max<int64_t>(0, slots - c.slots_busy);
  return c;
}

std::vector<MetricsTarget> ControlState::MetricsTargets() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<MetricsTarget> out;
  for (const auto& [id, job] : jobs_) {
    if (job.job().state() != v1::RUNNING) continue;
    for (const RankRecord& r : job.ranks()) {
      if (r.state() == "RUNNING" && !r.metrics_address().empty()) {
        auto w = workers_.find(r.worker_id());
        out.push_back({id, r.rank(), r.metrics_address(),
                       w == workers_.end() ? "" : w->second.worker().name()});
      }
    }
  }
  return out;
}

absl::StatusOr<nlohmann::json> ControlState::Series(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FindJob(job_id) == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", job_id, "\""));
  auto it = series_.find(job_id);
  return it == series_.end() ? JobSeries().ToJson() : it->second.ToJson();
}

// FIFO over the pending jobs; a job that does not fit does not hold back smaller ones behind it
// that do (backfilling).
void ControlState::Schedule() {
  std::vector<FreeSlots> free;
  std::map<std::string, int> index;
  for (const auto& [id, w] : workers_) {
    if (w.worker().state() != "ALIVE") continue;
    index[id] = static_cast<int>(free.size());
    free.push_back({id, w.worker().device(), w.worker().slots()});
  }
  const std::vector<FreeSlots> capacity = free;  // every live worker, all its slots free
  std::vector<JobRecord*> pending;
  for (auto& [id, j] : jobs_) {
    for (const RankRecord& r : j.ranks()) {
      // Every rank that may still run holds its slot, also while its job stops or retries.
      if (r.state() == "EXITED" || r.state() == "LOST") continue;
      auto it = index.find(r.worker_id());
      if (it != index.end()) --free[it->second].free;
    }
    if (j.job().state() == v1::PENDING) pending.push_back(&j);
  }
  std::sort(pending.begin(), pending.end(), [](const JobRecord* a, const JobRecord* b) {
    return a->submit_order() < b->submit_order();
  });
  const int64_t now = Now();
  for (JobRecord* job : pending) {
    if (const std::string wait = RetryWait(*job); !wait.empty()) {
      SetPendingReason(job, wait, false);
      continue;
    }
    const v1::Job& j = job->job();
    const int tp = std::max(1, j.spec().layout().tp());
    const std::string device = j.spec().resources().device().empty() ? "cpu" : j.spec().resources().device();
    auto placement = PlaceGang(j.world_size(), tp, device, &free);
    if (!placement.has_value()) {
      const GangWait why = WhyNotPlaced(j.world_size(), tp, device, free, capacity);
      SetPendingReason(job, why.reason, why.never_fits);
      continue;
    }
    v1::Job* mj = job->mutable_job();
    mj->clear_pending_reason();
    if (mj->history_size() > 0 && mj->history(mj->history_size() - 1).outcome() == "retrying") {
      mj->mutable_history(mj->history_size() - 1)->set_outcome("failed (retried)");
    }
    if (options_.on_placed) {  // waited since submit, or since a retry's backoff ended
      options_.on_placed(static_cast<double>(now - std::max(j.submit_time_ms(), job->not_before_ms())) / 1000.0);
    }
    mj->set_attempts(mj->attempts() + 1);
    mj->set_state(v1::RUNNING);
    v1::Attempt* a = mj->add_history();
    a->set_number(mj->attempts());
    a->set_start_time_ms(now);
    a->set_first_failed_rank(-1);
    job->clear_ranks();
    for (int r = 0; r < j.world_size(); ++r) {
      RankRecord* rr = job->add_ranks();
      rr->set_rank(r);
      rr->set_worker_id((*placement)[r]);
      rr->set_state("ASSIGNED");
      rr->set_exit_code(-1);
      v1::RankOutcome* o = a->add_ranks();
      o->set_rank(r);
      o->set_worker(workers_[(*placement)[r]].worker().name());
      o->set_worker_id((*placement)[r]);
      o->set_state("ASSIGNED");
      o->set_exit_code(-1);
    }
    std::string where;
    for (const auto& [wid, unused] : index) {
      const int n = static_cast<int>(std::count(placement->begin(), placement->end(), wid));
      if (n > 0) absl::StrAppend(&where, where.empty() ? "" : ", ", workers_[wid].worker().name(), " x", n);
    }
    Event(job, "started", absl::StrCat("attempt ", mj->attempts(), " placed on ", where));
    (void)Save(job);
  }
}

}  // namespace satdar::coordinator
