#include "core/address.h"

#include <string>

#include "gtest/gtest.h"

namespace satdar::core {
namespace {

TEST(CheckHost, HostNamesAndIpLiterals) {
  for (const char* good : {"127.0.0.1", "10.1.2.3", "::1", "[::1]", "fe80::1", "localhost",
                           "node-7.cluster.example", "a", "x1", "A-B.c"}) {
    EXPECT_TRUE(CheckHost(good, "--host").ok()) << good;
  }
  const std::string long_label(64, 'a');
  for (const std::string& bad :
       {std::string(""), std::string("-a"), std::string("a-"), std::string("a..b"),
        std::string("a.b."), std::string("a b"), std::string("host:80"), std::string("a_b"),
        long_label, std::string("127.0.0.1\0", 10), std::string("$(reboot)")}) {
    EXPECT_FALSE(CheckHost(bad, "--host").ok()) << bad;
  }
  EXPECT_EQ(CheckHost("bad host\x1b[2J", "satdar worker: --host").message(),
            "satdar worker: --host 'bad host\\x1b[2J' is not a host name or an IP address (an "
            "IPv4 or IPv6 literal, or labels of letters, digits and '-' joined by '.')");
}

}  // namespace
}  // namespace satdar::core
