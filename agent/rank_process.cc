#include "agent/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace satdar::agent {

namespace {
constexpr size_t kLastLines = 40;
constexpr size_t kMaxPending = 20000;  // lines not yet uploaded; older ones are dropped
}  // namespace

bool ParseProgressLine(const std::string& line, RankProgress* out) {
  // [2026-12-02T10:41:07.123Z ]step    10/200 | loss 7.5137 | lr 1.00e-03 | grad norm 1.127 |
  // 1202 tok/s
  absl::string_view v(line);
  if (v.size() > 21 && v[4] == '-' && v[10] == 'T') {  // the line's timestamp
    const size_t space = v.find(' ');
    if (space != absl::string_view::npos && v[space - 1] == 'Z') v.remove_prefix(space + 1);
  }
  if (absl::ConsumePrefix(&v, "metrics: serving on http://")) {
    if (!absl::ConsumeSuffix(&v, "/metrics") || v.empty()) return false;
    out->metrics_address = std::string(v);
    return true;
  }
  if (!absl::ConsumePrefix(&v, "step ")) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(v, " | ");
  if (parts.size() < 3) return false;
  absl::string_view step = absl::StripAsciiWhitespace(parts[0]);
  const size_t slash = step.find('/');
  int64_t s;
  if (slash == absl::string_view::npos || !absl::SimpleAtoi(step.substr(0, slash), &s)) return false;
  absl::string_view loss = parts[1];
  double l, tps = 0;
  if (!absl::ConsumePrefix(&loss, "loss ") || !absl::SimpleAtod(loss, &l)) return false;
  for (absl::string_view p : parts) {
    if (absl::ConsumeSuffix(&p, " tok/s")) (void)absl::SimpleAtod(p, &tps);
  }
  out->step = s;
  out->loss = l;
  out->tokens_per_second = tps;
  return true;
}

absl::StatusOr<std::unique_ptr<RankProcess>> RankProcess::Start(
    const std::vector<std::string>& argv, const std::vector<std::string>& env,
    const std::string& log_path) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("cannot create a pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so a stop reaches every process the rank starts.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.push_back(*e);
  for (const std::string& e : env) envs.push_back(e);
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, cargv[0], &actions, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  auto p = std::unique_ptr<RankProcess>(new RankProcess());
  p->pid_ = pid;
  p->reader_ = std::thread([raw = p.get(), fd = fds[0], log_path] { raw->ReadLoop(fd, log_path); });
  return p;
}

RankProcess::~RankProcess() {
  if (!ended_ && pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  if (reader_.joinable()) reader_.join();
}

void RankProcess::ReadLoop(int fd, std::string log_path) {
  FILE* log = log_path.empty() ? nullptr : std::fopen(log_path.c_str(), "a");
  std::string buffer;
  char chunk[4096];
  auto take = [&](std::string line) {
    if (log != nullptr) {
      std::fprintf(log, "%s\n", line.c_str());
      std::fflush(log);
    }
    std::lock_guard<std::mutex> lock(mu_);
    RankProgress p = progress_;  // a line sets what it says and keeps the rest
    if (ParseProgressLine(line, &p)) progress_ = p;
    last_.push_back(line);
    if (last_.size() > kLastLines) last_.pop_front();
    if (pending_.size() < kMaxPending) pending_.push_back(std::move(line));
  };
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl = buffer.find('\n'); nl != std::string::npos; nl = buffer.find('\n', start)) {
      std::string line = buffer.substr(start, nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      take(std::move(line));
      start = nl + 1;
    }
    buffer.erase(0, start);
    // A progress bar redraws with '\r' and no newline: keep only its last state.
    const size_t cr = buffer.rfind('\r');
    if (cr != std::string::npos) buffer.erase(0, cr + 1);
  }
  if (!buffer.empty()) take(buffer);
  ::close(fd);
  if (log != nullptr) std::fclose(log);
  std::lock_guard<std::mutex> lock(mu_);
  eof_ = true;
}

std::vector<std::string> RankProcess::TakeLines() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.swap(pending_);
  return out;
}

std::vector<std::string> RankProcess::LastLines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<std::string>(last_.begin(), last_.end());
}

RankProgress RankProcess::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_;
}

bool RankProcess::Poll(int* exit_code, int* signal) {
  if (!ended_) {
    int status;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r != pid_) return false;
    ended_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    signal_ = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    // Whatever else the group started must not outlive the rank.
    ::kill(-pid_, SIGKILL);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!eof_) return false;  // the last lines are still being read
  }
  *exit_code = exit_code_;
  *signal = signal_;
  return true;
}

void RankProcess::Signal(int sig) {
  if (!ended_ && pid_ > 0) ::kill(-pid_, sig);
}

}  // namespace satdar::agent
