// core/timestamp.h: the wall-clock time every log line and record carries, in UTC, ISO 8601
// with milliseconds ("2026-12-02T10:41:07.123Z"): sortable as text, unambiguous across nodes
// in different time zones, and what Prometheus, Loki and jq read.
#ifndef SATDAR_CORE_TIMESTAMP_H_
#define SATDAR_CORE_TIMESTAMP_H_

#include <cstdint>
#include <string>

namespace satdar::core {

// Now, or unix_ms (milliseconds since 1970-01-01 UTC).
std::string UtcTimestamp();
std::string UtcTimestamp(int64_t unix_ms);

}  // namespace satdar::core

#endif  // SATDAR_CORE_TIMESTAMP_H_
