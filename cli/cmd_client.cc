// satdar submit, status, jobs, cancel, logs, workers: the coordinator's clients.
// Exit codes (INTERFACES.md): 0 ok; 2 bad input (nothing stored); 3 unauthenticated or
// permission denied; 4 no such job; 1 anything else.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/job_spec.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/text.h"
#include "nlohmann/json.hpp"
#include "proto/rpc.h"
#include "proto/satdar/v1/control.grpc.pb.h"
#include "cli/cli_util.h"
#include "cli/commands.h"

namespace satdar::cli {

namespace {

namespace v1 = satdar::v1;
using Json = nlohmann::json;

// What every client command takes: where the coordinator is and how to prove who we are.
struct Client {
  std::string address;
  std::string token;
  rpc::ChannelOptions channel;  // to explain a TLS mismatch (rpc::ExplainUnavailable)
  std::unique_ptr<v1::JobService::Stub> stub;
};

void DefineClientFlags(FlagSet* flags) {
  flags->Define("--coordinator", "HOST:PORT of the coordinator (or $SATDAR_COORDINATOR)");
  flags->Define("--token-file", "a file holding the client token (or $SATDAR_TOKEN_FILE)");
  flags->Define("--tls-ca", "PEM roots to verify the coordinator's TLS certificate (or $SATDAR_TLS_CA)");
}

absl::StatusOr<Client> Connect(const FlagSet& flags) {
  Client c;
  c.address = FlagOrEnv(flags, "--coordinator", "SATDAR_COORDINATOR");
  if (c.address.empty()) {
    return absl::InvalidArgumentError("give --coordinator HOST:PORT (or set $SATDAR_COORDINATOR)");
  }
  const std::string token_file = FlagOrEnv(flags, "--token-file", "SATDAR_TOKEN_FILE");
  if (!token_file.empty()) {
    auto t = rpc::ReadTokenFile(token_file);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("--token-file: ", t.status().message()));
    c.token = *t;
  }
  c.channel.ca_file = FlagOrEnv(flags, "--tls-ca", "SATDAR_TLS_CA");
  c.channel.ca_name = "--tls-ca";
  SATDAR_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                          rpc::MakeChannel(c.address, c.channel));
  c.stub = v1::JobService::NewStub(channel);
  return c;
}

// One flag-less argument (the job spec file, the job id) taken out of args; missing, an
// error naming it with the command's usage line.
absl::StatusOr<std::string> Positional(std::vector<std::string>* args, const std::string& what,
                                       const FlagSet& flags) {
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if (a.rfind("--", 0) == 0) {
      // Skip a flag's value ("--rank 1").
      if (a.find('=') == std::string::npos && flags.Knows(a) && !flags.IsBool(a)) ++i;
      continue;
    }
    std::string v = a;
    args->erase(args->begin() + static_cast<std::ptrdiff_t>(i));
    return v;
  }
  return absl::InvalidArgumentError(absl::StrCat("give the ", what, " (", flags.UsageLine(), ")"));
}

// A job id as the coordinator makes them ("job-000001-3f2a"): at most 128 bytes of letters,
// digits, '.', '_' and '-'. Anything else names no job (exit 4) and is refused before the call,
// so a 10 kB argument never meets gRPC's metadata limit and nothing odd reaches the terminal.
absl::Status CheckJobId(const std::string& id) {
  const bool ok = !id.empty() && id.size() <= coordinator::kMaxNameBytes &&
                  std::all_of(id.begin(), id.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      "no such job: '", core::PrintableShort(id, 64), "' (", id.size(),
      " bytes) is not a job id (at most ", coordinator::kMaxNameBytes,
      " letters, digits, '.', '_' or '-', such as job-000001-3f2a)"));
}

std::string StateName(int s) { return v1::JobState_Name(static_cast<v1::JobState>(s)); }

