#include "agent/agent.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/address.h"
#include "core/check.h"
#include "core/device.h"
#include "core/file_util.h"
#include "core/folder_lock.h"
#include "core/timestamp.h"
#include "proto/satdar/v1/control.grpc.pb.h"
#include "agent/jsonl_tail.h"
#include "agent/rank_process.h"

namespace satdar::agent {

namespace {

namespace v1 = satdar::v1;
using Clock = std::chrono::steady_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

using RankKey = std::tuple<std::string, int, int>;  // job, attempt, rank

std::string KeyString(const RankKey& k) {
  return absl::StrCat(std::get<0>(k), " attempt ", std::get<1>(k), " rank ", std::get<2>(k));
}

// Field 22 of /proc/<pid>/stat: when the process started (tells a pid's reuse apart).
std::string StartTime(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return "";
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  return fields.size() > 19 ? fields[19] : "";
}

struct Running {
  RankKey key;
  std::unique_ptr<RankProcess> process;
  int64_t kill_at_ms = 0;  // SIGTERM sent; SIGKILL then
  std::unique_ptr<JsonlTail> log;  // global rank 0: its --log-jsonl, for the dashboard
  std::deque<std::string> records;   // read from `log`, not yet delivered by a heartbeat
  int64_t record_bytes = 0;
};

// Step records a worker holds for the coordinator: per rank at most kMaxPendingRecordBytes
// (older ones are dropped first: the dashboard's series is decimated anyway), per heartbeat at
// most kMaxRecordBytesPerBeat over all its ranks (the rest goes with the next one).
constexpr int64_t kMaxPendingRecordBytes = 4 << 20;
constexpr int64_t kMaxRecordBytesPerBeat = 2 << 20;

class Agent {
 public:
  Agent(AgentOptions o, std::string token, std::shared_ptr<grpc::Channel> channel)
      : o_(std::move(o)), token_(std::move(token)), stub_(v1::WorkerService::NewStub(channel)) {}

  absl::Status Run(const std::atomic<bool>* stop);

 private:
  absl::Status Register(const std::atomic<bool>* stop);
  void Reap();
  void UploadLines();
  void SendExits();
  // False when the coordinator no longer knows this worker (register again).
  bool HeartbeatOnce();
  // Reads rank 0's new step records and puts what the budget allows into req's rank
  // statuses (in running_ order); Delivered drops those once the heartbeat succeeded.
  void TakeRecords(v1::HeartbeatRequest* req);
  void Delivered();
  absl::Status Start(const v1::RankAssignment& a);
  void StopRank(Running* r);
  void KillAll();
  void SavePids();
  void KillOrphans();
  void Say(const std::string& text) {
    if (!o_.quiet) {
      std::printf("%s worker %s: %s\n", core::UtcTimestamp().c_str(), o_.name.c_str(),
                  text.c_str());
      std::fflush(stdout);
    }
  }

