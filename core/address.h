// core/address.h: HOST:PORT addresses (port 0 asks the OS for a free one), parsed in one place
// for every server and flag that takes one.
#ifndef SATDAR_CORE_ADDRESS_H_
#define SATDAR_CORE_ADDRESS_H_

#include <string>

#include "absl/status/status.h"

namespace satdar::core {

// Splits HOST:PORT (the last colon separates them; HOST non-empty, PORT 0..65535). Either
// output may be null. InvalidArgument "<what> '<address>' is not HOST:PORT (PORT 0..65535)".
absl::Status SplitHostPort(const std::string& address, const std::string& what,
                           std::string* host, int* port);

// A host as a listener or peer is named: an IPv4 literal (127.0.0.1), an IPv6 literal (::1,
// also in brackets) or a DNS host name (labels of 1 to 63 letters, digits and '-', not
// starting or ending with '-', joined by '.', at most 253 bytes). InvalidArgument
// "<what> '<host>' is not a host name or an IP address ..." otherwise (the host printed with
// its control characters escaped).
absl::Status CheckHost(const std::string& host, const std::string& what);

}  // namespace satdar::core

#endif  // SATDAR_CORE_ADDRESS_H_
