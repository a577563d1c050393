// The control state under random interleavings (issue 28, part 2): submits, placements,
// heartbeats (some of whose answers are lost), cancels, rank exits, lost workers and
// coordinator restarts on the fake clock. However they interleave, once every job is cancelled
// or done and the workers report what they run, every job is final and every slot is free: no
// rank state waits on a report that can never come.
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "coordinator/control_state.h"
#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::coordinator {
namespace {

namespace v1 = satdar::v1;

constexpr char kConfig[] = R"({"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
  "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 64})";

using RankKey = std::tuple<std::string, int, int>;  // job, attempt, rank

// A worker as the coordinator sees it: it lists the ranks it runs, starts what an answer says
// (unless the answer was lost), stops what it is told to and reports each exit.
struct FakeWorker {
  std::string id, name, session;
  int slots = 1;
  bool alive = true;
  std::set<RankKey> running;
};

class Simulation {
 public:
  Simulation(const std::string& dir, uint32_t seed) : dir_(dir), rng_(seed) {
    (void)core::RemoveTree(dir_ + "/state.db");
    (void)core::RemoveTree(dir_ + "/state.db-wal");
    (void)core::RemoveTree(dir_ + "/state.db-shm");
    Open();
  }

  void Open() {
    state_.reset();
    auto store = Store::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    ControlOptions o;
    o.lease_ms = 3000;
    o.max_backoff_ms = 2000;
    o.now_ms = [this] { return now_; };
    auto s = ControlState::Create(std::move(*store), o);
    ASSERT_TRUE(s.ok()) << s.status();
    state_ = std::move(*s);
  }

  void AddWorker() {
    FakeWorker w;
    w.name = "w" + std::to_string(next_name_++);
    w.slots = 1 + static_cast<int>(rng_() % 3);
    v1::RegisterWorkerRequest r;
    r.set_name(w.name);
    r.set_slots(w.slots);
    r.set_device("cpu");
    auto resp = state_->Register(r);
    ASSERT_TRUE(resp.ok()) << resp.status();
    w.id = resp->worker_id();
    w.session = resp->session();
    workers_.push_back(w);
  }

  void Submit() {
    v1::SubmitJobRequest req;
    v1::JobSpec* s = req.mutable_spec();
    s->set_config_json(kConfig);
    for (auto [k, v] : {std::pair<const char*, const char*>{"steps", "10"}, {"batch_size", "2"},
                        {"seq_len", "8"}, {"synthetic_data", "true"}}) {
      v1::TrainFlag* f = s->add_train();
      f->set_name(k);
      f->set_value(v);
    }
    s->mutable_layout()->set_dp(1 + static_cast<int>(rng_() % 3));
    s->set_max_restarts(static_cast<int>(rng_() % 3));
    auto resp = state_->Submit(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    jobs_.push_back(resp->job_id());
  }

  // One heartbeat; lose_answer: the worker never sees the answer (a deadline, a dropped
  // connection), so it neither starts nor stops anything.
  void Beat(FakeWorker* w, bool lose_answer) {
    if (!w->alive) return;
    v1::HeartbeatRequest req;
    req.set_worker_id(w->id);
    for (const auto& [job, attempt, rank] : w->running) {
      v1::RankStatus* st = req.add_ranks();
      st->set_job_id(job);
      st->set_attempt(attempt);
      st->set_rank(rank);
      st->set_pid(1000 + rank);
    }
    auto resp = state_->Heartbeat(w->session, req);
    if (!resp.ok()) {  // declared lost: the real worker kills its ranks and registers again
      ASSERT_EQ(resp.status().code(), absl::StatusCode::kFailedPrecondition) << resp.status();
      w->alive = false;
      w->running.clear();
      AddWorker();
      return;
    }
    if (lose_answer) return;
    for (const v1::RankRef& stop : resp->stop()) {
      const RankKey key{stop.job_id(), stop.attempt(), stop.rank()};
      if (w->running.erase(key) > 0) Exit(*w, key, 143, 15);
    }
    for (const v1::RankAssignment& a : resp->start()) {
      w->running.insert({a.job_id(), a.attempt(), a.rank()});
    }
  }

  void Exit(const FakeWorker& w, const RankKey& key, int code, int signal) {
    v1::RankExit e;
    e.set_worker_id(w.id);
    e.set_job_id(std::get<0>(key));
    e.set_attempt(std::get<1>(key));
    e.set_rank(std::get<2>(key));
    e.set_exit_code(code);
    e.set_signal(signal);
    const absl::Status s = state_->ReportExit(w.session, e);
    ASSERT_TRUE(s.ok()) << s;
  }

  FakeWorker* AnyAlive() {
    std::vector<FakeWorker*> alive;
    for (FakeWorker& w : workers_) {
      if (w.alive) alive.push_back(&w);
    }
    return alive.empty() ? nullptr : alive[rng_() % alive.size()];
  }

  void Step() {
    const int op = static_cast<int>(rng_() % 100);
    if (op < 12) {
      Submit();
    } else if (op < 50) {
      if (FakeWorker* w = AnyAlive()) Beat(w, rng_() % 5 == 0);
    } else if (op < 60) {
      if (!jobs_.empty()) (void)state_->Cancel(jobs_[rng_() % jobs_.size()]);
    } else if (op < 72) {  // a rank ends by itself: success or a crash
      FakeWorker* w = AnyAlive();
      if (w != nullptr && !w->running.empty()) {
        auto it = w->running.begin();
        std::advance(it, rng_() % w->running.size());
        const RankKey key = *it;
        w->running.erase(it);
        Exit(*w, key, rng_() % 3 == 0 ? 1 : 0, 0);
      }
    } else if (op < 76) {  // a worker dies: its lease runs out
      if (FakeWorker* w = AnyAlive()) {
        w->alive = false;
        w->running.clear();
        now_ += 3500;
        state_->Tick();
        AddWorker();
      }
    } else if (op < 79) {
      Open();  // the coordinator restarts (SIGKILL: everything it answered is stored)
    } else {
      now_ += static_cast<int64_t>(rng_() % 1500);
      // Live workers keep their leases (by index: a lost one registers anew, which grows
      // workers_ under the loop).
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (workers_[i].alive && rng_() % 2 == 0) Beat(&workers_[i], false);
      }
      state_->Tick();
    }
  }

