#include "runtime/checkpoint_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "absl/time/clock.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "runtime/checkpoint.h"

namespace satdar::runtime {

namespace {

// What a killed writer leaves: AtomicFileWriter's "<name>.tmp.<pid>" files and the sharded
// writer's "ckpt_<step>.tmp" folders.
bool IsStaleTemporary(const std::string& name) {
  if (!absl::StartsWith(name, "ckpt_")) return false;
  if (absl::EndsWith(name, ".tmp")) return true;
  const size_t tmp = name.rfind(".tmp.");
  return tmp != std::string::npos && name.size() > tmp + 5 &&
         name.find_first_not_of("0123456789", tmp + 5) == std::string::npos;
}

std::string Holder() {
  char host[256] = "unknown";
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return absl::StrCat("pid ", ::getpid(), " on host ", host, " since ", when);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointDirLock>> CheckpointDirLock::Acquire(
    const std::string& dir, bool resume, std::string* note, absl::Duration wait) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create checkpoint folder ", dir, ": ", std::strerror(errno)));
  }
  SATDAR_RETURN_IF_ERROR(core::CheckFolder(dir));
  const std::string lock_path = dir + "/" + kLockFileName;
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", lock_path, ": ", std::strerror(errno)));
  }
  const absl::Time give_up = absl::Now() + wait;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  bool locked = true;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
      // A file system without locks (some NFS and Lustre setups): run unlocked, and say so.
      locked = false;
      if (note != nullptr) {
        *note = absl::StrCat("the file system of ", dir, " has no locks (", std::strerror(err),
                             "); two runs in this folder would not be told apart");
      }
    } else {
      char holder[512] = {0};
      const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
      ::close(fd);
      if (err != EWOULDBLOCK) {
        return absl::InternalError(
            absl::StrCat("cannot lock ", lock_path, ": ", std::strerror(err)));
      }
      const std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "holder unknown";
      if (wait > absl::ZeroDuration()) {
        // A retry waiting for the stopped attempt's rank: a fault to retry, never bad input.
        return absl::UnavailableError(absl::StrCat(
            "checkpoint folder ", dir, " is still held by another run (", who, ") after ",
            absl::FormatDuration(wait), "; not starting beside it"));
      }
      return absl::AlreadyExistsError(absl::StrCat(
          "checkpoint folder ", dir, " is in use by another run (", who,
          "); two runs in one folder would overwrite each other's checkpoints"));
    }
  }
  auto lock = std::unique_ptr<CheckpointDirLock>(new CheckpointDirLock(fd));
  if (locked) {
    const std::string me = Holder();
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
      return absl::InternalError(
          absl::StrCat("cannot write ", lock_path, ": ", std::strerror(errno)));
    }
    // Holding the lock, no writer is active: whatever temporary is here is a dead one's.
    std::vector<std::string> stale;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (struct dirent* e = ::readdir(d)) {
        if (IsStaleTemporary(e->d_name)) stale.push_back(e->d_name);
      }
      ::closedir(d);
    }
    for (const std::string& name : stale) {
      SATDAR_RETURN_IF_ERROR(core::RemoveTree(dir + "/" + name));
    }
    if (note != nullptr && !stale.empty()) {
      *note = absl::StrCat("removed ", stale.size(), " temporary file(s) a killed run left in ", dir);
    }
  }
  if (!resume) {
    SATDAR_ASSIGN_OR_RETURN(std::string latest, FindLatestCheckpoint(dir));
    if (!latest.empty()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "checkpoint folder ", dir, " already holds checkpoints (newest: ", latest,
          "); set resume to continue that run, or give an empty folder"));
    }
  }
  return lock;
}

CheckpointDirLock::~CheckpointDirLock() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace satdar::runtime
