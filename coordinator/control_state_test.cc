#include "coordinator/control_state.h"

#include <sys/stat.h>

#include <algorithm>
#include <string>

#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::coordinator {
namespace {

namespace v1 = satdar::v1;

constexpr char kConfig[] = R"({"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
  "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 64})";

// A coordinator over a fresh state folder with a clock the test moves.
class ControlStateTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = core::testing::TestTmpDir(testing::UnitTest::GetInstance()->current_test_info()->name());
    (void)core::RemoveTree(dir_ + "/state.db");
    (void)core::RemoveTree(dir_ + "/state.db-wal");
    Open();
  }
  void Open() {
    state_.reset();
    auto store = Store::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    ControlOptions o;
    o.lease_ms = 3000;
    o.now_ms = [this] { return now_; };
    auto s = ControlState::Create(std::move(*store), o);
    ASSERT_TRUE(s.ok()) << s.status();
    state_ = std::move(*s);
  }
  std::string Worker(const std::string& name, int slots) {
    v1::RegisterWorkerRequest r;
    r.set_name(name);
    r.set_slots(slots);
    r.set_device("cpu");
    auto resp = state_->Register(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    if (!resp.ok()) return "";
    sessions_[resp->worker_id()] = resp->session();
    return resp->worker_id();
  }
  // The session Register gave `worker` (what its calls carry).
  std::string S(const std::string& worker) { return sessions_[worker]; }
  absl::StatusOr<std::string> Submit(int dp, int max_restarts, const std::string& request = "",
                                     int tp = 1) {
    v1::SubmitJobRequest req;
    req.set_request_id(request);
    v1::JobSpec* s = req.mutable_spec();
    s->set_config_json(kConfig);
    for (auto [k, v] : {std::pair<const char*, const char*>{"steps", "10"}, {"batch_size", "2"},
                        {"seq_len", "8"}, {"synthetic_data", "true"}}) {
      v1::TrainFlag* f = s->add_train();
      f->set_name(k);
      f->set_value(v);
    }
    s->mutable_layout()->set_dp(dp);
    s->mutable_layout()->set_tp(tp);
    s->set_max_restarts(max_restarts);
    auto resp = state_->Submit(req);
    if (!resp.ok()) return resp.status();
    return resp->job_id();
  }
  // The worker's heartbeat, claiming the ranks it runs.
  v1::HeartbeatResponse Beat(const std::string& worker, const std::vector<v1::RankStatus>& ranks) {
    v1::HeartbeatRequest req;
    req.set_worker_id(worker);
    for (const auto& r : ranks) *req.add_ranks() = r;
    auto resp = state_->Heartbeat(S(worker), req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : v1::HeartbeatResponse();
  }
  static v1::RankStatus Running(const v1::RankAssignment& a) {
    v1::RankStatus s;
    s.set_job_id(a.job_id());
    s.set_attempt(a.attempt());
    s.set_rank(a.rank());
    s.set_pid(1000 + a.rank());
    return s;
  }
  absl::Status Exit(const std::string& worker, const std::string& job, int attempt, int rank,
                    int code, int signal = 0) {
    v1::RankExit e;
    e.set_worker_id(worker);
    e.set_job_id(job);
    e.set_attempt(attempt);
    e.set_rank(rank);
    e.set_exit_code(code);
    e.set_signal(signal);
    e.add_last_lines("last words of rank " + std::to_string(rank));
    return state_->ReportExit(S(worker), e);
  }
  v1::Job Job(const std::string& id) {
    auto j = state_->GetJob(id, true);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? *j : v1::Job();
  }

  std::string dir_;
  int64_t now_ = 1'000'000;
  std::unique_ptr<ControlState> state_;
  std::map<std::string, std::string> sessions_;  // worker id -> session
};

// A request id names one submission: the same spec again is that job, another spec under it is
// refused (also after a restart of the coordinator), and nothing new is stored.
TEST_F(ControlStateTest, ARequestIdWithAnotherSpecIsRefused) {
  auto id = Submit(2, 0, "req-x");
  ASSERT_TRUE(id.ok()) << id.status();
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(*Submit(2, 0, "req-x"), *id);
    auto other = Submit(1, 0, "req-x");
    EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(other.status().message(),
              "request_id: already used by " + *id +
                  " with a different job spec; a new job needs a new request_id");
    EXPECT_EQ(Submit(2, 1, "req-x").status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(state_->ListJobs(v1::ListJobsRequest()).size(), 1u);
    Open();  // the request ids survive a restart with their specs
  }
}

TEST_F(ControlStateTest, GangRunsToSuccessAndSubmitIsIdempotent) {
  const std::string a = Worker("a", 1), b = Worker("b", 1);
  auto id = Submit(2, 0, "req-1");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*Submit(2, 0, "req-1"), *id);  // the same request id: the same job
  EXPECT_EQ(Job(*id).state(), v1::RUNNING);
  EXPECT_EQ(Job(*id).attempts(), 1);
  auto ra = Beat(a, {}), rb = Beat(b, {});
  ASSERT_EQ(ra.start_size(), 1);
  ASSERT_EQ(rb.start_size(), 1);
  EXPECT_NE(ra.start(0).rank(), rb.start(0).rank());
  // Until the worker says it runs the rank, the assignment is sent again; then no more.
  EXPECT_EQ(Beat(a, {}).start_size(), 1);
  EXPECT_EQ(Beat(a, {Running(ra.start(0))}).start_size(), 0);
  ASSERT_TRUE(Exit(a, *id, 1, ra.start(0).rank(), 0).ok());
  EXPECT_EQ(Job(*id).state(), v1::RUNNING);
  ASSERT_TRUE(Exit(b, *id, 1, rb.start(0).rank(), 0).ok());
  EXPECT_EQ(Job(*id).state(), v1::SUCCEEDED);
  EXPECT_EQ(Job(*id).exit_code(), 0);
}