  AgentOptions o_;
  std::string token_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string worker_id_;
  std::string session_;  // from RegisterWorker: names this worker on every later call
  int64_t heartbeat_ms_ = 1000, lease_ms_ = 10000;
  // The deadline of the calls of one beat (heartbeat, log lines, exits): a third of the lease,
  // 0.5 to 10 s, so that calls stuck on a connection that went away (a coordinator killed and
  // restarted) cannot hold the beat past the lease the restarted coordinator grants.
  absl::Duration BeatDeadline() const {
    return absl::Milliseconds(std::clamp<int64_t>(lease_ms_ / 3, 500, 10000));
  }
  int64_t last_ok_ms_ = 0;
  std::vector<Running> running_;
  std::set<RankKey> started_;      // never start the same rank of the same attempt twice
  std::vector<v1::RankExit> exits_;  // not yet acknowledged
  std::vector<size_t> records_sent_;  // per running_ entry, in the heartbeat in flight
};

void Agent::TakeRecords(v1::HeartbeatRequest* req) {
  records_sent_.assign(running_.size(), 0);
  int64_t budget = kMaxRecordBytesPerBeat;
  for (size_t i = 0; i < running_.size(); ++i) {
    Running& r = running_[i];
    if (r.log == nullptr) continue;
    for (std::string& line : r.log->TakeRecords()) {
      r.record_bytes += static_cast<int64_t>(line.size());
      r.records.push_back(std::move(line));
    }
    while (r.record_bytes > kMaxPendingRecordBytes && !r.records.empty()) {
      r.record_bytes -= static_cast<int64_t>(r.records.front().size());
      r.records.pop_front();
    }
    v1::RankStatus* st = req->mutable_ranks(static_cast<int>(i));
    for (const std::string& line : r.records) {
      if (static_cast<int64_t>(line.size()) > budget) break;
      budget -= static_cast<int64_t>(line.size());
      st->add_records(line);
      ++records_sent_[i];
    }
  }
}

void Agent::Delivered() {
  for (size_t i = 0; i < records_sent_.size() && i < running_.size(); ++i) {
    Running& r = running_[i];
    for (size_t k = 0; k < records_sent_[i] && !r.records.empty(); ++k) {
      r.record_bytes -= static_cast<int64_t>(r.records.front().size());
      r.records.pop_front();
    }
  }
  records_sent_.clear();
}

absl::Status Agent::Register(const std::atomic<bool>* stop) {
  v1::RegisterWorkerRequest req;
  req.set_name(o_.name);
  req.set_host(o_.host);
  req.set_slots(o_.slots);
  req.set_device(o_.device);
  req.set_shared_dir(o_.shared_dir);
  bool said = false;
  int64_t last_probe_ms = 0;
  while (!stop->load()) {
    grpc::ClientContext ctx;
    rpc::SetDeadlineAndToken(&ctx, token_, absl::Seconds(10));
    v1::RegisterWorkerResponse resp;
    const grpc::Status s = stub_->RegisterWorker(&ctx, req, &resp);
    if (s.ok()) {
      worker_id_ = resp.worker_id();
      session_ = resp.session();
      heartbeat_ms_ = std::max(100, resp.heartbeat_ms());
      lease_ms_ = std::max(1000, resp.lease_ms());
      last_ok_ms_ = NowMs();
      Say(absl::StrCat("registered as ", worker_id_, " with ", o_.slots, " ", o_.device,
                       " slot(s) at ", o_.coordinator));
      return absl::OkStatus();
    }
    const absl::Status st = rpc::FromGrpc(s);
    if (absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st) || absl::IsInvalidArgument(st)) {
      return absl::Status(st.code(), absl::StrCat("the coordinator refused to register this worker: ",
                                                  st.message()));
    }
    // A worker and a coordinator that disagree about TLS would retry forever: say so instead
    // (probed now and then, not at every retry).
    if (absl::IsUnavailable(st) && NowMs() - last_probe_ms >= 5000) {
      last_probe_ms = NowMs();
      const absl::Status why = rpc::ExplainUnavailable(o_.coordinator, o_.channel, st);
      if (!absl::IsUnavailable(why)) return why;
    }
    if (!said) {
      Say(absl::StrCat("cannot register yet (", st.message(), "); retrying"));
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return absl::OkStatus();
}

void Agent::Reap() {
  for (size_t i = 0; i < running_.size();) {
    Running& r = running_[i];
    int code, sig;
    if (!r.process->Poll(&code, &sig)) {
      ++i;
      continue;
    }
    v1::RankExit e;
    e.set_worker_id(worker_id_);
    e.set_job_id(std::get<0>(r.key));
    e.set_attempt(std::get<1>(r.key));
    e.set_rank(std::get<2>(r.key));
    e.set_exit_code(code);
    e.set_signal(sig);
    for (const std::string& l : r.process->LastLines()) e.add_last_lines(l);
    if (std::get<2>(r.key) == 0 && code == 0) {
      auto summary = core::ReadFileToString(
          absl::StrCat(o_.shared_dir, "/jobs/", std::get<0>(r.key), "/summary.json"), 1 << 20);
      if (summary.ok()) e.set_summary_json(*summary);
    }
    // The step records it logged since the last heartbeat go with its exit (the last ones).
    if (r.log != nullptr) {
      for (std::string& line : r.log->TakeRecords()) r.records.push_back(std::move(line));
      int64_t left = kMaxRecordBytesPerBeat;  // the newest that fit, in their order
      std::vector<const std::string*> newest;
      for (auto it = r.records.rbegin(); it != r.records.rend(); ++it) {
        if (static_cast<int64_t>(it->size()) > left) break;
        left -= static_cast<int64_t>(it->size());
        newest.push_back(&*it);
      }
      for (auto it = newest.rbegin(); it != newest.rend(); ++it) e.add_records(**it);
    }
    // Its last output goes up before its exit.
    const std::vector<std::string> lines = r.process->TakeLines();
    if (!lines.empty()) {
      v1::LogUpload up;
      up.set_worker_id(worker_id_);
      up.set_job_id(e.job_id());
      up.set_attempt(e.attempt());
      up.set_rank(e.rank());
      for (size_t k = 0; k < lines.size(); ++k) {
        up.add_lines(lines[k]);
        if (up.lines_size() == 1000 || k + 1 == lines.size()) {
          grpc::ClientContext ctx;
          rpc::SetDeadlineAndToken(&ctx, token_, BeatDeadline());
          rpc::SetWorkerSession(&ctx, session_);
          v1::Ack ack;
          (void)stub_->UploadLogs(&ctx, up, &ack);
          up.clear_lines();
        }
      }
    }
    Say(absl::StrCat(KeyString(r.key), sig ? absl::StrCat(" killed by signal ", sig)
                                           : absl::StrCat(" exited with code ", code)));
    exits_.push_back(std::move(e));
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    SavePids();
  }
}

void Agent::UploadLines() {
  for (Running& r : running_) {
    std::vector<std::string> lines = r.process->TakeLines();
    for (size_t k = 0; k < lines.size(); k += 1000) {
      v1::LogUpload up;
      up.set_worker_id(worker_id_);
      up.set_job_id(std::get<0>(r.key));
      up.set_attempt(std::get<1>(r.key));
      up.set_rank(std::get<2>(r.key));
      for (size_t j = k; j < lines.size() && j < k + 1000; ++j) up.add_lines(lines[j]);
      grpc::ClientContext ctx;
      rpc::SetDeadlineAndToken(&ctx, token_, BeatDeadline());
      rpc::SetWorkerSession(&ctx, session_);
      v1::Ack ack;
      (void)stub_->UploadLogs(&ctx, up, &ack);  // lost lines are lost; the rank goes on
    }
  }
}

void Agent::SendExits() {
  for (size_t i = 0; i < exits_.size();) {
    grpc::ClientContext ctx;
    rpc::SetDeadlineAndToken(&ctx, token_, BeatDeadline());
    rpc::SetWorkerSession(&ctx, session_);
    v1::Ack ack;
    const grpc::Status s = stub_->ReportExit(&ctx, exits_[i], &ack);
    if (s.ok() || s.error_code() == grpc::StatusCode::NOT_FOUND ||
        s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {  // of an earlier registration
      exits_.erase(exits_.begin() + static_cast<std::ptrdiff_t>(i));  // delivered, or moot
    } else {
      ++i;  // the coordinator is away: keep it for later
    }
  }
}

bool Agent::HeartbeatOnce() {
  v1::HeartbeatRequest req;
  req.set_worker_id(worker_id_);
  for (const Running& r : running_) {
    v1::RankStatus* st = req.add_ranks();
    st->set_job_id(std::get<0>(r.key));
    st->set_attempt(std::get<1>(r.key));
    st->set_rank(std::get<2>(r.key));
    st->set_pid(r.process->pid());
    const RankProgress p = r.process->progress();
    st->set_step(p.step);
    st->set_loss(p.loss);
    st->set_tokens_per_second(p.tokens_per_second);
    st->set_metrics_address(p.metrics_address);
  }
  TakeRecords(&req);
  grpc::ClientContext ctx;
  rpc::SetDeadlineAndToken(&ctx, token_, BeatDeadline());
  rpc::SetWorkerSession(&ctx, session_);
  v1::HeartbeatResponse resp;
  const grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
  const int64_t now = NowMs();
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::NOT_FOUND ||
        s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      Say(absl::StrCat("the coordinator no longer knows this worker (", s.error_message(),
                       "); stopping its ranks and registering again"));
      KillAll();
      exits_.clear();  // of attempts that have moved on
      return false;
    }
    if (now - last_ok_ms_ > lease_ms_ && !running_.empty()) {
      Say(absl::StrCat("the coordinator has been unreachable for ", (now - last_ok_ms_) / 1000.0,
                       " s, longer than the lease: killing every rank"));
      KillAll();
    }
    return true;
  }
  last_ok_ms_ = now;
  Delivered();
  for (const v1::RankRef& stop : resp.stop()) {
    const RankKey key{stop.job_id(), stop.attempt(), stop.rank()};
    for (Running& r : running_) {
      if (r.key == key) StopRank(&r);
    }
  }
  for (const v1::RankAssignment& a : resp.start()) {
    const RankKey key{a.job_id(), a.attempt(), a.rank()};
    if (started_.count(key)) continue;
    started_.insert(key);
    absl::Status s = Start(a);
    if (!s.ok()) {
      Say(absl::StrCat("cannot start ", KeyString(key), ": ", s.message()));
      v1::RankExit e;
      e.set_worker_id(worker_id_);
      e.set_job_id(a.job_id());
      e.set_attempt(a.attempt());
      e.set_rank(a.rank());
      e.set_exit_code(1);
      e.add_last_lines(absl::StrCat("worker ", o_.name, ": cannot start the rank: ", s.message()));
      exits_.push_back(std::move(e));
    }
  }
  return true;
}

absl::Status Agent::Start(const v1::RankAssignment& a) {
  const std::string local = absl::StrCat(o_.work_dir, "/jobs/", a.job_id(), "/attempt-", a.attempt());
  const std::string shared = absl::StrCat(o_.shared_dir, "/jobs/", a.job_id());
  SATDAR_RETURN_IF_ERROR(core::MakeDirs(local));
  SATDAR_RETURN_IF_ERROR(core::MakeDirs(shared));
  const std::string config = local + "/config.json";
  SATDAR_RETURN_IF_ERROR(core::WriteFileAtomically(config, a.config_json()));
  std::vector<std::string> argv = {o_.satdar, "train", "--config", config};
  for (const std::string& arg : a.train_args()) argv.push_back(arg);
  auto add = [&](const std::string& flag, const std::string& value) {
    argv.push_back(flag);
    argv.push_back(value);
  };
  add("--threads", std::to_string(std::max(1, a.threads())));
  add("--device", a.device().empty() ? "cpu" : a.device());
  add("--checkpoint-dir", shared + "/checkpoints");
  argv.push_back("--resume");  // every attempt continues from the newest complete checkpoint
  // A rank of the stopped attempt may still hold the folder for a moment.
  add("--lock-wait", std::to_string(2 * lease_ms_ / 1000 + 5));
  if (!a.data_path().empty()) add("--data", o_.data_root + "/" + a.data_path());
  if (a.rank() == 0) {
    add("--log-jsonl", shared + "/log.jsonl");
    add("--summary-json", shared + "/summary.json");
  }
  // Every rank serves /metrics on this worker's host, on a port it binds itself (0) and
  // announces ("metrics: serving on ..."); the heartbeat passes it on for service discovery.
  add("--job-id", a.job_id());
  add("--metrics-listen", o_.host + ":0");
  add("--progress", "line");
  // Every rank reaches the coordinator: for its own lease (rank_lease.h) and, on CPUs, to
  // meet its peers in the attempt's store.
  auto add_coordinator = [&] {
    add("--coordinator", o_.coordinator);
    add("--attempt", std::to_string(a.attempt()));
    if (!o_.token_file.empty()) add("--token-file", o_.token_file);
    if (!o_.channel.ca_file.empty()) add("--tls-ca", o_.channel.ca_file);
  };
  if (a.world_size() > 1) {
    add("--rank", std::to_string(a.rank()));
    add("--world-size", std::to_string(a.world_size()));
    if (a.device() == "cuda") {  // NCCL meets in a folder of the shared storage
      add("--rendezvous", absl::StrCat(shared, "/rendezvous/attempt-", a.attempt()));
    } else {
      add("--launcher", "gloo");
      add_coordinator();
    }
  } else {
    add_coordinator();
  }
  // SATDAR_WORKER_PID: the rank dies with this worker (cli/cmd_train.cc, DieWithWorker).
  // SATDAR_WORKER_SESSION: the rank's calls (rendezvous store, rank lease) speak for this
  // worker, and may touch only what was assigned to it.
  const std::vector<std::string> env = {"SATDAR_GLOO_HOST=" + o_.host,
                                        absl::StrCat("SATDAR_WORKER_PID=", ::getpid()),
                                        "SATDAR_WORKER_SESSION=" + session_};
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<RankProcess> p,
                          RankProcess::Start(argv, env, absl::StrCat(local, "/rank-", a.rank(), ".log")));
  const RankKey key{a.job_id(), a.attempt(), a.rank()};
  Say(absl::StrCat("started ", KeyString(key), " (pid ", p->pid(), ")"));
  Running run;
  run.key = key;
  run.process = std::move(p);
  if (a.rank() == 0) run.log = std::make_unique<JsonlTail>(shared + "/log.jsonl");
  running_.push_back(std::move(run));
  SavePids();
  return absl::OkStatus();
}

void Agent::StopRank(Running* r) {
  if (r->kill_at_ms != 0) return;
  r->process->Signal(SIGTERM);
  r->kill_at_ms = NowMs() + o_.stop_grace_ms;
  Say(absl::StrCat("stopping ", KeyString(r->key)));
}

void Agent::KillAll() {
  for (Running& r : running_) r.process->Signal(SIGKILL);
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  while (!running_.empty() && Clock::now() < give_up) {
    Reap();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The ranks this worker runs, so that a restarted worker can kill what it left behind.
void Agent::SavePids() {
  std::string text;
  for (const Running& r : running_) {
    absl::StrAppend(&text, r.process->pid(), " ", StartTime(r.process->pid()), "\n");
  }
  (void)core::WriteFileAtomically(o_.work_dir + "/ranks.pids", text);
}

void Agent::KillOrphans() {
  auto text = core::ReadFileToString(o_.work_dir + "/ranks.pids", 1 << 20);
  if (!text.ok()) return;
  int killed = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    int pid;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &pid) || pid <= 1) continue;
    if (StartTime(pid) != f[1]) continue;  // gone, or the pid now names another process
    ::kill(-pid, SIGKILL);
    ++killed;
  }
  if (killed > 0) Say(absl::StrCat("killed ", killed, " rank(s) its previous run left behind"));
  (void)core::WriteFileAtomically(o_.work_dir + "/ranks.pids", "");
}

