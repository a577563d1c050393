#include "cli/flags.h"

#include "gtest/gtest.h"

namespace satdar::cli {
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
  EXPECT_EQ(*f.GetInt("--steps", 1, 100), 10);
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
  EXPECT_NE(f.GetInt("--steps", 1, 100).status().message().find("flag --steps must be an integer, got 'x1'"),
            std::string::npos);
  EXPECT_NE(f.GetDouble("--lr", 0, false).status().message().find("flag --lr must be > 0"),
            std::string::npos);
}

// Numbers are read as 64-bit with overflow detection and checked against both bounds: a value
// that does not fit is never truncated into one that does.
TEST(Flags, NumbersAreCheckedNeverTruncated) {
  struct Case {
    std::string value;
    std::string message;
  } cases[] = {
      {"4294967298", "flag --steps must be <= 1000, got 4294967298"},
      {"99999999999999999999", "flag --steps is out of range (1 to 1000), got 99999999999999999999"},
      {"-3", "flag --steps must be >= 1, got -3"},
      {"12abc", "flag --steps must be an integer, got '12abc'"},
      {"", "flag --steps must be an integer, got ''"},
  };
  for (const Case& c : cases) {
    FlagSet f = Make();
    ASSERT_TRUE(f.Parse({"--steps=" + c.value}).ok());
    absl::StatusOr<int64_t> v = f.GetInt("--steps", 1, 1000);
    ASSERT_FALSE(v.ok()) << c.value;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find(c.message), std::string::npos) << v.status();
  }
  for (const char* bad : {"inf", "-inf", "nan", "1e999", "infinity"}) {
    FlagSet f = Make();
    ASSERT_TRUE(f.Parse({"--steps", "1", "--lr", bad}).ok());
    absl::StatusOr<double> v = f.GetDouble("--lr", 0, false);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_NE(v.status().message().find("flag --lr must be a finite number"), std::string::npos)
        << v.status();
  }
  FlagSet f = Make();
  ASSERT_TRUE(f.Parse({"--steps", "1", "--lr", "2"}).ok());
  EXPECT_NE(f.GetDouble("--lr", 0, false, 1.0).status().message().find("flag --lr must be <= 1"),
            std::string::npos);
}

// An enum flag's value is checked by Parse, whether or not the command reads it later.
TEST(Flags, EnumsAreCheckedAtParse) {
  FlagSet f("train");
  f.DefineEnum("--data-format", "format", {"auto", "text", "brown"}, "auto");
  absl::Status s = f.Parse({"--data-format", "bogus"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "satdar train: flag --data-format must be auto, text or brown, got 'bogus'");
  FlagSet g("train");
  g.DefineEnum("--data-format", "format", {"auto", "text", "brown"}, "auto");
  ASSERT_TRUE(g.Parse({}).ok());
  EXPECT_EQ(g.Get("--data-format"), "auto");
  EXPECT_NE(g.Usage().find("--data-format auto|text|brown"), std::string::npos) << g.Usage();
}

TEST(Flags, UsageNamesTheArguments) {
  FlagSet f("status", "JOB");
  f.DefineBool("--json", "one JSON object");
  EXPECT_EQ(f.UsageLine(), "usage: satdar status JOB [flags]");
  EXPECT_EQ(f.Usage().rfind("usage: satdar status JOB [flags]\n", 0), 0u) << f.Usage();
  EXPECT_EQ(FlagSet("jobs").UsageLine(), "usage: satdar jobs [flags]");
}

// --task a --task b and --task a b both give every value, in order; a plain flag given twice is
// still an error.
TEST(Flags, RepeatedListsAccumulate) {
  FlagSet f("eval");
  f.DefineRepeatedList("--task", "tasks");
  f.Define("--seed", "seed");
  ASSERT_TRUE(f.Parse({"--task", "a.jsonl", "--seed", "1", "--task", "b.jsonl", "c.jsonl",
                       "--task=d.jsonl"})
                  .ok());
  EXPECT_EQ(f.GetList("--task"),
            (std::vector<std::string>{"a.jsonl", "b.jsonl", "c.jsonl", "d.jsonl"}));
  EXPECT_EQ(f.Get("--task"), "a.jsonl");
  EXPECT_NE(f.Usage().find("--task VALUE..."), std::string::npos) << f.Usage();
  FlagSet g("eval");
  g.DefineRepeatedList("--task", "tasks");
  g.Define("--seed", "seed");
  EXPECT_NE(g.Parse({"--seed", "1", "--seed", "2"}).message().find("flag --seed given twice"),
            std::string::npos);
  FlagSet h("eval");
  h.DefineRepeatedList("--task", "tasks");
  EXPECT_NE(h.Parse({"--task"}).message().find("flag --task needs a value"), std::string::npos);
}

// --json alone, --json FILE and --json=FILE; bare is "" and still Has().
TEST(Flags, OptionalValues) {
  auto make = [] {
    FlagSet f("eval");
    f.DefineOptionalValue("--json", "print JSON, or write it to this file");
    f.DefineBool("--repeat", "repeat");
    return f;
  };
  FlagSet bare = make();
  ASSERT_TRUE(bare.Parse({"--json", "--repeat"}).ok());
  EXPECT_TRUE(bare.Has("--json"));
  EXPECT_EQ(bare.Get("--json"), "");
  EXPECT_TRUE(bare.GetBool("--repeat"));
  FlagSet last = make();
  ASSERT_TRUE(last.Parse({"--repeat", "--json"}).ok());
  EXPECT_TRUE(last.Has("--json"));
  EXPECT_EQ(last.Get("--json"), "");
  FlagSet file = make();
  ASSERT_TRUE(file.Parse({"--json", "out.json", "--repeat"}).ok());
  EXPECT_EQ(file.Get("--json"), "out.json");
  FlagSet inline_file = make();
  ASSERT_TRUE(inline_file.Parse({"--json=out.json"}).ok());
  EXPECT_EQ(inline_file.Get("--json"), "out.json");
  FlagSet absent = make();
  ASSERT_TRUE(absent.Parse({}).ok());
  EXPECT_FALSE(absent.Has("--json"));
  FlagSet twice = make();
  EXPECT_NE(twice.Parse({"--json", "--json", "x"}).message().find("flag --json given twice"),
            std::string::npos);
  FlagSet stray = make();
  EXPECT_NE(stray.Parse({"--json", "a", "b"}).message().find("unexpected argument 'b'"),
            std::string::npos);
  EXPECT_NE(make().Usage().find("--json [VALUE]"), std::string::npos);
}

}  // namespace
}  // namespace satdar::cli
