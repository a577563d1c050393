#include "core/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"

namespace satdar::core {

namespace {

std::string Holder() {
  char host[256] = "unknown";
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  std::tm utc;
  ::gmtime_r(&now, &utc);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &utc);
  return absl::StrCat("pid ", ::getpid(), " on host ", host, " since ", when);
}

}  // namespace

absl::StatusOr<std::unique_ptr<FolderLock>> FolderLock::Acquire(const std::string& dir,
                                                                const std::string& name,
                                                                const std::string& flag,
                                                                const std::string& holder_kind,
                                                                std::string* note) {
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot create the lock file ", path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
      if (note != nullptr) {
        *note = absl::StrCat("the file system of ", dir, " has no locks (", std::strerror(err),
                             "); a second ", holder_kind, " on it would not be refused");
      }
      return std::unique_ptr<FolderLock>(new FolderLock(fd));
    }
    char holder[512] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) {
      return absl::InternalError(absl::StrCat(flag, ": cannot lock ", path, ": ", std::strerror(err)));
    }
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "holder unknown";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    return absl::AlreadyExistsError(absl::StrCat(flag, ": ", dir, " is in use by another ",
                                                 holder_kind, " (", who, ")"));
  }
  const std::string me = Holder() + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot write the lock file ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<FolderLock>(new FolderLock(fd));
}

FolderLock::~FolderLock() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace satdar::core
