// TokenizerProcess against a real satdar-prep: the binary's path comes as the test's first
// argument ($(location //:satdar-prep)) or in $SATDAR_PREP; the tokenizer is trained by running
// `satdar-prep --input ... --vocab-size 300` on generated text (no .model fixture exists).
#include "cli/tokenizer_process.h"

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::cli {
namespace {

using core::testing::TestTmpDir;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// $SATDAR_PREP, else the first argument that is not a gtest flag, made absolute.
std::string PrepBinary() {
  std::string path;
  if (const char* env = std::getenv("SATDAR_PREP"); env != nullptr && *env != '\0') {
    path = env;
  } else {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    for (size_t i = 0; i < all.size();) {
      const size_t end = all.find('\0', i);
      args.push_back(all.substr(i, end == std::string::npos ? std::string::npos : end - i));
      if (end == std::string::npos) break;
      i = end + 1;
    }
    for (size_t i = 1; i < args.size() && path.empty(); ++i) {
      if (args[i].rfind("--gtest", 0) != 0) path = args[i];
    }
  }
  if (path.empty()) return path;
  char real[PATH_MAX];
  return ::realpath(path.c_str(), real) != nullptr ? std::string(real) : path;
}

// Text to train a 300-piece tokenizer on: English words and some accented, CJK and currency
// text (a fixed generator, so every run trains the same model).
std::string Corpus() {
  const std::vector<std::string> words = {
      "the",   "committee", "said",     "city",       "had",     "handled", "election",
      "well",  "and",       "jury",     "agreed",     "a",       "new",     "law",
      "would", "be",        "passed",   "quickly",    "many",    "of",      "practices",
      "were",  "praised",   "caf\xc3\xa9", "na\xc3\xafve", "\xc3\xbc" "ber", "stra\xc3\x9f" "e",
      "\xe6\x9d\xb1\xe4\xba\xac", "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf",
      "\xe2\x82\xac" "100"};
  std::string text;
  uint64_t state = 12345;
  for (int line = 0; line < 3000; ++line) {
    for (int w = 0; w < 12; ++w) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      if (w > 0) text += ' ';
      text += words[(state >> 33) % words.size()];
    }
    text += '\n';
  }
  return text;
}

class TokenizerProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (prep_ != nullptr) return;  // once (--gtest_repeat)
    prep_ = new std::string(PrepBinary());
    if (prep_->empty()) return;
    const std::string base = TestTmpDir("tokenizer_process_test");
    const std::string in = base + "/text";
    ::mkdir(in.c_str(), 0755);
    ASSERT_TRUE(core::WriteFileAtomically(in + "/corpus.txt", Corpus()).ok());
    data_ = new std::string(base + "/data_" + std::to_string(::getpid()));
    const std::string command = "'" + *prep_ + "' --input '" + in + "' --out '" + *data_ +
                                "' --vocab-size 300 --val-fraction 0 --quiet >/dev/null 2>&1";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    model_ = new std::string(*data_ + "/tokenizer.model");
  }

  void SetUp() override {
    ASSERT_FALSE(prep_->empty())
        << "give satdar-prep as the first argument or as $SATDAR_PREP";
    ASSERT_NE(model_, nullptr);
  }

  std::unique_ptr<TokenizerProcess> StartOrDie() {
    auto t = TokenizerProcess::Start(*model_, *prep_);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }

  static std::string* prep_;
  static std::string* data_;
  static std::string* model_;
};

std::string* TokenizerProcessTest::prep_ = nullptr;
std::string* TokenizerProcessTest::data_ = nullptr;
std::string* TokenizerProcessTest::model_ = nullptr;

// Texts that SentencePiece's normalization (NFKC, extra spaces removed) leaves as they are.
const std::vector<std::string>& Sentences() {
  static const std::vector<std::string> s = {
      "The jury agreed.",
      "the committee said the city had handled the election well",
      "caf\xc3\xa9 na\xc3\xafve \xc3\xbc" "ber stra\xc3\x9f" "e",
      "\xe6\x9d\xb1\xe4\xba\xac \xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf "
      "\xe2\x82\xac" "100",
      "an emoji \xf0\x9f\x98\x80 the model never saw (byte fallback) and \xce\xa9!",
  };
  return s;
}

