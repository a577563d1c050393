// worker/jsonl_writer.h: appends one JSON object per line to a file (the --log-jsonl log of
// the CPU and GPU trainers), flushed after every line so a killed run keeps what it logged.
#ifndef SATDAR_WORKER_JSONL_WRITER_H_
#define SATDAR_WORKER_JSONL_WRITER_H_

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace satdar::worker {

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
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--log-jsonl: cannot open ", path));
    }
    return absl::OkStatus();
  }
  // No-op when no file was opened.
  void Write(const nlohmann::json& j) {
    if (file_ == nullptr) return;
    std::fprintf(file_, "%s\n", j.dump().c_str());
    std::fflush(file_);
  }

 private:
  FILE* file_ = nullptr;
};

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_JSONL_WRITER_H_