TEST_F(ControlStateTest, BadSpecStoresNothing) {
  Worker("a", 4);
  v1::SubmitJobRequest req;
  req.mutable_spec()->set_config_json(kConfig);
  v1::TrainFlag* f = req.mutable_spec()->add_train();
  f->set_name("steps");
  f->set_value("ten");
  auto resp = state_->Submit(req);
  ASSERT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(resp.status().message().find("job spec: missing required train.batch_size"),
            std::string::npos)
      << resp.status();
  EXPECT_TRUE(state_->ListJobs({}).empty());
}

TEST_F(ControlStateTest, QueueIsFifoWithBackfill) {
  const std::string w = Worker("a", 2);
  auto big1 = Submit(2, 0), big2 = Submit(2, 0), small = Submit(1, 0);
  ASSERT_TRUE(big1.ok() && big2.ok() && small.ok());
  EXPECT_EQ(Job(*big1).state(), v1::RUNNING);
  EXPECT_EQ(Job(*big2).state(), v1::PENDING);
  EXPECT_EQ(Job(*small).state(), v1::PENDING);
  auto r = Beat(w, {});
  ASSERT_EQ(r.start_size(), 2);
  ASSERT_TRUE(Exit(w, *big1, 1, 0, 0).ok());
  ASSERT_TRUE(Exit(w, *big1, 1, 1, 0).ok());
  state_->Tick();
  EXPECT_EQ(Job(*big2).state(), v1::RUNNING);  // FIFO: the older job first
  EXPECT_EQ(Job(*small).state(), v1::PENDING);
}

