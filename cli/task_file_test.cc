// Task files (cli/task_file.h): every bad line, record and field is InvalidArgument naming
// FILE:LINE and the field; tokenization splits context + continuation the lm-eval-harness way.
#include "cli/task_file.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace satdar::cli {
namespace {

// A word-level encoder: each space-separated word (with its leading space) is one id, its
// length + 10; "x" (alone) encodes to nothing.
absl::StatusOr<std::vector<int32_t>> Words(const std::string& text) {
  std::vector<int32_t> ids;
  if (text == "x") return ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(' ', i + 1);
    if (j == std::string::npos) j = text.size();
    ids.push_back(static_cast<int32_t>(10 + j - i));
    i = j;
  }
  return ids;
}

TEST(TaskFile, ParsesEachTypeAndNamesTheTask) {
  auto f = ParseTaskFile("dir/hs.jsonl",
                         "\xEF\xBB\xBF{\"type\": \"choice\", \"context\": \"a bb\", \"choices\": "
                         "[\" ccc\", \" d\"], \"answer\": 1}\n\n"
                         "{\"type\": \"choice\", \"context\": \"\", \"choices\": [\"e\"], "
                         "\"answer\": 0}\r\n");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->name, "hs");
  EXPECT_EQ(f->kind, runtime::TaskKind::kChoice);
  ASSERT_EQ(f->records.size(), 2u);
  EXPECT_EQ(f->records[1].line, 3);
  auto t = TokenizeTaskFile(*f, Words);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name, "hs");
  ASSERT_EQ(t->choice.size(), 2u);
  EXPECT_EQ(t->choice[0].context, (std::vector<int32_t>{11, 13}));
  EXPECT_EQ(t->choice[0].choices, (std::vector<std::vector<int32_t>>{{14}, {12}}));
  EXPECT_EQ(t->choice[0].choice_bytes, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t->choice[0].answer, 1);
  EXPECT_TRUE(t->choice[1].context.empty());
  EXPECT_EQ(t->where, (std::vector<std::string>{"dir/hs.jsonl:1", "dir/hs.jsonl:3"}));

  auto cloze = ParseTaskFile("lambada.jsonl",
                             "{\"type\": \"cloze\", \"context\": \"a\", \"target\": \" bb\"}\n");
  ASSERT_TRUE(cloze.ok()) << cloze.status();
  auto ct = TokenizeTaskFile(*cloze, Words);
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(ct->cloze[0].target, (std::vector<int32_t>{13}));
  auto recall = ParseTaskFile("squad", "{\"type\": \"recall\", \"prompt\": \"\", \"answers\": [\"A\"]}");
  ASSERT_TRUE(recall.ok()) << recall.status();
  EXPECT_EQ(recall->name, "squad");
  EXPECT_EQ(recall->kind, runtime::TaskKind::kRecall);
  EXPECT_EQ(TaskNameOf("a/b/.jsonl"), ".jsonl");
}

TEST(TaskFile, BadRecordsNameFileLineAndField) {
  const std::string ok = "{\"type\": \"choice\", \"context\": \"a\", \"choices\": [\"b\"], \"answer\": 0}\n";
  struct Case {
    std::string line;
    std::string message;
  } cases[] = {
      {"not json", "t.jsonl:2: not valid JSON"},
      {"[1, 2]", "t.jsonl:2: a record must be a JSON object, got array"},
      {"{\"context\": \"a\"}", "t.jsonl:2: field \"type\": missing"},
      {"{\"type\": \"essay\"}", "t.jsonl:2: field \"type\": must be choice, cloze or recall"},
      {"{\"type\": \"cloze\", \"context\": \"a\", \"target\": \"b\"}",
       "t.jsonl:2: field \"type\": \"cloze\" in a file of \"choice\" records"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": [\"b\"], \"answer\": 0, \"id\": 3}",
       "t.jsonl:2: field \"id\": unknown in a choice record"},
      {"{\"type\": \"choice\", \"context\": 5, \"choices\": [\"b\"], \"answer\": 0}",
       "t.jsonl:2: field \"context\": must be a string, got number"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": [], \"answer\": 0}",
       "t.jsonl:2: field \"choices\": is empty"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": \"b\", \"answer\": 0}",
       "t.jsonl:2: field \"choices\": must be an array of strings, got string"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": [\"b\", \"\"], \"answer\": 0}",
       "t.jsonl:2: field \"choices[1]\": is empty"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": [\"b\", 3], \"answer\": 0}",
       "t.jsonl:2: field \"choices[1]\": must be a string, got number"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": [\"b\"], \"answer\": 1}",
       "t.jsonl:2: field \"answer\": 1 is not the index of a choice (0 to 0)"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": [\"b\"], \"answer\": -1}",
       "t.jsonl:2: field \"answer\": -1 is not the index"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": [\"b\"], \"answer\": 0.5}",
       "t.jsonl:2: field \"answer\": must be an integer, got 0.5"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"choices\": [\"b\"]}",
       "t.jsonl:2: field \"answer\": missing"},
      {"{\"type\": \"choice\", \"context\": \"a\", \"context\": \"b\", \"choices\": [\"b\"], \"answer\": 0}",
       "t.jsonl:2: not valid JSON: duplicate key"},
  };
  for (const Case& c : cases) {
    auto f = ParseTaskFile("t.jsonl", ok + c.line + "\n");
    ASSERT_FALSE(f.ok()) << c.line;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(c.message), std::string::npos) << f.status();
  }
  auto empty = ParseTaskFile("e.jsonl", "\n  \n");
  EXPECT_NE(empty.status().message().find("e.jsonl: no records"), std::string::npos);
  auto cloze = ParseTaskFile("c.jsonl", "{\"type\": \"cloze\", \"context\": \"a\", \"target\": \"\"}");
  EXPECT_NE(cloze.status().message().find("c.jsonl:1: field \"target\": is empty"),
            std::string::npos);
  auto recall = ParseTaskFile("r.jsonl", "{\"type\": \"recall\", \"prompt\": \"a\"}");
  EXPECT_NE(recall.status().message().find("r.jsonl:1: field \"answers\": missing"),
            std::string::npos);
  // A choice that encodes to no tokens at all.
  auto none = ParseTaskFile("n.jsonl", "{\"type\": \"choice\", \"context\": \"\", \"choices\": "
                                       "[\"x\"], \"answer\": 0}");
  ASSERT_TRUE(none.ok());
  EXPECT_NE(TokenizeTaskFile(*none, Words).status().message().find(
                "n.jsonl:1: field \"choices[0]\": has no tokens"),
            std::string::npos);
}

}  // namespace
}  // namespace satdar::cli
