// runtime/jsonl_writer.h: appends one JSON object per line to a file (the --log-jsonl log of
// the CPU and GPU trainers), flushed after every line so a killed run keeps what it logged.
// A line that cannot be written (a full disk, an I/O error) is an error, never lost silently.
#ifndef SATDAR_RUNTIME_JSONL_WRITER_H_
#define SATDAR_RUNTIME_JSONL_WRITER_H_

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace satdar::runtime {

// Drops the records of `path` whose "step" is past `step` (and a last line cut short by a
// kill), replacing the file atomically when anything is dropped; returns how many were. A
// missing file is OK (0).
absl::StatusOr<int64_t> DropJsonlStepsAfter(const std::string& path, int64_t step);

class JsonlWriter {
 public:
  JsonlWriter() = default;
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  ~JsonlWriter() {
    if (file_ != nullptr) std::fclose(file_);
  }
  // Creates the file or appends to it.
  absl::Status Open(const std::string& path) {
    path_ = path;
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("log_jsonl: cannot open ", path, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  // OK without doing anything when no file was opened.
  absl::Status Write(const nlohmann::json& j) {
    if (file_ == nullptr) return absl::OkStatus();
    const std::string line = j.dump() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() ||
        std::fflush(file_) != 0) {
      return absl::InternalError(
          absl::StrCat("log_jsonl: cannot write ", path_, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  std::string path_;
  FILE* file_ = nullptr;
};

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_JSONL_WRITER_H_