TEST_F(ControlStateTest, ExitCodeTwoFailsAtOnceOtherFailuresRetryWithBackoff) {
  const std::string w = Worker("a", 2);
  auto bad = Submit(1, 3);
  ASSERT_TRUE(bad.ok());
  ASSERT_TRUE(Exit(w, *bad, 1, 0, 2).ok());
  EXPECT_EQ(Job(*bad).state(), v1::FAILED);
  EXPECT_EQ(Job(*bad).attempts(), 1);
  EXPECT_NE(Job(*bad).reason().find("exited with code 2: last words of rank 0"), std::string::npos)
      << Job(*bad).reason();
  auto flaky = Submit(2, 1);
  ASSERT_TRUE(flaky.ok());
  Beat(w, {});
  ASSERT_TRUE(Exit(w, *flaky, 1, 1, 1).ok());
  v1::Job j = Job(*flaky);
  EXPECT_EQ(j.state(), v1::PENDING);
  EXPECT_EQ(j.history(0).outcome(), "retrying");
  EXPECT_EQ(j.history(0).first_failed_rank(), 1);
  // Rank 0 of the failed gang is told to stop; the retry waits for it and for the backoff.
  v1::RankStatus r0;
  r0.set_job_id(*flaky);
  r0.set_attempt(1);
  r0.set_rank(0);
  auto beat = Beat(w, {r0});
  ASSERT_EQ(beat.stop_size(), 1);
  EXPECT_EQ(beat.stop(0).rank(), 0);
  ASSERT_TRUE(Exit(w, *flaky, 1, 0, -1, 15).ok());
  state_->Tick();
  EXPECT_EQ(Job(*flaky).attempts(), 1);  // backoff: 1 s
  now_ += 1500;
  state_->Tick();
  EXPECT_EQ(Job(*flaky).attempts(), 2);
  EXPECT_EQ(Job(*flaky).state(), v1::RUNNING);
  EXPECT_EQ(Job(*flaky).history(0).outcome(), "failed (retried)");  // no longer "retrying"
  // A report of the old attempt changes nothing (fencing).
  ASSERT_TRUE(Exit(w, *flaky, 1, 0, 1).ok());
  EXPECT_EQ(Job(*flaky).state(), v1::RUNNING);
  ASSERT_TRUE(Exit(w, *flaky, 2, 1, 1).ok());
  EXPECT_EQ(Job(*flaky).state(), v1::FAILED);
  EXPECT_NE(Job(*flaky).reason().find("gave up after 2 attempt(s) (max_restarts 1)"),
            std::string::npos)
      << Job(*flaky).reason();
  EXPECT_EQ(Job(*flaky).history(0).outcome(), "failed (retried)");
  EXPECT_EQ(Job(*flaky).history(1).outcome(), "failed");
}

TEST_F(ControlStateTest, AJobCancelledBeforeItsRetryStartedReadsFailed) {
  const std::string w = Worker("a", 1);
  auto id = Submit(1, 3);
  ASSERT_TRUE(id.ok());
  Beat(w, {});
  ASSERT_TRUE(Exit(w, *id, 1, 0, 1).ok());
  EXPECT_EQ(Job(*id).history(0).outcome(), "retrying");
  ASSERT_TRUE(state_->Cancel(*id).ok());  // during the backoff
  const v1::Job j = Job(*id);
  EXPECT_EQ(j.state(), v1::CANCELLED);
  ASSERT_EQ(j.history_size(), 1);
  EXPECT_EQ(j.history(0).outcome(), "failed");  // it was never retried
  EXPECT_EQ(j.pending_reason(), "");
}