  // Cancels what is left, then lets the live workers report until nothing changes.
  void Drain() {
    for (const std::string& id : jobs_) (void)state_->Cancel(id);
    for (int round = 0; round < 20; ++round) {
      now_ += 500;
      for (size_t i = 0; i < workers_.size(); ++i) Beat(&workers_[i], false);
      state_->Tick();
    }
  }

  void CheckEverythingFinalAndFree(uint32_t seed) {
    for (const std::string& id : jobs_) {
      auto j = state_->GetJob(id, true);
      ASSERT_TRUE(j.ok()) << j.status();
      EXPECT_TRUE(j->state() == v1::SUCCEEDED || j->state() == v1::FAILED ||
                  j->state() == v1::CANCELLED)
          << "seed " << seed << ": job " << id << " is " << v1::JobState_Name(j->state());
    }
    const StateCounts counts = state_->Counts();
    EXPECT_EQ(counts.slots_busy, 0) << "seed " << seed << ": slots still busy";
    for (const FakeWorker& w : workers_) {
      EXPECT_TRUE(w.running.empty()) << "seed " << seed << ": " << w.name << " still runs ranks";
    }
  }

 private:
  std::string dir_;
  std::mt19937 rng_;
  int64_t now_ = 1'000'000;
  int next_name_ = 0;
  std::unique_ptr<ControlState> state_;
  std::vector<FakeWorker> workers_;
  std::vector<std::string> jobs_;
};

TEST(ControlStateRandom, EveryInterleavingEndsWithFinalJobsAndFreeSlots) {
  const std::string dir = core::testing::TestTmpDir("control_random");
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    Simulation sim(dir, seed);
    for (int w = 0; w < 3; ++w) sim.AddWorker();
    for (int i = 0; i < 250; ++i) sim.Step();
    sim.Drain();
    sim.CheckEverythingFinalAndFree(seed);
    if (testing::Test::HasFailure()) break;
  }
}

// A coordinator on the fake clock with one 1-slot worker "w", for the single cases below.
struct OneWorker {
  int64_t now = 1'000'000;
  std::unique_ptr<ControlState> state;
  std::string worker, session;

