#include "comm/kv_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"

namespace satdar::comm {

namespace {

std::string Escape(const std::string& key) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "k_";
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  const char* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FileKvStore>> FileKvStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("the rendezvous store directory is empty");
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat("rendezvous store ", dir, " is not reachable: ",
                                               "cannot create it: ", std::strerror(errno)));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous store ", dir, " is not reachable: not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous store ", dir, " is not reachable: ", std::strerror(errno)));
  }
  return std::unique_ptr<FileKvStore>(new FileKvStore(dir));
}

std::string FileKvStore::PathOf(const std::string& key) const {
  return absl::StrCat(dir_, "/", Escape(key));
}

absl::Status FileKvStore::Set(const std::string& key, const std::string& value) {
  // Escaped keys never contain '.', so a temporary name cannot be another key's file. The
  // counter keeps two threads of one process that set the same key apart.
  static std::atomic<uint64_t> counter{0};
  const std::string path = PathOf(key);
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("rendezvous store ", dir_, ": cannot create ", tmp,
                                               ": ", std::strerror(errno)));
  }
  absl::Status s = WriteAll(fd, value, tmp);
  if (::close(fd) != 0 && s.ok()) {
    s = absl::UnavailableError(absl::StrCat("cannot close ", tmp, ": ", std::strerror(errno)));
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = absl::UnavailableError(absl::StrCat("rendezvous store ", dir_, ": cannot rename ", tmp,
                                            " to ", path, ": ", std::strerror(errno)));
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

absl::StatusOr<std::string> FileKvStore::TryGet(const std::string& key) {
  absl::StatusOr<std::string> v = core::ReadFileToString(PathOf(key), core::kMaxSmallFileBytes);
  if (v.ok() || absl::IsNotFound(v.status())) return v;
  return absl::UnavailableError(absl::StrCat("rendezvous store ", dir_, ": cannot read key '", key,
                                             "': ", v.status().message()));
}

absl::StatusOr<std::string> FileKvStore::Get(const std::string& key, absl::Duration timeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + absl::ToChronoMilliseconds(timeout);
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    absl::StatusOr<std::string> v = TryGet(key);
    if (!absl::IsNotFound(v.status())) return v;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("key '", key, "' did not appear in the rendezvous store ", dir_, " within ",
                       absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace satdar::comm
