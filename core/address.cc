#include "core/address.h"

#include <arpa/inet.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/text.h"

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

absl::Status CheckHost(const std::string& host, const std::string& what) {
  unsigned char addr[16];
  if (::inet_pton(AF_INET, host.c_str(), addr) == 1 && host.find('\0') == std::string::npos) {
    return absl::OkStatus();
  }
  std::string v6 = host;
  if (v6.size() > 2 && v6.front() == '[' && v6.back() == ']') v6 = v6.substr(1, v6.size() - 2);
  if (v6.find('\0') == std::string::npos && ::inet_pton(AF_INET6, v6.c_str(), addr) == 1) {
    return absl::OkStatus();
  }
  bool ok = !host.empty() && host.size() <= 253;
  size_t label = 0;
  for (size_t i = 0; ok && i <= host.size(); ++i) {
    const char c = i < host.size() ? host[i] : '.';
    if (c == '.') {
      // A label: 1 to 63 bytes, neither starting nor ending with '-'.
      ok = label >= 1 && label <= 63 && host[i - label] != '-' && host[i - 1] != '-';
      label = 0;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '-') {
      ++label;
    } else {
      ok = false;
    }
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " '", PrintableShort(host, 256), "' is not a host name or an IP address (an IPv4 or "
      "IPv6 literal, or labels of letters, digits and '-' joined by '.')"));
}

}  // namespace satdar::core