TEST_F(TokenizerProcessTest, EncodeDecodeRoundTrip) {
  auto t = StartOrDie();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 300);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_EQ(t->model_path(), *model_);
  for (const std::string& text : Sentences()) {
    auto ids = t->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_FALSE(ids->empty()) << text;
    for (int32_t id : *ids) {
      EXPECT_GE(id, 3) << text;  // no <unk> (byte fallback), no BOS or EOS added
      EXPECT_LT(id, 300) << text;
    }
    auto back = t->Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, text);
    // EOS ends a document and decodes to nothing.
    std::vector<int32_t> with_eos = *ids;
    with_eos.push_back(2);
    EXPECT_EQ(*t->Decode(with_eos), text);
  }
  auto none = t->Encode("");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(*t->Decode({}), "");
}

// A request and a reply larger than a pipe's buffer go through (one at a time, no deadlock).
TEST_F(TokenizerProcessTest, LargeTextDoesNotDeadlock) {
  auto t = StartOrDie();
  ASSERT_NE(t, nullptr);
  std::string big;
  while (big.size() < (1u << 20)) big += "the jury said the new law would be passed quickly ";
  big += "end";
  auto ids = t->Encode(big);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_GT(ids->size(), 10000u);
  auto back = t->Decode(*ids);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, big);
  // The process still answers afterwards.
  EXPECT_EQ(*t->Decode(*t->Encode("The jury agreed.")), "The jury agreed.");
}

TEST_F(TokenizerProcessTest, DecodeRejectsIdsOutOfRange) {
  auto t = StartOrDie();
  ASSERT_NE(t, nullptr);
  for (int32_t bad : {-1, 300, 1 << 30}) {
    auto r = t->Decode({5, bad});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(std::string(r.status().message()), *model_)) << r.status();
  }
  EXPECT_TRUE(t->Decode({5}).ok());
}

// Printing tokens as they come gives the text of decoding them all at once (single-token
// decoding would lose the spaces before words).
TEST_F(TokenizerProcessTest, NewTextStreamsTheFullDecoding) {
  auto t = StartOrDie();
  ASSERT_NE(t, nullptr);
  for (const std::string& text : Sentences()) {
    auto ids = t->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    std::string printed, out;
    std::vector<int32_t> prefix;
    for (int32_t id : *ids) {
      prefix.push_back(id);
      auto piece = t->NewText(prefix, &printed);
      ASSERT_TRUE(piece.ok()) << piece.status();
      out += *piece;
      EXPECT_EQ(out, printed);
      // Nothing printed is ever an unfinished character.
      EXPECT_FALSE(Contains(out, "\xef\xbf\xbd")) << text;
    }
    auto rest = t->NewText(*ids, &printed, /*final=*/true);
    ASSERT_TRUE(rest.ok()) << rest.status();
    out += *rest;
    EXPECT_EQ(out, text);
    EXPECT_EQ(printed, text);
  }
}

// A character whose bytes come as byte-fallback pieces (<0xE2> <0x82> <0xAC>: the euro sign,
// ids 3 + byte) waits until it is whole; `final` prints an unfinished one as U+FFFD.
TEST_F(TokenizerProcessTest, NewTextHoldsBackUnfinishedCharacters) {
  auto t = StartOrDie();
  ASSERT_NE(t, nullptr);
  const int32_t e2 = 3 + 0xE2, x82 = 3 + 0x82, xac = 3 + 0xAC;
  std::string printed;
  auto a = t->NewText({e2}, &printed);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "");
  EXPECT_EQ(*t->NewText({e2, x82}, &printed), "");
  EXPECT_EQ(printed, "");
  EXPECT_EQ(*t->NewText({e2, x82, xac}, &printed), "\xe2\x82\xac");
  EXPECT_EQ(printed, "\xe2\x82\xac");
  std::string unfinished;
  EXPECT_EQ(*t->NewText({e2}, &unfinished, /*final=*/true), "\xef\xbf\xbd");
  // A decoding that does not extend what was printed prints nothing and changes nothing.
  std::string other = "something else";
  EXPECT_EQ(*t->NewText({e2, x82, xac}, &other), "");
  EXPECT_EQ(other, "something else");
}