TEST_F(ControlStateTest, PendingJobsSayWhyTheyWait) {
  auto early = Submit(1, 0);
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(Job(*early).pending_reason(),
            "waiting: needs 1 slot, no worker is registered; it starts once enough workers "
            "register");
  const std::string a = Worker("a", 1), b = Worker("b", 1);
  EXPECT_EQ(Job(*early).state(), v1::RUNNING);  // placed when a worker registered
  EXPECT_EQ(Job(*early).pending_reason(), "");
  // 8 ranks on 2 slots in all: it can never start, and says so (also in lists and events).
  auto huge = Submit(8, 0);
  ASSERT_TRUE(huge.ok());
  const std::string never =
      "waiting: needs 8 slots, the 2 registered workers have 2; it starts once enough workers "
      "register";
  EXPECT_EQ(Job(*huge).state(), v1::PENDING);
  EXPECT_EQ(Job(*huge).pending_reason(), never);
  bool listed = false;
  for (const v1::Job& j : state_->ListJobs({})) {
    if (j.job_id() == *huge) listed = j.pending_reason() == never;
  }
  EXPECT_TRUE(listed);
  std::vector<v1::JobEvent> events;
  bool final;
  ASSERT_TRUE(state_->Events(*huge, 0, 0, &events, &final).ok());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].kind(), "waiting");
  EXPECT_EQ(events[1].message(), never);
  state_->Tick();
  state_->Tick();
  events.clear();
  ASSERT_TRUE(state_->Events(*huge, 0, 0, &events, &final).ok());
  EXPECT_EQ(events.size(), 2u);  // said once, not at every tick
  // A job that fits but not now: how many slots it waits for.
  auto next = Submit(2, 0);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(Job(*next).pending_reason(), "waiting for 2 free slots (1 free)");
  // TP groups must each fit on one worker: 4 slots in all, but room for one group of 2 only.
  const std::string c = Worker("c", 3);
  auto grouped = Submit(4, 0, "", 2);  // dp 4 x tp 2: 8 ranks
  ASSERT_TRUE(grouped.ok());
  EXPECT_EQ(Job(*grouped).pending_reason(),
            "waiting: needs 8 slots in groups of 2 on one worker (TP 2), the 3 registered workers "
            "have room for 2 (5 slots); it starts once enough workers register");
  EXPECT_EQ(Job(*next).state(), v1::RUNNING);  // c's slots
  auto tp_wait = Submit(1, 0, "", 2);
  ASSERT_TRUE(tp_wait.ok());
  EXPECT_EQ(Job(*tp_wait).pending_reason(),
            "waiting for 2 free slots in groups of 2 on one worker (TP 2; 2 free, room for 0)");
}

TEST_F(ControlStateTest, ARetryingJobSaysWhatItWaitsFor) {
  const std::string a = Worker("a", 1), b = Worker("b", 1);
  auto id = Submit(2, 1);
  ASSERT_TRUE(id.ok());
  auto ra = Beat(a, {}), rb = Beat(b, {});
  ASSERT_EQ(ra.start_size(), 1);
  ASSERT_EQ(rb.start_size(), 1);
  ASSERT_TRUE(Exit(a, *id, 1, ra.start(0).rank(), 1).ok());
  EXPECT_EQ(Job(*id).state(), v1::PENDING);
  EXPECT_EQ(Job(*id).pending_reason(), "waiting for the ranks of attempt 1 to stop");
  ASSERT_TRUE(Exit(b, *id, 1, rb.start(0).rank(), -1, 15).ok());
  state_->Tick();
  EXPECT_EQ(Job(*id).pending_reason(), "waiting to retry (backoff): attempt 2 in 1 s");
  now_ += 1500;
  state_->Tick();
  EXPECT_EQ(Job(*id).state(), v1::RUNNING);
  EXPECT_EQ(Job(*id).pending_reason(), "");
}

TEST_F(ControlStateTest, LostWorkerRestartsTheGangElsewhere) {
  const std::string a = Worker("a", 1), b = Worker("b", 1);
  auto id = Submit(2, 2);
  ASSERT_TRUE(id.ok());
  auto ra = Beat(a, {});
  auto rb = Beat(b, {});
  ASSERT_EQ(ra.start_size(), 1);
  now_ += 2000;
  Beat(a, {Running(ra.start(0))});  // a stays alive, b goes silent
  now_ += 2000;
  state_->Tick();
  v1::Job j = Job(*id);
  EXPECT_EQ(j.state(), v1::PENDING);
  EXPECT_NE(j.history(0).reason().find("worker b was lost"), std::string::npos)
      << j.history(0).reason();
  // A heartbeat from the lost worker is refused; it must register again.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(b);
  EXPECT_EQ(state_->Heartbeat(S(b), hb).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Exit(a, *id, 1, ra.start(0).rank(), -1, 15).ok());
  const std::string c = Worker("c", 1);
  now_ += 1500;  // the retry's backoff has ended, but a lost rank's own lease has not
  Beat(a, {});
  Beat(c, {});
  state_->Tick();
  EXPECT_EQ(Job(*id).attempts(), 1) << "a newer attempt before the lost rank's lease ran out";
  now_ += 1600;  // one lease (3 s) after the loss: the rank on b has stopped by now
  Beat(a, {});
  Beat(c, {});
  state_->Tick();
  EXPECT_EQ(Job(*id).attempts(), 2);
  EXPECT_EQ(Beat(c, {}).start_size(), 1);
}

