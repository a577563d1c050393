// core/parse_number.h: numbers read from text a person wrote (a flag, a job-spec field), with
// bounds, and errors that name what was read. Shared by cli/flags (the command line) and
// settings/ (flags and job specs), so both say the same thing about the same mistake.
//
//   SATDAR_ASSIGN_OR_RETURN(int64_t steps,
//                           core::ParseBoundedInt("flag --steps", text, 1, 1000000));
//   // "flag --steps must be >= 1, got 0"
#ifndef SATDAR_CORE_PARSE_NUMBER_H_
#define SATDAR_CORE_PARSE_NUMBER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace satdar::core {

// An integer in [min_value, max_value]. InvalidArgument, starting with `subject`, for text that
// is not an integer ("must be an integer, got 'x'"), digits beyond int64 ("is out of range (min
// to max), got ..."), or a value outside the bounds ("must be >= min" / "must be <= max").
absl::StatusOr<int64_t> ParseBoundedInt(absl::string_view subject, absl::string_view text,
                                        int64_t min_value, int64_t max_value);

// A finite number above min_value (or equal to it when min_inclusive) and at most max_value.
// InvalidArgument, starting with `subject`, otherwise ("must be a finite number, got 'x'",
// "must be > min", "must be >= min", "must be <= max").
absl::StatusOr<double> ParseBoundedDouble(absl::string_view subject, absl::string_view text,
                                          double min_value, bool min_inclusive,
                                          double max_value);

// "a, b or c" ("" for no choices).
std::string JoinChoices(const std::vector<std::string>& choices);

}  // namespace satdar::core

#endif  // SATDAR_CORE_PARSE_NUMBER_H_
