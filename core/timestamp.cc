#include "core/timestamp.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace satdar::core {

std::string UtcTimestamp(int64_t unix_ms) {
  const std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm;
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(unix_ms % 1000));
  return buf;
}

std::string UtcTimestamp() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return UtcTimestamp(std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
}

}  // namespace satdar::core
