#include "core/address.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace satdar::core {

absl::Status SplitHostPort(const std::string& address, const std::string& what,
                           std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  int p = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", address, "' is not HOST:PORT (PORT 0..65535)"));
  }
  if (host != nullptr) *host = address.substr(0, colon);
  if (port != nullptr) *port = p;
  return absl::OkStatus();
}

}  // namespace satdar::core
