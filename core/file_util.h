// core/file_util.h: files that are either written completely or not at all, and checksums.
//
//   AtomicFileWriter w;
//   SATDAR_RETURN_IF_ERROR(w.Open(path));       // writes to "<path>.tmp.<pid>"
//   SATDAR_RETURN_IF_ERROR(w.Append(data, n));
//   SATDAR_RETURN_IF_ERROR(w.Commit());         // fsync, rename over path, fsync the folder
//
// A writer destroyed before Commit removes its temporary file, so a crash or an error never
// leaves a half-written file under the final name.
#ifndef SATDAR_CORE_FILE_UTIL_H_
#define SATDAR_CORE_FILE_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace satdar::core {

class AtomicFileWriter {
 public:
  AtomicFileWriter() = default;
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  absl::Status Open(const std::string& path);
  absl::Status Append(const void* data, size_t n);
  absl::Status Commit();

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
};

// A whole file mapped read-only into memory (unmapped on destruction; moves, never copies).
// Open fails with NotFound for a missing path and InvalidArgument for anything else that is
// not a readable regular file (never blocking on a FIFO); the message names the path.
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const char* data() const { return static_cast<const char*>(map_); }
  size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  size_t size_ = 0;
};

// Inputs. Paths are checked before they are read, and opened so that nothing blocks: a FIFO,
// socket or device given where a file is meant is refused instead of waited on forever.
// Missing paths are NotFound, everything else InvalidArgument; messages name the path and
// what it is ("... is a FIFO (named pipe), not a regular file").
absl::Status CheckRegularFile(const std::string& path);
absl::Status CheckFolder(const std::string& path);
// "a regular file", "a folder", "a FIFO (named pipe)", ... or "missing".
std::string PathKind(const std::string& path);

// Size limits for ReadFileToString: files that must be small (configs, manifests, job specs)
// and files that may be as large as memory allows (text corpora, tokenizer models).
inline constexpr size_t kMaxSmallFileBytes = size_t{16} << 20;
inline constexpr size_t kNoSizeLimit = ~size_t{0};

// The whole of a regular file; InvalidArgument when it is larger than max_bytes.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes);

// Outputs, checked before any work starts (so a bad --out fails in a second, not at the end of
// a run): the folder exists and can be written, and the path is not a folder, FIFO or device.
// An existing regular file will be replaced. InvalidArgument naming the path otherwise.
absl::Status CheckOutputFile(const std::string& path);
// A folder that exists and can be written, or that can be created in a writable parent.
absl::Status CheckOutputFolder(const std::string& path);
// A folder that exists and can be written, or that mkdir -p can create: its nearest existing
// ancestor is a writable folder (what `satdar prep --out out/ds` needs on a fresh clone).
absl::Status CheckCreatableFolder(const std::string& path);
// True when both paths exist and are the same file (device and inode; links included).
bool SameFile(const std::string& a, const std::string& b);

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// Creates a folder and every missing parent (mkdir -p); InvalidArgument naming the part that
// cannot be created.
absl::Status MakeDirs(const std::string& path);
// Removes a file, or a folder with everything in it; OK when path does not exist.
absl::Status RemoveTree(const std::string& path);
// Makes a folder's entries (renames, new files) durable.
absl::Status FsyncDir(const std::string& dir);

// 64-bit checksum of a byte range (word-at-a-time multiply-xor); continue with `seed`.
uint64_t Checksum64(const void* data, size_t n, uint64_t seed = 0x6a09e667f3bcc909ull);

}  // namespace satdar::core

#endif  // SATDAR_CORE_FILE_UTIL_H_
