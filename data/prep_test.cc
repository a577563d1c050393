// satdar prep on real, messy inputs: lenient UTF-8 decoding (U+FFFD, BOM, CRLF, empty and
// binary files), --strict-utf8, JSONL corpora, prepared datasets refused as text, missing
// parent folders, and part-of-speech labels that follow the words' tags.
#include <sys/stat.h>

#include <map>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "core/json.h"
#include "core/testing/tmp_dir.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/pos.h"
#include "data/prep.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"

namespace satdar::data {
namespace {

using core::testing::TestTmpDir;

bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

void Write(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(core::WriteFileAtomically(path, bytes).ok()) << path;
}

PrepOptions Options(const std::string& input, const std::string& out) {
  PrepOptions o;
  o.inputs = {input};
  o.out = out;
  o.vocab_size = 300;
  o.val_fraction = 0;
  o.progress = false;
  return o;
}

// English prose long enough to train a 300-piece tokenizer on.
std::string Prose(int copies) {
  std::string s;
  for (int i = 0; i < copies; ++i) {
    s += "The committee said the city had handled the election well, and the jury agreed.\n"
         "A new law would be passed quickly; many of the practices were praised.\n";
  }
  return s;
}

nlohmann::json Manifest(const std::string& dir) {
  auto text = core::ReadFileToString(dir + "/manifest.json", core::kMaxSmallFileBytes);
  EXPECT_TRUE(text.ok());
  auto j = core::ParseJson(*text, "manifest.json");
  EXPECT_TRUE(j.ok());
  return *j;
}

TEST(DecodeText, ReplacesMaximalSubpartsAsPythonDoes) {
  DecodeStats st;
  // Latin-1 "café": one invalid byte, one U+FFFD.
  EXPECT_EQ(DecodeText("caf\xe9!", &st), "caf\xef\xbf\xbd!");
  EXPECT_EQ(st.replaced, 1);
  EXPECT_EQ(st.invalid_bytes, 1);
  // b"\xe2\x82" (a truncated euro sign) is one maximal subpart: one U+FFFD
  // (python3: b"a\xe2\x82b".decode("utf-8", "replace") == "a\ufffdb").
  EXPECT_EQ(DecodeText("a\xe2\x82" "b", &st), "a\xef\xbf\xbd" "b");
  EXPECT_EQ(st.replaced, 1);
  // An overlong lead (C0), a surrogate (ED A0 80) and F5: each byte its own U+FFFD, as Python.
  EXPECT_EQ(DecodeText("\xc0\xaf", &st), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(DecodeText("\xed\xa0\x80", &st), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(st.replaced, 3);
  // Valid multi-byte text is untouched; a BOM is dropped and CRLF becomes LF.
  EXPECT_EQ(DecodeText("\xef\xbb\xbfna\xc3\xafve\r\n\xe2\x82\xac\xf0\x9f\x98\x80\r", &st),
            "na\xc3\xafve\n\xe2\x82\xac\xf0\x9f\x98\x80\r");
  EXPECT_TRUE(st.bom);
  EXPECT_TRUE(st.crlf);
  EXPECT_EQ(st.replaced, 0);
  // Binary: a NUL byte, or mostly invalid.
  DecodeText(std::string("ab\0cd", 5), &st);
  EXPECT_EQ(BinaryReason(st, 5), "a NUL byte at offset 2");
  const std::string noise = "\x89\xfa\x91\xff\x80\x81 x";
  DecodeText(noise, &st);
  EXPECT_NE(BinaryReason(st, noise.size()).find("% of its bytes are not UTF-8 text"),
            std::string::npos);
  DecodeText("caf\xe9 au lait, s'il vous pla\xeet", &st);
  EXPECT_EQ(BinaryReason(st, 29), "");
}

TEST(Prep, MessyTextIsDecodedCountedAndBinaryFilesSkipped) {
  const std::string in = TestTmpDir("prep_messy_in");
  Write(in + "/a_latin1.txt", Prose(30) + "Le caf\xe9 est ferm\xe9.\n");
  Write(in + "/b_bom_crlf.txt", "\xef\xbb\xbf" + Prose(10) + "line one\r\nline two\r\n");
  Write(in + "/c_empty.txt", "");
  Write(in + "/d_binary.dat", std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10) + Prose(1));
  const std::string out = TestTmpDir("prep_messy") + "/not/yet/there/ds";  // parents missing
  auto s = Prep(Options(in, out));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->documents, 2);
  EXPECT_EQ(s->files, 2);
  EXPECT_EQ(s->replaced, 2);
  EXPECT_EQ(s->bom_files, 1);
  EXPECT_EQ(s->crlf_files, 1);
  const nlohmann::json d = Manifest(out)["decoding"];
  EXPECT_EQ(d["replaced_sequences"], 2);
  EXPECT_EQ(d["replaced_by_file"][in + "/a_latin1.txt"], 2);
  EXPECT_EQ(d["skipped_files"][in + "/c_empty.txt"], "empty");
  EXPECT_EQ(d["skipped_files"][in + "/d_binary.dat"], "binary (a NUL byte at offset 7)");
  EXPECT_EQ(d["bom_files"], 1);
  EXPECT_TRUE(Dataset::Open(out, 300).ok());
  // --strict-utf8 keeps the refusal, and leaves nothing behind.
  PrepOptions strict = Options(in, TestTmpDir("prep_messy") + "/strict");
  strict.strict_utf8 = true;
  auto refused = Prep(strict);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "a_latin1.txt is not text: a byte sequence that is not UTF-8 at offset"),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(Exists(strict.out));
  // Only binary files: an empty corpus.
  const std::string bin = TestTmpDir("prep_only_binary");
  Write(bin + "/x.bin", std::string("\0\1\2\3", 4));
  auto none = Prep(Options(bin, TestTmpDir("prep_messy") + "/none"));
  EXPECT_NE(none.status().message().find("empty corpus"), std::string::npos) << none.status();
}

TEST(Prep, APreparedDatasetIsNeverReadAsText) {
  const std::string in = TestTmpDir("prep_ds_in");
  Write(in + "/a.txt", Prose(30));
  const std::string ds = TestTmpDir("prep_ds") + "/ds";
  ASSERT_TRUE(Prep(Options(in, ds)).ok());
  auto again = Prep(Options(ds, TestTmpDir("prep_ds") + "/again"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(again.status().message().find("is a dataset written by satdar prep"),
            std::string::npos)
      << again.status();
  ASSERT_EQ(::unlink((ds + "/manifest.json").c_str()), 0);
  again = Prep(Options(ds, TestTmpDir("prep_ds") + "/again"));
  EXPECT_NE(again.status().message().find("but its manifest.json is missing"), std::string::npos)
      << again.status();
}

TEST(Prep, JsonlOneDocumentPerLine) {
  const std::string in = TestTmpDir("prep_jsonl_in");
  std::string jsonl;
  for (int i = 0; i < 40; ++i) {
    jsonl += nlohmann::json{{"id", i}, {"body", Prose(1) + std::to_string(i)}}.dump() + "\n";
    if (i == 5) jsonl += "\n";  // blank lines are skipped
  }
  jsonl += "{\"body\": \"\"}\n";  // an empty document is skipped
  Write(in + "/corpus.jsonl", jsonl);
  PrepOptions o = Options(in + "/corpus.jsonl", TestTmpDir("prep_jsonl") + "/ds");
  o.jsonl_key = "body";
  o.val_fraction = 0.1;
  auto s = Prep(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->documents, 40);
  EXPECT_GE(s->val_documents, 1);
  // The default key is "text": every line lacks it, and the error names file and line.
  o.jsonl_key = "text";
  o.out = TestTmpDir("prep_jsonl") + "/ds2";
  auto bad = Prep(o);
  EXPECT_EQ(bad.status().message(),
            "inputs: " + in + "/corpus.jsonl line 1: the object has no \"text\" field (the "
            "text's key: jsonl_key)");
  EXPECT_FALSE(Exists(o.out));
  struct Case {
    std::string line, error;
  } cases[] = {
      {"{\"text\": 3}", "line 2: field \"text\" is not a string"},
      {"[\"text\"]", "line 2: expected a JSON object (one document per line)"},
      {"{\"text\": \"a\"", "line 2: not valid JSON"},
      {"{\"text\": \"a\\u0000b\"}", "line 2: field \"text\" holds a NUL character"},
  };
  for (const Case& c : cases) {
    Write(in + "/bad.jsonl", "{\"text\": \"fine\"}\n" + c.line + "\n");
    PrepOptions b = Options(in + "/bad.jsonl", TestTmpDir("prep_jsonl") + "/bad");
    auto r = Prep(b);
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(in + "/bad.jsonl " + c.error), std::string::npos)
        << r.status();
    EXPECT_FALSE(Exists(b.out));
  }
}

// The labels follow the tags: every word's pieces carry its group (so each group has at least
// as many tokens as words), and "none" is left for the end-of-document tokens only.
TEST(Prep, PosLabelsFollowTheTags) {
  const std::string in = TestTmpDir("prep_pos_in");
  Write(in + "/cats.txt", "ca01 news\nca02 news\n");
  const std::string sentences[] = {
      "\tThe/at jury/nn said/vbd it/pps did/dod find/vb that/cs many/ap of/in Atlanta's/np$ "
      "registration/nn practices/nns were/bed well/ql handled/vbn ./.",
      "\tThe/at city/nn executive/jj committee/nn ,/, which/wdt had/hvd charge/nn of/in the/at "
      "election/nn ,/, deserves/vbz the/at praise/nn and/cc thanks/nns ./.",
      "\t``/`` Only/rb a/at relative/jj handful/nn ''/'' of/in reports/nns was/bedz received/vbn "
      "(/( he/pps said/vbd )/) ;/. a/at new/jj law/nn would/md be/be passed/vbn ./."};
  int words[kNumPosGroups] = {0, 0, 0, 0};
  for (const char* name : {"ca01", "ca02"}) {
    std::string text;
    for (int r = 0; r < 40; ++r) {
      const std::string& line = sentences[r % 3];
      text += "\n\n" + line + "\n";
      for (const TaggedWord& w : ParseBrownLine(line)) ++words[w.group];
    }
    Write(in + "/" + name, text);
  }
  const std::string out = TestTmpDir("prep_pos") + "/ds";
  auto s = Prep(Options(in, out));
  ASSERT_TRUE(s.ok()) << s.status();
  auto ds = Dataset::Open(out, 300);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_TRUE((*ds)->has_pos());
  std::string error;
  auto tokenizer = Tokenizer::Load(out + "/tokenizer.model", &error);
  ASSERT_NE(tokenizer, nullptr) << error;
  int64_t tokens[kNumPosGroups] = {0, 0, 0, 0};
  int64_t eos = 0, blank = 0;
  for (uint64_t i = 0; i < (*ds)->tokens(Split::kTrain); ++i) {
    const int id = static_cast<int>((*ds)->token(Split::kTrain, i));
    const int group = (*ds)->pos(Split::kTrain, i);
    ++tokens[group];
    // A piece of whitespace only ("▁" alone, as a small vocabulary keeps it) is in no word;
    // every other piece is in one, since this text is nothing but words.
    std::string piece = tokenizer->Piece(id);
    for (size_t at; (at = piece.find("\xe2\x96\x81")) != std::string::npos;) piece.erase(at, 3);
    const bool whitespace = piece.empty();
    if (id == tokenizer->eos_id()) {
      ++eos;
      EXPECT_EQ(group, kPosNone);
    } else if (whitespace) {
      ++blank;
      EXPECT_EQ(group, kPosNone) << "a whitespace piece at token " << i;
    } else {
      ASSERT_NE(group, kPosNone) << "piece '" << tokenizer->Piece(id) << "' at token " << i;
    }
  }
  EXPECT_EQ(words[kPosNone], 0);
  for (int g : {kPosContent, kPosFunction, kPosPunctuation}) {
    EXPECT_GE(tokens[g], words[g]) << PosGroupName(g);
  }
  EXPECT_EQ(eos, s->documents);
  EXPECT_EQ(tokens[kPosNone], eos + blank);
}

}  // namespace
}  // namespace satdar::data
