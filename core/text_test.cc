#include "core/text.h"

#include <string>

#include "gtest/gtest.h"

namespace satdar::core {
namespace {

TEST(Printable, KeepsTextAndEscapesWhatATerminalWouldObey) {
  EXPECT_EQ(Printable("demo-1 (lr=2e-3)"), "demo-1 (lr=2e-3)");
  EXPECT_EQ(Printable("na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac"), "na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac");
  EXPECT_EQ(Printable("\x1b[2Jgone"), "\\x1b[2Jgone");  // clear screen
  EXPECT_EQ(Printable("a\r\nJOB  forged"), "a\\x0d\\x0aJOB  forged");
  EXPECT_EQ(Printable(std::string("a\0b\x7f", 4)), "a\\x00b\\x7f");
  EXPECT_EQ(Printable("\xc2\x9b" "31m"), "\\u009b31m");        // C1 CSI
  EXPECT_EQ(Printable("x\xe2\x80\xaegnp.exe"), "x\\u202egnp.exe");  // right-to-left override
  EXPECT_EQ(Printable("\xff\xc3"), "\\xff\\xc3");               // not UTF-8
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");               // overlong '/'
  EXPECT_EQ(Printable("\\x1b"), "\\x1b");                       // a backslash stays
}

TEST(PrintableShort, CutsLongText) {
  EXPECT_EQ(PrintableShort("abc", 3), "abc");
  EXPECT_EQ(PrintableShort(std::string(10000, 'j'), 8), "jjjjjjjj...");
  EXPECT_EQ(PrintableShort("\x1b\x1b\x1b", 2), "\\x1b\\x1b...");
}

}  // namespace
}  // namespace satdar::core