TEST_F(ControlStateTest, CancelStopsRanksAndRegisteringTwiceIsRefused) {
  const std::string a = Worker("a", 1);
  v1::RegisterWorkerRequest again;
  again.set_name("a");
  again.set_slots(1);
  again.set_device("cpu");
  EXPECT_EQ(state_->Register(again).status().code(), absl::StatusCode::kAlreadyExists);
  auto id = Submit(1, 0);
  auto r = Beat(a, {});
  ASSERT_EQ(r.start_size(), 1);
  auto cancelled = state_->Cancel(*id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  auto beat = Beat(a, {Running(r.start(0))});
  ASSERT_EQ(beat.stop_size(), 1);
  ASSERT_TRUE(Exit(a, *id, 1, 0, -1, 15).ok());
  EXPECT_EQ(Job(*id).state(), v1::CANCELLED);
}

TEST_F(ControlStateTest, EverythingSurvivesARestart) {
  const std::string a = Worker("a", 1);
  auto id = Submit(1, 0, "req-9");
  auto r = Beat(a, {});
  ASSERT_EQ(r.start_size(), 1);
  v1::LogUpload up;
  up.set_worker_id(a);
  up.set_job_id(*id);
  up.set_attempt(1);
  up.set_rank(0);
  up.add_lines("step 1/10 | loss 4.0");
  ASSERT_TRUE(state_->UploadLogs(S(a), up).ok());
  v1::KvSetRequest kv;
  kv.set_job_id(*id);
  kv.set_attempt(1);
  kv.set_key("gloo/rank0");
  kv.set_value("127.0.0.1:1234");
  ASSERT_TRUE(state_->KvSet(S(a), kv).ok());
  Open();  // the coordinator restarts on the same folder
  v1::Job j = Job(*id);
  EXPECT_EQ(j.state(), v1::RUNNING);
  EXPECT_EQ(j.attempts(), 1);
  EXPECT_EQ(*Submit(1, 0, "req-9"), *id);
  // The worker's lease is fresh; its running rank is not started again.
  EXPECT_EQ(Beat(a, {Running(r.start(0))}).start_size(), 0);
  std::vector<v1::LogLine> lines;
  bool final;
  ASSERT_TRUE(state_->Logs(*id, -1, 0, 100, false, 0, &lines, &final).ok());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].text(), "step 1/10 | loss 4.0");
  v1::KvGetRequest get;
  get.set_job_id(*id);
  get.set_attempt(1);
  get.set_key("gloo/rank0");
  auto got = state_->KvGet(S(a), get);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->value(), "127.0.0.1:1234");
  std::vector<v1::JobEvent> events;
  ASSERT_TRUE(state_->Events(*id, 0, 0, &events, &final).ok());
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0].kind(), "submitted");
  EXPECT_EQ(events[1].kind(), "started");
  ASSERT_TRUE(Exit(a, *id, 1, 0, 0).ok());
  EXPECT_EQ(Job(*id).state(), v1::SUCCEEDED);
}