absl::Status Agent::Run(const std::atomic<bool>* stop) {
  KillOrphans();
  SATDAR_RETURN_IF_ERROR(Register(stop));
  while (!stop->load()) {
    const int64_t t0 = NowMs();
    Reap();
    UploadLines();
    SendExits();
    if (!HeartbeatOnce()) {
      SATDAR_RETURN_IF_ERROR(Register(stop));
      continue;
    }
    for (Running& r : running_) {
      if (r.kill_at_ms != 0 && NowMs() >= r.kill_at_ms) r.process->Signal(SIGKILL);
    }
    const int64_t left = heartbeat_ms_ - (NowMs() - t0);
    for (int64_t waited = 0; waited < left && !stop->load(); waited += 50) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      Reap();  // an exit is reported at the next beat, but found at once
    }
  }
  // Stopped: the ranks go too (a signal to the worker is a signal to its ranks).
  for (Running& r : running_) StopRank(&r);
  const auto give_up = Clock::now() + std::chrono::milliseconds(o_.stop_grace_ms);
  while (!running_.empty() && Clock::now() < give_up) {
    Reap();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  KillAll();
  UploadLines();
  SendExits();
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorker(const AgentOptions& options, const std::atomic<bool>* stop) {
  AgentOptions o = options;
  SATDAR_RETURN_IF_ERROR(rpc::CheckAddress(o.coordinator, "coordinator"));
  if (o.slots < 1 || o.slots > 4096) {
    return absl::InvalidArgumentError("slots must be in [1, 4096]");
  }
  if (o.device != "cpu" && o.device != "cuda") {
    return absl::InvalidArgumentError("device must be cpu or cuda");
  }
  // What the worker registers must be true: ranks listen on --host, and a cuda slot is a GPU.
  SATDAR_RETURN_IF_ERROR(core::CheckHost(o.host, "satdar worker: host"));
  if (o.device == "cuda") {
    core::Device gpu;
    gpu.type = core::DeviceType::kCuda;
    if (absl::Status s = core::CheckDeviceAvailable(gpu); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("satdar worker: ", s.message()));
    }
    if (o.slots > core::CudaDeviceCount()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "satdar worker: slots ", o.slots, " with device cuda: this machine has ",
          core::CudaDeviceCount(), " GPU(s) (a cuda slot is a GPU)"));
    }
  }
  if (absl::Status s = core::MakeDirs(o.work_dir); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("work_dir: ", s.message()));
  }
  // One worker per work folder: a second one would take the first one's ranks for orphans of
  // its own previous life and kill them (KillOrphans). Held until this function returns.
  std::string lock_note;
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<core::FolderLock> work_dir_lock,
                          core::FolderLock::Acquire(o.work_dir, "worker.lock", "work_dir",
                                                    "worker", &lock_note));
  if (!lock_note.empty()) std::fprintf(stderr, "worker: warning: %s\n", lock_note.c_str());
  if (absl::Status s = core::MakeDirs(o.shared_dir); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shared_dir: ", s.message()));
  }
  if (!o.data_root.empty()) {
    if (absl::Status s = core::CheckFolder(o.data_root); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("data_root: ", s.message()));
    }
  }
  std::string token;
  if (!o.token_file.empty()) {
    auto t = rpc::ReadTokenFile(o.token_file);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("token_file: ", t.status().message()));
    token = *t;
  }
  if (o.name.empty()) {
    char host[256] = "worker";
    ::gethostname(host, sizeof(host) - 1);
    o.name = absl::StrCat(host, "-", ::getpid());
  }
  SATDAR_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                          rpc::MakeChannel(o.coordinator, o.channel));
  Agent agent(o, token, channel);
  return agent.Run(stop);
}

}  // namespace satdar::agent
