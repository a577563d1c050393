// core/folder_lock.h: one process's exclusive hold on a folder, for the servers whose folder
// must never be shared: the coordinator's --state-dir and a worker's --work-dir.
//
//   SATDAR_ASSIGN_OR_RETURN(auto lock, FolderLock::Acquire(dir, "coordinator.lock",
//                                                          "--state-dir", "coordinator"));
//   ... the folder stays locked until `lock` is destroyed or the process ends ...
//
// The lock is flock(2) on DIR/NAME, a file that names the holder ("pid 123 on host h since
// 2026-12-02 11:40:00 UTC"); the kernel drops it when the holder dies, so a killed server never
// leaves a stale lock. On a file system without locks (some NFS setups) Acquire succeeds
// unlocked and says so in `note`.
#ifndef SATDAR_CORE_FOLDER_LOCK_H_
#define SATDAR_CORE_FOLDER_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace satdar::core {

class FolderLock {
 public:
  // REQUIRES: dir exists. AlreadyExists "<flag>: <dir> is in use by another <holder_kind>
  // (<holder>)" when another process holds the lock; InvalidArgument naming the flag when the
  // lock file cannot be created. *note (may be null) is set when the lock could not be taken
  // because the file system has none.
  static absl::StatusOr<std::unique_ptr<FolderLock>> Acquire(const std::string& dir,
                                                             const std::string& name,
                                                             const std::string& flag,
                                                             const std::string& holder_kind,
                                                             std::string* note = nullptr);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace satdar::core

#endif  // SATDAR_CORE_FOLDER_LOCK_H_