TEST_F(ControlStateTest, RunningRanksAreMetricsTargetsAndRankZerosRecordsItsSeries) {
  const std::string a = Worker("a", 1), b = Worker("b", 1);
  auto id = Submit(2, 1);
  ASSERT_TRUE(id.ok()) << id.status();
  auto ra = Beat(a, {}), rb = Beat(b, {});
  ASSERT_EQ(ra.start_size(), 1);
  v1::RankStatus sa = Running(ra.start(0)), sb = Running(rb.start(0));
  Beat(a, {sa});
  Beat(b, {sb});
  EXPECT_TRUE(state_->MetricsTargets().empty());  // running, but not serving yet
  sa.set_metrics_address("127.0.0.1:9001");
  sb.set_metrics_address("127.0.0.1:9002");
  v1::RankStatus& zero = sa.rank() == 0 ? sa : sb;
  zero.add_records(R"({"step": 1, "loss": 5.0, "tokens_per_second": 100,
                       "phase_seconds": {"compute": 0.5}})");
  zero.add_records("not json");  // skipped
  zero.add_records(R"({"step": 2, "loss": 4.5, "stats": {"satformer_gate_zero_fraction": [[0.25]]}})");
  Beat(a, {sa});
  Beat(b, {sb});
  std::vector<MetricsTarget> t = state_->MetricsTargets();
  ASSERT_EQ(t.size(), 2u);
  std::sort(t.begin(), t.end(), [](auto& x, auto& y) { return x.rank < y.rank; });
  EXPECT_EQ(t[0].job_id, *id);
  EXPECT_EQ(t[0].address, zero.metrics_address());
  EXPECT_FALSE(t[0].worker.empty());
  auto series = state_->Series(*id);
  ASSERT_TRUE(series.ok()) << series.status();
  ASSERT_EQ((*series)["points"].size(), 2u);
  EXPECT_EQ((*series)["points"][1][2], 4.5);  // step, time_ms, loss, ...
  EXPECT_EQ((*series)["stats"]["gate_zero"][0][0], 0.25);
  EXPECT_EQ(state_->Series("job-nope").status().code(), absl::StatusCode::kNotFound);

  StateCounts c = state_->Counts();
  EXPECT_EQ(c.jobs["RUNNING"], 1);
  EXPECT_EQ(c.workers["ALIVE"], 2);
  EXPECT_EQ(c.slots_busy, 2);
  EXPECT_EQ(c.slots_free, 0);
  EXPECT_EQ(c.restarts, 0);
  // A failed rank: the attempt ends, the targets go, and the retry counts as a restart.
  ASSERT_TRUE(Exit(a, *id, 1, sa.rank(), 1).ok());
  EXPECT_TRUE(state_->MetricsTargets().empty());
  ASSERT_TRUE(Exit(b, *id, 1, sb.rank(), -1, 15).ok());  // the gang's other rank, stopped
  now_ += 1500;  // the backoff (1 s), within the workers' lease
  state_->Tick();
  EXPECT_EQ(state_->Counts().restarts, 1);

  // The series outlives a coordinator restart (written by Flush, read back on open).
  state_->Flush();
  Open();
  auto again = state_->Series(*id);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)["points"].size(), 2u);
  EXPECT_EQ((*again)["stats"]["gate_zero"][0][0], 0.25);
}