  explicit OneWorker(const std::string& name) {
    const std::string dir = core::testing::TestTmpDir(name);
    (void)core::RemoveTree(dir + "/state.db");
    auto store = Store::Open(dir);
    EXPECT_TRUE(store.ok()) << store.status();
    ControlOptions o;
    o.now_ms = [this] { return now; };
    auto s = ControlState::Create(std::move(*store), o);
    EXPECT_TRUE(s.ok()) << s.status();
    state = std::move(*s);
    v1::RegisterWorkerRequest r;
    r.set_name("w");
    r.set_slots(1);
    r.set_device("cpu");
    auto registered = state->Register(r);
    EXPECT_TRUE(registered.ok()) << registered.status();
    worker = registered->worker_id();
    session = registered->session();
  }
  absl::StatusOr<v1::SubmitJobResponse> Submit(const std::string& request_id, int max_restarts) {
    v1::SubmitJobRequest req;
    req.set_request_id(request_id);
    req.mutable_spec()->set_config_json(kConfig);
    for (auto [k, v] : {std::pair<const char*, const char*>{"steps", "10"}, {"batch_size", "2"},
                        {"seq_len", "8"}, {"synthetic_data", "true"}}) {
      v1::TrainFlag* f = req.mutable_spec()->add_train();
      f->set_name(k);
      f->set_value(v);
    }
    req.mutable_spec()->set_max_restarts(max_restarts);
    return state->Submit(req);
  }
};

// The case the random walk found first, written out: a job cancelled after its rank was
// placed but before any heartbeat handed the rank to its worker.
TEST(ControlStateRandom, ACancelBeforeTheWorkerStartedTheRankFreesTheSlot) {
  OneWorker c("control_cancel_early");
  auto first = c.Submit("", 0);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(c.state->Counts().slots_busy, 1);  // placed at once
  ASSERT_TRUE(c.state->Cancel(first->job_id()).ok());
  auto second = c.Submit("second", 0);
  ASSERT_TRUE(second.ok());
  // The worker's next heartbeat runs nothing: the cancelled rank never ran, its slot is free,
  // and the second job is handed to the worker in the same answer.
  v1::HeartbeatRequest beat;
  beat.set_worker_id(c.worker);
  auto resp = c.state->Heartbeat(c.session, beat);
  ASSERT_TRUE(resp.ok());
  ASSERT_EQ(resp->start_size(), 1);
  EXPECT_EQ(resp->start(0).job_id(), second->job_id());
  auto j = c.state->GetJob(first->job_id(), true);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state(), v1::CANCELLED);
  EXPECT_EQ(j->history(0).ranks(0).state(), "EXITED");
}

// A failed rank is quoted by its error line ("satdar train: error: ..."), not by whatever it
// printed last; and its rank lease ends with its attempt.
TEST(ControlStateRandom, AFailureQuotesTheErrorLineAndFencesTheLease) {
  OneWorker c("control_error_line");
  auto job = c.Submit("", 1);
  ASSERT_TRUE(job.ok());
  v1::RankLeaseRequest lease;
  lease.set_job_id(job->job_id());
  lease.set_attempt(1);
  lease.set_rank(0);
  auto granted = c.state->RenewRankLease(c.session, lease);
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(granted->lease_ms(), ControlOptions().lease_ms);
  v1::RankExit e;
  e.set_worker_id(c.worker);
  e.set_job_id(job->job_id());
  e.set_attempt(1);
  e.set_rank(0);
  e.set_exit_code(1);
  e.add_last_lines("step 3/10 | loss 4.1");
  e.add_last_lines("satdar train: error: rank 0 (dp=1), step 4: cannot write ck: disk full");
  e.add_last_lines("some library's parting words");
  ASSERT_TRUE(c.state->ReportExit(c.session, e).ok());
  auto j = c.state->GetJob(job->job_id(), true);
  ASSERT_TRUE(j.ok());
  EXPECT_NE(j->history(0).reason().find("satdar train: error: rank 0 (dp=1), step 4: cannot write "
                                        "ck: disk full"),
            std::string::npos)
      << j->history(0).reason();
  // Attempt 1 is over: its lease is refused, and the retry waits for it to run out.
  auto fenced = c.state->RenewRankLease(c.session, lease);
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kFailedPrecondition) << fenced.status();
}

}  // namespace
}  // namespace satdar::coordinator
