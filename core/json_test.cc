#include "core/json.h"

#include <string>

#include "gtest/gtest.h"

namespace satdar::core {
namespace {

TEST(ParseJson, ParsesWhatNlohmannParses) {
  auto j = ParseJson(R"({"a": 1, "b": [1, 2, {"c": "x"}], "d": null, "e": 1.5})", "t.json");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["b"][2]["c"], "x");
  EXPECT_EQ((*j)["e"], 1.5);
}

struct Bad {
  std::string text;
  std::string message;
};

TEST(ParseJson, RefusesWhatWouldBeReadSilently) {
  const Bad cases[] = {
      {R"({"a": 1, "a": 2})", "t.json: not valid JSON: duplicate key \"a\""},
      {R"({"moe": {"top_k": 1, "top_k": 2}})", "duplicate key \"moe.top_k\""},
      {R"({"shards": [{"file": "x"}, {"file": "y", "file": "z"}]})",
       "duplicate key \"shards[1].file\""},
      {R"({"a": 1e999})", "number overflow parsing '1e999'"},
      {R"({"a": -1e400})", "number overflow"},
      {"{\"a\": 1,", "t.json: not valid JSON: parse error at line 1, column 9"},
      {"", "t.json: not valid JSON"},
      {std::string(100, '[') + std::string(100, ']'), "nested deeper than 64 levels"},
  };
  for (const Bad& b : cases) {
    auto j = ParseJson(b.text, "t.json");
    ASSERT_FALSE(j.ok()) << b.text;
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(j.status().message().find(b.message), std::string::npos)
        << j.status() << " lacks " << b.message;
  }
}

TEST(ParseJson, SameKeyInDifferentObjectsIsFine) {
  auto j = ParseJson(R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 3}, {"x": 4}]})", "t");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["c"][1]["x"], 4);
}

}  // namespace
}  // namespace satdar::core
