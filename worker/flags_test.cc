#include "worker/flags.h"

#include "gtest/gtest.h"

namespace satdar::worker {
namespace {

FlagSet Make() {
  FlagSet f("train");
  f.Define("--steps", "steps", true);
  f.Define("--lr", "lr", false, "1e-3");
  f.DefineBool("--resume", "resume");
  f.DefineList("--input", "inputs");
  return f;
}

TEST(Flags, ParsesForms) {
  FlagSet f = Make();
  ASSERT_TRUE(f.Parse({"--steps", "10", "--lr=0.5", "--resume", "--input", "a", "b"}).ok());
  EXPECT_EQ(*f.GetInt("--steps", 1), 10);
  EXPECT_EQ(*f.GetDouble("--lr", 0), 0.5);
  EXPECT_TRUE(f.GetBool("--resume"));
  EXPECT_EQ(f.GetList("--input"), (std::vector<std::string>{"a", "b"}));
  FlagSet g = Make();
  ASSERT_TRUE(g.Parse({"--steps=3"}).ok());
  EXPECT_EQ(*g.GetDouble("--lr", 0), 1e-3);
  EXPECT_FALSE(g.GetBool("--resume"));
  EXPECT_FALSE(g.Has("--lr"));
}

TEST(Flags, ErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{}, "satdar train: missing required flag --steps"},
      {{"--steps", "1", "--colour", "red"}, "unknown flag --colour"},
      {{"--steps"}, "flag --steps needs a value"},
      {{"--steps", "1", "--steps", "2"}, "flag --steps given twice"},
      {{"--steps", "1", "stray"}, "unexpected argument 'stray'"},
      {{"--steps", "1", "--resume=maybe"}, "flag --resume takes no value or true/false"},
  };
  for (const Case& c : cases) {
    FlagSet f = Make();
    absl::Status s = f.Parse(c.args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s;
  }
  FlagSet f = Make();
  ASSERT_TRUE(f.Parse({"--steps", "x1", "--lr", "-2"}).ok());
  EXPECT_NE(f.GetInt("--steps", 1).status().message().find("flag --steps must be an integer, got 'x1'"),
            std::string::npos);
  EXPECT_NE(f.GetDouble("--lr", 0, false).status().message().find("flag --lr must be > 0"),
            std::string::npos);
}

}  // namespace
}  // namespace satdar::worker