// A unary call, retried while the coordinator is unreachable (it may be restarting).
template <typename Req, typename Resp, typename Call>
absl::Status Unary(const Client& c, const Req& req, Resp* resp, Call call) {
  absl::Status last;
  for (int i = 0; i < 10; ++i) {
    grpc::ClientContext ctx;
    rpc::SetDeadlineAndToken(&ctx, c.token, absl::Seconds(30));
    last = rpc::FromGrpc(call(&ctx, req, resp));
    if (!absl::IsUnavailable(last)) return last;
    // A TLS mismatch is no restart to wait out: said at once (exit 2).
    if (i == 0) {
      if (absl::Status why = rpc::ExplainUnavailable(c.address, c.channel, last);
          !absl::IsUnavailable(why)) {
        return why;
      }
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return absl::UnavailableError(absl::StrCat("cannot reach the coordinator at ", c.address, ": ",
                                             last.message()));
}

// A job has a loss and a throughput to show once rank 0 reported a step, and only while it is
// not waiting (a PENDING job's numbers would be 0 or its failed attempt's).
bool HasProgress(const v1::Job& j) { return j.step() > 0 && j.state() != v1::PENDING; }

Json JobJson(const v1::Job& j) {
  Json summary = nullptr;
  if (!j.summary_json().empty()) {
    auto parsed = core::ParseJson(j.summary_json(), "summary");
    if (parsed.ok()) summary = *parsed;
  }
  Json out = {{"job_id", j.job_id()},
              {"name", j.name()},
              {"state", StateName(j.state())},
              {"attempts", j.attempts()},
              {"exit_code", j.exit_code()},
              {"reason", j.reason()},
              {"step", j.step()},
              {"steps", j.steps()},
              {"loss", HasProgress(j) ? Json(j.loss()) : Json(nullptr)},
              {"tokens_per_second", HasProgress(j) ? Json(j.tokens_per_second()) : Json(nullptr)},
              {"pending_reason", j.pending_reason()},
              {"world_size", j.world_size()},
              {"max_restarts", j.max_restarts()},
              {"submit_time_ms", j.submit_time_ms()},
              {"end_time_ms", j.end_time_ms()},
              {"summary", summary}};
  if (j.history_size() > 0) {
    Json history = Json::array();
    for (const v1::Attempt& a : j.history()) {
      Json ranks = Json::array();
      for (const v1::RankOutcome& r : a.ranks()) {
        ranks.push_back({{"rank", r.rank()}, {"worker", r.worker()},
                         {"worker_id", r.worker_id()}, {"state", r.state()},
                         {"exit_code", r.exit_code()}, {"signal", r.signal()}});
      }
      history.push_back({{"attempt", a.number()},
                         {"start_time_ms", a.start_time_ms()},
                         {"end_time_ms", a.end_time_ms()},
                         {"outcome", a.outcome()},
                         {"first_failed_rank", a.first_failed_rank()},
                         {"reason", a.reason()},
                         {"last_lines", Json(std::vector<std::string>(a.last_lines().begin(),
                                                                      a.last_lines().end()))},
                         {"ranks", ranks}});
    }
    out["history"] = history;
  }
  return out;
}

std::string Age(int64_t since_ms) {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t s = std::max<int64_t>(0, (now - since_ms) / 1000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  return absl::StrCat(s / 3600, "h");
}

std::string ProgressLine(const v1::Job& j) {
  std::string line = absl::StrFormat("%s %-9s step %lld/%lld", core::Printable(j.job_id()),
                                     StateName(j.state()),
                                     static_cast<long long>(j.step()),
                                     static_cast<long long>(j.steps()));
  if (HasProgress(j)) {
    absl::StrAppendFormat(&line, " | loss %.4f | %.0f tok/s", j.loss(), j.tokens_per_second());
  }
  if (j.attempts() > 1) absl::StrAppend(&line, " | attempt ", j.attempts());
  return line;
}

// Columns as wide as their widest cell (header included), in code points: names with wide
// characters may still misalign (`--json` is for programs); callers escape control characters
// (core::Printable), so no cell can move the cursor or start a row of its own. The last column
// is not padded; `right` marks the right-aligned (numeric) columns.
void PrintTable(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right) {
  auto width = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // not a UTF-8 continuation byte
    return n;
  };
  std::vector<size_t> widths(right.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], width(row[c]));
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(widths[c] - width(row[c]), ' ');
      if (c > 0) line += "  ";
      if (c + 1 == row.size() && !right[c]) {
        line += row[c];
      } else {
        line += right[c] ? pad + row[c] : row[c] + pad;
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

// Streams the job's events until it is final (reconnecting if the coordinator restarts);
// OK only when it SUCCEEDED.
absl::Status Follow(const Client& c, const std::string& job_id) {
  const bool tty = ::isatty(1);
  int64_t after = 0;
  v1::Job last;
  for (int failures = 0; failures < 60;) {
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_after_sequence(after);
    grpc::ClientContext ctx;
    if (!c.token.empty()) ctx.AddMetadata("authorization", "Bearer " + c.token);
    auto reader = c.stub->WatchJob(&ctx, req);
    v1::JobEvent e;
    while (reader->Read(&e)) {
      failures = 0;
      after = e.sequence();
      last = e.job();
      if (e.kind() == "progress") {
        std::printf(tty ? "\r%s\x1b[K" : "%s\n", ProgressLine(last).c_str());
      } else {
        std::printf("%s%s: %s\n", tty ? "\r\x1b[K" : "", core::Printable(job_id).c_str(),
                    core::Printable(e.message()).c_str());
      }
      std::fflush(stdout);
    }
    absl::Status s = rpc::FromGrpc(reader->Finish());
    if (s.ok()) break;
    if (!absl::IsUnavailable(s)) return s;
    ++failures;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (tty) std::printf("\n");
  if (last.state() == v1::SUCCEEDED) return absl::OkStatus();
  return absl::UnknownError(absl::StrCat(job_id, " ended ", StateName(last.state()),
                                         last.reason().empty() ? "" : ": ",
                                         core::Printable(last.reason())));
}

absl::StatusOr<std::string> RequestId() {
  std::ifstream r("/dev/urandom", std::ios::binary);
  unsigned char b[16];
  if (!r.read(reinterpret_cast<char*>(b), sizeof(b))) return absl::InternalError("no randomness");
  std::string id;
  for (unsigned char x : b) absl::StrAppendFormat(&id, "%02x", x);
  return id;
}

}  // namespace

absl::Status RunSubmit(const std::vector<std::string>& in) {
  FlagSet flags("submit", "JOB.json");
  DefineClientFlags(&flags);
  flags.DefineBool("--follow", "stream the job's progress; exit 0 only if it SUCCEEDED");
  flags.DefineBool("--json", "print {\"job_id\": ...}");
  if (WantsHelp(in)) return PrintHelp(flags);
  std::vector<std::string> args = in;
  SATDAR_ASSIGN_OR_RETURN(std::string spec_path, Positional(&args, "job spec file (JOB.json)", flags));
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  auto text = core::ReadFileToString(spec_path, coordinator::kMaxSpecBytes);
  if (!text.ok()) return absl::InvalidArgumentError(std::string(text.status().message()));
  const size_t slash = spec_path.rfind('/');
  const std::string spec_dir = slash == std::string::npos ? "." : spec_path.substr(0, slash);
  SATDAR_ASSIGN_OR_RETURN(v1::JobSpec spec,
                          coordinator::JobSpecFromJson(*text, spec_path, {".", spec_dir}));
  SATDAR_ASSIGN_OR_RETURN(Client c, Connect(flags));
  v1::SubmitJobRequest req;
  SATDAR_ASSIGN_OR_RETURN(*req.mutable_request_id(), RequestId());
  *req.mutable_spec() = spec;
  v1::SubmitJobResponse resp;
  SATDAR_RETURN_IF_ERROR(Unary(c, req, &resp, [&](grpc::ClientContext* ctx, const auto& r, auto* out) {
    return c.stub->SubmitJob(ctx, r, out);
  }));
  if (flags.GetBool("--json")) {
    std::printf("%s\n", Json({{"job_id", resp.job_id()}}).dump().c_str());
  } else {
    std::printf("%s\n", core::Printable(resp.job_id()).c_str());
  }
  std::fflush(stdout);
  if (flags.GetBool("--follow")) return Follow(c, resp.job_id());
  return absl::OkStatus();
}

absl::Status RunStatus(const std::vector<std::string>& in) {
  FlagSet flags("status", "JOB");
  DefineClientFlags(&flags);
  flags.DefineBool("--json", "one JSON object");
  if (WantsHelp(in)) return PrintHelp(flags);
  std::vector<std::string> args = in;
  SATDAR_ASSIGN_OR_RETURN(std::string job_id, Positional(&args, "job id", flags));
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_RETURN_IF_ERROR(CheckJobId(job_id));
  SATDAR_ASSIGN_OR_RETURN(Client c, Connect(flags));
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::Job j;
  SATDAR_RETURN_IF_ERROR(Unary(c, req, &j, [&](grpc::ClientContext* ctx, const auto& r, auto* out) {
    return c.stub->GetJob(ctx, r, out);
  }));
  if (flags.GetBool("--json")) {
    std::printf("%s\n", JobJson(j).dump().c_str());
    return absl::OkStatus();
  }
  // Text from the spec, the ranks and the coordinator, with control characters escaped.
  std::printf("%s%s\n", ProgressLine(j).c_str(),
              j.name().empty() ? "" : absl::StrCat(" (", core::Printable(j.name()), ")").c_str());
  std::printf("  %d rank(s), %d attempt(s) of at most %d, submitted %s ago\n", j.world_size(),
              j.attempts(), j.max_restarts() + 1, Age(j.submit_time_ms()).c_str());
  if (!j.pending_reason().empty()) std::printf("  %s\n", core::Printable(j.pending_reason()).c_str());
  if (!j.reason().empty()) std::printf("  reason: %s\n", core::Printable(j.reason()).c_str());
  for (const v1::Attempt& a : j.history()) {
    std::printf("  attempt %d: %s%s\n", a.number(),
                a.outcome().empty() ? "running" : core::Printable(a.outcome()).c_str(),
                a.reason().empty() ? "" : absl::StrCat(" - ", core::Printable(a.reason())).c_str());
    for (const std::string& l : a.last_lines()) {
      std::printf("    | %s\n", core::Printable(l).c_str());
    }
  }
  return absl::OkStatus();
}

absl::Status RunJobs(const std::vector<std::string>& args) {
  FlagSet flags("jobs");
  DefineClientFlags(&flags);
  flags.DefineBool("--json", "a JSON array");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_ASSIGN_OR_RETURN(Client c, Connect(flags));
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  SATDAR_RETURN_IF_ERROR(Unary(c, req, &resp, [&](grpc::ClientContext* ctx, const auto& r, auto* out) {
    return c.stub->ListJobs(ctx, r, out);
  }));
  if (flags.GetBool("--json")) {
    Json all = Json::array();
    for (const v1::Job& j : resp.jobs()) all.push_back(JobJson(j));
    std::printf("%s\n", all.dump().c_str());
    return absl::OkStatus();
  }
  // REASON: why a PENDING job waits, why a job failed or was cancelled.
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "NAME", "STATE", "STEP", "LOSS", "TOK/S", "AGE", "ATTEMPTS", "REASON"}};
  for (const v1::Job& j : resp.jobs()) {
    const bool progress = HasProgress(j);
    rows.push_back({core::Printable(j.job_id()), j.name().empty() ? "-" : core::Printable(j.name()),
                    StateName(j.state()),
                    absl::StrCat(j.step(), "/", j.steps()),
                    progress ? absl::StrFormat("%.4f", j.loss()) : "-",
                    progress ? absl::StrFormat("%.0f", j.tokens_per_second()) : "-",
                    Age(j.submit_time_ms()), absl::StrCat(j.attempts()),
                    core::Printable(j.state() == v1::PENDING ? j.pending_reason() : j.reason())});
  }
  PrintTable(rows, {false, false, false, true, true, true, true, true, false});
  return absl::OkStatus();
}

absl::Status RunCancel(const std::vector<std::string>& in) {
  FlagSet flags("cancel", "JOB");
  DefineClientFlags(&flags);
  if (WantsHelp(in)) return PrintHelp(flags);
  std::vector<std::string> args = in;
  SATDAR_ASSIGN_OR_RETURN(std::string job_id, Positional(&args, "job id", flags));
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_RETURN_IF_ERROR(CheckJobId(job_id));
  SATDAR_ASSIGN_OR_RETURN(Client c, Connect(flags));
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::Job j;
  SATDAR_RETURN_IF_ERROR(Unary(c, req, &j, [&](grpc::ClientContext* ctx, const auto& r, auto* out) {
    return c.stub->CancelJob(ctx, r, out);
  }));
  std::printf("%s %s\n", core::Printable(j.job_id()).c_str(), StateName(j.state()).c_str());
  return absl::OkStatus();
}

absl::Status RunLogs(const std::vector<std::string>& in) {
  FlagSet flags("logs", "JOB");
  DefineClientFlags(&flags);
  flags.Define("--rank", "only this rank's lines (default: every rank, each line marked)");
  flags.Define("--tail", "only the last N lines", false, "0");
  flags.DefineBool("--follow", "keep printing until the job ends");
  if (WantsHelp(in)) return PrintHelp(flags);
  std::vector<std::string> args = in;
  SATDAR_ASSIGN_OR_RETURN(std::string job_id, Positional(&args, "job id", flags));
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_RETURN_IF_ERROR(CheckJobId(job_id));
  int64_t rank = -1;
  if (flags.Has("--rank")) {
    SATDAR_ASSIGN_OR_RETURN(rank, flags.GetInt("--rank", 0, kMaxRanks - 1));
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t tail, flags.GetInt("--tail", 0, 1 << 20));
  SATDAR_ASSIGN_OR_RETURN(Client c, Connect(flags));
  v1::GetLogsRequest req;
  req.set_job_id(job_id);
  req.set_rank(static_cast<int>(rank));
  req.set_tail(static_cast<int>(tail));
  req.set_follow(flags.GetBool("--follow"));
  grpc::ClientContext ctx;
  if (!c.token.empty()) ctx.AddMetadata("authorization", "Bearer " + c.token);
  auto reader = c.stub->GetLogs(&ctx, req);
  v1::LogChunk chunk;
  while (reader->Read(&chunk)) {
    for (const v1::LogLine& l : chunk.lines()) {
      if (rank >= 0) {
        std::printf("%s\n", l.text().c_str());
      } else {
        std::printf("[rank %d] %s\n", l.rank(), l.text().c_str());
      }
    }
    std::fflush(stdout);
  }
  return rpc::ExplainUnavailable(c.address, c.channel, rpc::FromGrpc(reader->Finish()));
}

absl::Status RunWorkers(const std::vector<std::string>& args) {
  FlagSet flags("workers");
  DefineClientFlags(&flags);
  flags.DefineBool("--json", "a JSON array");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_ASSIGN_OR_RETURN(Client c, Connect(flags));
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse resp;
  SATDAR_RETURN_IF_ERROR(Unary(c, req, &resp, [&](grpc::ClientContext* ctx, const auto& r, auto* out) {
    return c.stub->ListWorkers(ctx, r, out);
  }));
  if (flags.GetBool("--json")) {
    Json all = Json::array();
    for (const v1::Worker& w : resp.workers()) {
      all.push_back({{"worker_id", w.worker_id()}, {"name", w.name()}, {"host", w.host()},
                     {"slots", w.slots()}, {"busy_slots", w.busy_slots()}, {"device", w.device()},
                     {"state", w.state()}, {"last_heartbeat_ms", w.last_heartbeat_ms()}});
    }
    std::printf("%s\n", all.dump().c_str());
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> rows = {
      {"WORKER", "NAME", "STATE", "DEVICE", "SLOTS", "HEARTBEAT"}};
  for (const v1::Worker& w : resp.workers()) {
    rows.push_back({core::Printable(w.worker_id()), core::Printable(w.name()),
                    core::Printable(w.state()), core::Printable(w.device()),
                    absl::StrCat(w.busy_slots(), "/", w.slots()),
                    absl::StrCat(Age(w.last_heartbeat_ms()), " ago")});
  }
  PrintTable(rows, {false, false, false, false, true, false});
  return absl::OkStatus();
}

int ClientExitCodeFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kInvalidArgument: return 2;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied: return 3;
    case absl::StatusCode::kNotFound: return 4;
    default: return 1;
  }
}

}  // namespace satdar::cli