TEST_F(TokenizerProcessTest, BadModelNamesTheFile) {
  const std::string dir = TestTmpDir("tokenizer_process_test");
  const std::string text = dir + "/not_a_model.txt";
  ASSERT_TRUE(core::WriteFileAtomically(text, "hello\n").ok());
  for (const std::string& path : {text, dir + "/missing.model", dir}) {
    auto t = TokenizerProcess::Start(path, *prep_);
    ASSERT_FALSE(t.ok()) << path;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
    EXPECT_TRUE(Contains(std::string(t.status().message()), path)) << t.status();
  }
}

TEST_F(TokenizerProcessTest, MissingPrepBinary) {
  const std::string missing = TestTmpDir("tokenizer_process_test") + "/no-satdar-prep";
  auto t = TokenizerProcess::Start(*model_, missing);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Contains(std::string(t.status().message()), missing)) << t.status();
}

// A child that died makes every later call fail (naming the model), not hang or end the
// program with SIGPIPE.
TEST_F(TokenizerProcessTest, DeadChildIsAnErrorNotAHang) {
  for (int round = 0; round < 2; ++round) {
    auto t = StartOrDie();
    ASSERT_NE(t, nullptr);
    ASSERT_TRUE(t->Encode("the jury").ok());
    ASSERT_EQ(::kill(t->pid(), SIGKILL), 0);
    // A large request on the first round (the write itself fails), a small one on the second
    // (it fits the pipe, and the reply never comes).
    const std::string request(round == 0 ? (4u << 20) : 8u, 'a');
    auto r = t->Encode(request);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
    EXPECT_TRUE(Contains(std::string(r.status().message()), *model_)) << r.status();
    EXPECT_TRUE(Contains(std::string(r.status().message()), "signal 9")) << r.status();
    auto d = t->Decode({5, 6});
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInternal) << d.status();
  }
}

TEST_F(TokenizerProcessTest, ResolveTokenizerPath) {
  auto both_empty = ResolveTokenizerPath("", "");
  EXPECT_EQ(both_empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(both_empty.status().message()), "--tokenizer"));
  EXPECT_TRUE(Contains(std::string(both_empty.status().message()), "--data"));
  auto both = ResolveTokenizerPath(*model_, *data_);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(both.status().message()), "not both")) << both.status();

  auto flag = ResolveTokenizerPath(*model_, "");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(*flag, *model_);
  auto from_data = ResolveTokenizerPath("", *data_);
  ASSERT_TRUE(from_data.ok()) << from_data.status();
  EXPECT_EQ(*from_data, *data_ + "/tokenizer.model");

  const std::string dir = TestTmpDir("tokenizer_process_test");
  auto missing_model = ResolveTokenizerPath(dir + "/missing.model", "");
  EXPECT_EQ(missing_model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(missing_model.status().message()), dir + "/missing.model"));
  auto missing_dir = ResolveTokenizerPath("", dir + "/no_such_dataset");
  EXPECT_EQ(missing_dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(missing_dir.status().message()), dir + "/no_such_dataset"))
      << missing_dir.status();

  struct Case {
    std::string manifest, message;
  } cases[] = {
      {"{\"tokenizer\": \"../tokenizer.model\"}", "must be a file name inside"},
      {"{\"tokenizer\": 7}", "tokenizer must be a file name"},
      {"{}", "tokenizer must be a file name"},
      {"{\"tokenizer\": \"gone.model\"}", "gone.model"},
      {"[1, 2", "manifest.json"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string ds = dir + "/bad_dataset_" + std::to_string(n++);
    ::mkdir(ds.c_str(), 0755);
    ASSERT_TRUE(core::WriteFileAtomically(ds + "/manifest.json", c.manifest).ok());
    auto r = ResolveTokenizerPath("", ds);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.manifest;
    EXPECT_TRUE(Contains(std::string(r.status().message()), c.message)) << r.status();
    EXPECT_TRUE(Contains(std::string(r.status().message()), ds)) << r.status();
  }
}

TEST(CheckTokenizerFits, MorePiecesThanTheModelIsAnError) {
  EXPECT_TRUE(CheckTokenizerFits("t.model", 300, 300).ok());
  EXPECT_TRUE(CheckTokenizerFits("t.model", 300, 512).ok());
  const absl::Status s = CheckTokenizerFits("t.model", 300, 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tokenizer t.model has 300 pieces but the config's vocab_size is 256");
}

}  // namespace
}  // namespace satdar::cli
