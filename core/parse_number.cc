#include "core/parse_number.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace satdar::core {

absl::StatusOr<int64_t> ParseBoundedInt(absl::string_view subject, absl::string_view text,
                                        int64_t min_value, int64_t max_value) {
  int64_t v;
  if (!absl::SimpleAtoi(text, &v)) {
    const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
    const bool digits = text.size() > sign &&
                        text.find_first_not_of("0123456789", sign) == absl::string_view::npos;
    return absl::InvalidArgumentError(
        digits ? absl::StrCat(subject, " is out of range (", min_value, " to ", max_value,
                              "), got ", text)
               : absl::StrCat(subject, " must be an integer, got '", text, "'"));
  }
  if (v < min_value) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, " must be >= ", min_value, ", got ", v));
  }
  if (v > max_value) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, " must be <= ", max_value, ", got ", v));
  }
  return v;
}

absl::StatusOr<double> ParseBoundedDouble(absl::string_view subject, absl::string_view text,
                                          double min_value, bool min_inclusive,
                                          double max_value) {
  double v;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, " must be a finite number, got '", text, "'"));
  }
  if (min_inclusive ? v < min_value : v <= min_value) {
    return absl::InvalidArgumentError(absl::StrCat(
        subject, " must be ", min_inclusive ? ">= " : "> ", min_value, ", got ", text));
  }
  if (v > max_value) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, " must be <= ", max_value, ", got ", text));
  }
  return v;
}

std::string JoinChoices(const std::vector<std::string>& choices) {
  if (choices.size() <= 1) return choices.empty() ? "" : choices.back();
  std::vector<std::string> head(choices.begin(), choices.end() - 1);
  return absl::StrCat(absl::StrJoin(head, ", "), " or ", choices.back());
}

}  // namespace satdar::core
