#include "agent/jsonl_tail.h"

#include <sys/stat.h>

#include <cstdio>

namespace satdar::agent {

namespace {
int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}
}  // namespace

JsonlTail::JsonlTail(std::string path, int64_t max_bytes)
    : path_(std::move(path)), max_bytes_(max_bytes) {
  offset_ = std::max<int64_t>(0, FileSize(path_));
}

std::vector<std::string> JsonlTail::TakeRecords() {
  std::vector<std::string> lines;
  const int64_t size = FileSize(path_);
  if (size < 0) return lines;
  if (size < offset_) {  // replaced by a shorter file
    offset_ = 0;
    skipping_ = false;
  }
  if (size == offset_) return lines;
  std::FILE* f = std::fopen(path_.c_str(), "rb");
  if (f == nullptr) return lines;
  std::string buf(static_cast<size_t>(std::min(size - offset_, max_bytes_)), '\0');
  const bool ok = std::fseek(f, static_cast<long>(offset_), SEEK_SET) == 0 &&
                  std::fread(buf.data(), 1, buf.size(), f) == buf.size();
  std::fclose(f);
  if (!ok) return lines;
  size_t start = 0;
  for (size_t nl = buf.find('\n'); nl != std::string::npos; nl = buf.find('\n', start)) {
    // The end of a line too long to hand out is dropped with the rest of it.
    if (nl > start && !skipping_) lines.push_back(buf.substr(start, nl - start));
    skipping_ = false;
    start = nl + 1;
  }
  if (start == 0 && static_cast<int64_t>(buf.size()) == max_bytes_) {
    start = buf.size();  // a line longer than max_bytes: skipped to its end
    skipping_ = true;
  }
  offset_ += static_cast<int64_t>(start);
  return lines;
}

}  // namespace satdar::agent
