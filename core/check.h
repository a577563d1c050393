// core/check.h: aborting checks for programmer errors, and Status propagation macros.
//
//   SATDAR_CHECK(n % 2 == 0) << "n must be even";      // aborts with file:line
//   SATDAR_RETURN_IF_ERROR(WriteFile(path));             // returns the error Status
//   SATDAR_ASSIGN_OR_RETURN(auto file, ReadFile(path));  // unwraps a StatusOr
//
// Errors that come from outside (files, flags, configs, peers) are absl::Status, never checks.
#ifndef SATDAR_CORE_CHECK_H_
#define SATDAR_CORE_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace satdar::core::internal {

// Collects a message and aborts when destroyed; used only through SATDAR_CHECK.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": check failed: " << cond << " ";
  }
  ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace satdar::core::internal

#define SATDAR_CHECK(cond)   \
  if (__builtin_expect(!!(cond), 1)) { \
  } else                               \
    ::satdar::core::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define SATDAR_STATUS_CONCAT_INNER(a, b) a##b
#define SATDAR_STATUS_CONCAT(a, b) SATDAR_STATUS_CONCAT_INNER(a, b)

#define SATDAR_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::absl::Status satdar_status_ = (expr);           \
    if (!satdar_status_.ok()) return satdar_status_;  \
  } while (0)

#define SATDAR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define SATDAR_ASSIGN_OR_RETURN(lhs, expr) \
  SATDAR_ASSIGN_OR_RETURN_IMPL(SATDAR_STATUS_CONCAT(satdar_statusor_, __LINE__), lhs, expr)

#endif  // SATDAR_CORE_CHECK_H_
