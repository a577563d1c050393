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

}  // namespace satdar::core

#endif  // SATDAR_CORE_ADDRESS_H_
