#include "cli/tokenizer_process.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace satdar::cli {

namespace {

constexpr char kReplacementChar[] = "\xef\xbf\xbd";  // U+FFFD

// JSON carries only UTF-8: invalid bytes become U+FFFD instead of an exception (which would
// abort: the build has none).
std::string DumpLine(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// satdar-prep beside this program, as ExecPrep in cli/cli.cc finds it.
absl::StatusOr<std::string> SiblingPrep() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return absl::InternalError("tokenizer: cannot find this program's folder");
  std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + "satdar-prep";
}

// A close-on-exec pipe whose ends are above stderr (the child's dup2 onto 0 and 1 must not
// meet an end that already has one of those numbers, as when this program's stdin is closed).
bool MakePipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  for (int i = 0; i < 2; ++i) {
    if (fds[i] > 2) continue;
    const int moved = ::fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
    if (moved < 0) {
      const int e = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      errno = e;
      return false;
    }
    ::close(fds[i]);
    fds[i] = moved;
  }
  return true;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "stopped";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenizerProcess>> TokenizerProcess::Start(
    const std::string& model_path) {
  SATDAR_ASSIGN_OR_RETURN(const std::string prep, SiblingPrep());
  return Start(model_path, prep);
}

absl::StatusOr<std::unique_ptr<TokenizerProcess>> TokenizerProcess::Start(
    const std::string& model_path, const std::string& prep_binary) {
  if (absl::Status s = core::CheckRegularFile(model_path); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", s.message()));
  }
  if (::access(prep_binary.c_str(), X_OK) != 0) {
    return absl::InternalError(absl::StrCat("tokenizer: cannot run ", prep_binary, ": ",
                                            std::strerror(errno), " (build //:satdar)"));
  }
  int in[2], out[2];  // the child's stdin and stdout
  if (!MakePipe(in)) {
    return absl::InternalError(absl::StrCat("tokenizer: pipe: ", std::strerror(errno)));
  }
  if (!MakePipe(out)) {
    const int e = errno;
    ::close(in[0]);
    ::close(in[1]);
    return absl::InternalError(absl::StrCat("tokenizer: pipe: ", std::strerror(e)));
  }
  // posix_spawn rather than fork: no copy of a large process's page tables (a trainer that
  // samples holds its whole state). The child gets the pipes as stdin and stdout (the pipe
  // fds themselves close on exec), no blocked signals and the default SIGPIPE action.
  std::string arg0 = prep_binary, arg1 = "tokenize", arg2 = "--tokenizer", arg3 = model_path;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), arg3.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  ::posix_spawnattr_init(&attr);
  sigset_t none, pipe_set;
  sigemptyset(&none);
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ::posix_spawnattr_setsigmask(&attr, &none);
  ::posix_spawnattr_setsigdefault(&attr, &pipe_set);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, &attr, argv, environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    return absl::InternalError(absl::StrCat("tokenizer: cannot run ", prep_binary, ": ",
                                            std::strerror(rc), " (build //:satdar)"));
  }
  ::close(in[0]);
  ::close(out[1]);
  std::unique_ptr<TokenizerProcess> t(new TokenizerProcess());
  t->model_path_ = model_path;
  t->pid_ = pid;
  t->to_child_ = in[1];
  t->from_child_ = out[0];
  // The header: {"vocab_size":V,"eos_id":E}, or {"error":"..."} when the model does not load.
  absl::StatusOr<std::string> line = t->ReadLine();
  if (!line.ok()) return line.status();
  const nlohmann::json h = nlohmann::json::parse(*line, nullptr, false);
  if (h.is_object() && h.contains("error") && h["error"].is_string()) {
    t->dead_ = true;  // it exits; the destructor reaps it
    return absl::InvalidArgumentError(h["error"].get<std::string>());
  }
  if (!h.is_object() || !h.contains("vocab_size") || !h["vocab_size"].is_number_integer() ||
      !h.contains("eos_id") || !h["eos_id"].is_number_integer() ||
      h["vocab_size"].get<int64_t>() < 1 || h["vocab_size"].get<int64_t>() > INT32_MAX ||
      h["eos_id"].get<int64_t>() < -1 || h["eos_id"].get<int64_t>() >= h["vocab_size"].get<int64_t>()) {
    return absl::InternalError(absl::StrCat("tokenizer process for ", model_path,
                                            ": unexpected first line '", *line, "'"));
  }
  t->vocab_size_ = static_cast<int>(h["vocab_size"].get<int64_t>());
  t->eos_id_ = static_cast<int>(h["eos_id"].get<int64_t>());
  return t;
}

TokenizerProcess::~TokenizerProcess() {
  // End of input ends the child; a child still writing gets SIGPIPE.
  if (to_child_ >= 0) ::close(to_child_);
  if (from_child_ >= 0) ::close(from_child_);
  if (pid_ > 0 && !reaped_) {
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

absl::Status TokenizerProcess::Died(const std::string& what) {
  dead_ = true;
  std::string how;
  // The pipe broke, so the child is ending: wait for it a little to say how it ended.
  for (int i = 0; i < 200 && !reaped_ && pid_ > 0; ++i) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      how = absl::StrCat(" (it ", DescribeExit(status), ")");
    } else if (r < 0 && errno != EINTR) {
      break;
    } else {
      const struct timespec ms = {0, 5 * 1000 * 1000};
      ::nanosleep(&ms, nullptr);
    }
  }
  return absl::InternalError(
      absl::StrCat("tokenizer process for ", model_path_, " (satdar-prep tokenize) ", what, how));
}