// A worker speaks only for itself: with its own valid session, worker b can neither speak as
// a nor touch a's ranks (progress, exit, logs, rendezvous keys, rank lease); a's calls work,
// also after a restart of the coordinator, and for its older attempts they are ignored, not
// refused. Worker ids are random.
TEST_F(ControlStateTest, AWorkerSpeaksOnlyForItself) {
  std::string a = Worker("a", 1), b = Worker("b", 1);
  for (const std::string& id : {a, b}) {
    ASSERT_EQ(id.size(), 23u) << id;  // "worker-" and 16 hex digits
    EXPECT_EQ(id.substr(0, 7), "worker-");
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 7), std::string::npos) << id;
  }
  EXPECT_NE(a, b);
  EXPECT_EQ(S(a).size(), 64u);
  auto id = Submit(1, 1);
  ASSERT_TRUE(id.ok());
  // a: the worker the job's rank went to; b: the other one.
  if (Job(*id).history(0).ranks(0).worker_id() != a) std::swap(a, b);
  auto ra = Beat(a, {});
  ASSERT_EQ(ra.start_size(), 1);
  Beat(a, {Running(ra.start(0))});
  const auto denied = absl::StatusCode::kPermissionDenied;
  // b's heartbeat as a; with no session; with a made-up one.
  v1::HeartbeatRequest as_a;
  as_a.set_worker_id(a);
  EXPECT_EQ(state_->Heartbeat(S(b), as_a).status().code(), denied);
  EXPECT_EQ(state_->Heartbeat("", as_a).status().code(), denied);
  EXPECT_EQ(state_->Heartbeat(std::string(64, '0'), as_a).status().code(), denied);
  // b reporting a's rank: progress, loss and a metrics address.
  v1::RankStatus forged = Running(ra.start(0));
  forged.set_step(999999);
  forged.set_loss(0.001);
  forged.set_metrics_address("10.6.6.6:9999");
  v1::HeartbeatRequest hb;
  hb.set_worker_id(b);
  *hb.add_ranks() = forged;
  auto beat = state_->Heartbeat(S(b), hb);
  EXPECT_EQ(beat.status().code(), denied) << beat.status();
  EXPECT_EQ(Job(*id).step(), 0);
  EXPECT_TRUE(state_->MetricsTargets().empty());
  // b reporting a's rank's exit (as itself, and as a).
  EXPECT_EQ(Exit(b, *id, 1, 0, 0).code(), denied);
  v1::RankExit as_a_exit;
  as_a_exit.set_worker_id(a);
  as_a_exit.set_job_id(*id);
  as_a_exit.set_attempt(1);
  as_a_exit.set_exit_code(0);
  EXPECT_EQ(state_->ReportExit(S(b), as_a_exit).code(), denied);
  EXPECT_EQ(Job(*id).state(), v1::RUNNING);
  // b's log lines, rendezvous keys and rank lease for a's job.
  v1::LogUpload up;
  up.set_worker_id(b);
  up.set_job_id(*id);
  up.set_attempt(1);
  up.add_lines("forged");
  EXPECT_EQ(state_->UploadLogs(S(b), up).code(), denied);
  v1::KvSetRequest kv;
  kv.set_job_id(*id);
  kv.set_attempt(1);
  kv.set_key("gloo/rank0");
  kv.set_value("10.6.6.6:1");
  EXPECT_EQ(state_->KvSet(S(b), kv).code(), denied);
  v1::KvGetRequest get;
  get.set_job_id(*id);
  get.set_attempt(1);
  get.set_key("gloo/rank0");
  EXPECT_EQ(state_->KvGet(S(b), get).status().code(), denied);
  EXPECT_EQ(state_->KvGet("", get).status().code(), denied);
  v1::RankLeaseRequest lease;
  lease.set_job_id(*id);
  lease.set_attempt(1);
  lease.set_rank(0);
  EXPECT_EQ(state_->RenewRankLease(S(b), lease).status().code(), denied);
  std::vector<v1::LogLine> lines;
  bool final;
  ASSERT_TRUE(state_->Logs(*id, -1, 0, 100, false, 0, &lines, &final).ok());
  EXPECT_TRUE(lines.empty());
  // a's own calls work, also after a restart (the sessions are kept, as their hashes).
  Open();
  up.set_worker_id(a);
  EXPECT_TRUE(state_->UploadLogs(S(a), up).ok());
  EXPECT_TRUE(state_->KvSet(S(a), kv).ok());
  EXPECT_TRUE(state_->RenewRankLease(S(a), lease).ok());
  EXPECT_EQ(state_->RenewRankLease(S(b), lease).status().code(), denied);
  // Attempt 1 fails; attempt 2 runs on b. a's reports of attempt 1 are ignored (its own),
  // b's of attempt 1 still refused, and b may now use attempt 2's store.
  ASSERT_TRUE(Exit(a, *id, 1, 0, 1).ok());
  now_ += 5000;
  Beat(a, {});
  Beat(b, {});
  state_->Tick();
  // Placed on either worker: the fence holds for the other.
  const v1::Job j = Job(*id);
  ASSERT_EQ(j.attempts(), 2) << j.pending_reason();
  const std::string holder = j.history(1).ranks(0).worker_id();
  ASSERT_TRUE(holder == a || holder == b) << holder;
  const std::string other = holder == a ? b : a;
  EXPECT_TRUE(Exit(a, *id, 1, 0, 1).ok());  // an old report of a's own: ignored
  EXPECT_EQ(Exit(b, *id, 1, 0, 0).code(), denied);
  kv.set_attempt(2);
  EXPECT_TRUE(state_->KvSet(S(holder), kv).ok());
  EXPECT_EQ(state_->KvSet(S(other), kv).code(), denied);
  get.set_attempt(1);
  EXPECT_EQ(state_->KvGet(S(a), get).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace satdar::coordinator
