// runtime/checkpoint_dir.h: one run's hold on its checkpoint folder.
//
//   SATDAR_ASSIGN_OR_RETURN(auto hold, CheckpointDirLock::Acquire(dir, resume, &note));
//   ... train; the folder stays locked until `hold` is destroyed (or the process dies) ...
//
// Acquire creates the folder, takes an exclusive lock on DIR/.satdar-lock (flock; the file
// names the holder: pid, host, start time), so a second trainer on the same folder is refused
// instead of interleaving its checkpoints with the first's. Holding the lock, it removes what a
// killed writer left (ckpt_*.tmp.<pid> files and ckpt_*.tmp folders), and it refuses a fresh
// run (resume false) into a folder that already holds checkpoints, which the run would
// otherwise overwrite and rotate away. Refusals are AlreadyExists (exit code 2) naming the
// folder and the holder or the newest checkpoint; with a `wait` (a worker's retry, waiting for
// the stopped attempt's rank to let go), a lock still held after it is Unavailable (exit code
// 1: a fault the coordinator retries, never bad input).
#ifndef SATDAR_RUNTIME_CHECKPOINT_DIR_H_
#define SATDAR_RUNTIME_CHECKPOINT_DIR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace satdar::runtime {

inline constexpr char kLockFileName[] = ".satdar-lock";

class CheckpointDirLock {
 public:
  // *note (may be null) says what was cleaned up, or is left empty.
  // wait: how long to retry while another run holds the lock.
  static absl::StatusOr<std::unique_ptr<CheckpointDirLock>> Acquire(
      const std::string& dir, bool resume, std::string* note,
      absl::Duration wait = absl::ZeroDuration());
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  explicit CheckpointDirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_CHECKPOINT_DIR_H_