absl::Status TokenizerProcess::WriteAll(const std::string& bytes) {
  // A child that died must give EPIPE, not end this program: SIGPIPE is blocked in this thread
  // while writing, and one it raised is taken off the pending set before unblocking.
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  sigset_t pending;
  sigemptyset(&pending);
  ::sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  size_t done = 0;
  int error = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(to_child_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      error = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (error == EPIPE && !was_pending) {
    const struct timespec zero = {0, 0};
    while (::sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (error == EPIPE) return Died("has ended");
  if (error != 0) return Died(absl::StrCat("cannot be written to: ", std::strerror(error)));
  return absl::OkStatus();
}

absl::StatusOr<std::string> TokenizerProcess::ReadLine() {
  size_t scanned = 0;
  while (true) {
    const size_t nl = buffer_.find('\n', scanned);
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    scanned = buffer_.size();
    char chunk[65536];
    const ssize_t n = ::read(from_child_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Died(absl::StrCat("cannot be read from: ", std::strerror(errno)));
    if (n == 0) return Died("has ended");
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

absl::StatusOr<std::string> TokenizerProcess::Call(const std::string& request) {
  if (dead_) return Died("has ended");
  // The whole request goes out before the reply is read; the child reads a whole line before
  // it answers, so neither side waits on the other with a full pipe.
  SATDAR_RETURN_IF_ERROR(WriteAll(request));
  return ReadLine();
}

absl::StatusOr<std::vector<int32_t>> TokenizerProcess::Encode(const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  SATDAR_ASSIGN_OR_RETURN(const std::string line, Call(DumpLine({{"encode", text}})));
  const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
  if (r.is_object() && r.contains("ids") && r["ids"].is_array()) {
    std::vector<int32_t> ids;
    ids.reserve(r["ids"].size());
    bool ok = true;
    for (const nlohmann::json& id : r["ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size_) {
        ok = false;
        break;
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    if (ok) return ids;
  }
  return absl::InternalError(absl::StrCat("tokenizer process for ", model_path_,
                                          ": unexpected reply to encode: ", line.substr(0, 200)));
}

absl::StatusOr<std::string> TokenizerProcess::Decode(const std::vector<int32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " (position ", i,
                                                     ") is not a piece of tokenizer ", model_path_,
                                                     " [0, ", vocab_size_, ")"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  SATDAR_ASSIGN_OR_RETURN(const std::string line,
                          Call(DumpLine({{"decode", nlohmann::json(ids)}})));
  const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
  if (r.is_object() && r.contains("text") && r["text"].is_string()) {
    return r["text"].get<std::string>();
  }
  return absl::InternalError(absl::StrCat("tokenizer process for ", model_path_,
                                          ": unexpected reply to decode: ", line.substr(0, 200)));
}

absl::StatusOr<std::string> TokenizerProcess::NewText(const std::vector<int32_t>& ids,
                                                      std::string* printed, bool final) {
  SATDAR_ASSIGN_OR_RETURN(std::string text, Decode(ids));
  if (!final) {
    const size_t k = sizeof(kReplacementChar) - 1;
    while (text.size() >= k && text.compare(text.size() - k, k, kReplacementChar) == 0) {
      text.resize(text.size() - k);
    }
  }
  if (text.size() < printed->size() || text.compare(0, printed->size(), *printed) != 0) {
    return std::string();
  }
  std::string added = text.substr(printed->size());
  *printed = std::move(text);
  return added;
}

absl::StatusOr<std::string> ResolveTokenizerPath(const std::string& tokenizer_flag,
                                                 const std::string& data_dir) {
  if (tokenizer_flag.empty() == data_dir.empty()) {
    return absl::InvalidArgumentError(
        tokenizer_flag.empty()
            ? "give the tokenizer as --tokenizer M (a SentencePiece .model) or --data DIR (a "
              "dataset from satdar prep)"
            : "give either --tokenizer or --data, not both");
  }
  if (!tokenizer_flag.empty()) {
    if (absl::Status s = core::CheckRegularFile(tokenizer_flag); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tokenizer: ", s.message()));
    }
    return tokenizer_flag;
  }
  const std::string manifest = data_dir + "/manifest.json";
  auto text = core::ReadFileToString(manifest, core::kMaxSmallFileBytes);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--data: ", text.status().message()));
  }
  auto parsed = core::ParseJson(*text, manifest);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--data: ", parsed.status().message()));
  }
  const nlohmann::json& m = *parsed;
  if (!m.is_object() || !m.contains("tokenizer") || !m["tokenizer"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data: ", manifest, ": tokenizer must be a file name"));
  }
  const std::string name = m["tokenizer"].get<std::string>();
  // Inside the dataset folder, as data::Dataset::Open requires.
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data: ", manifest, ": tokenizer \"", name, "\" must be a file name inside ", data_dir));
  }
  const std::string path = data_dir + "/" + name;
  if (absl::Status s = core::CheckRegularFile(path); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--data: ", manifest, ": tokenizer: ", s.message()));
  }
  return path;
}

absl::Status CheckTokenizerFits(const std::string& model_path, int tokenizer_vocab,
                                int model_vocab) {
  if (tokenizer_vocab > model_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer ", model_path, " has ",
                                                   tokenizer_vocab,
                                                   " pieces but the config's vocab_size is ",
                                                   model_vocab));
  }
  return absl::OkStatus();
}

}  // namespace satdar::cli
