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
// not a readable regular file; the message names the path.
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

absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// 64-bit checksum of a byte range (word-at-a-time multiply-xor); continue with `seed`.
uint64_t Checksum64(const void* data, size_t n, uint64_t seed = 0x6a09e667f3bcc909ull);

}  // namespace satdar::core

#endif  // SATDAR_CORE_FILE_UTIL_H_
