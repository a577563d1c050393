#include <set>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "data/batches.h"
#include "data/corpus.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::data {
namespace {

using core::testing::TestTmpDir;

TEST(Corpus, StripsBrownTags) {
  EXPECT_EQ(StripBrownTags("\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ./.\n\n"
                           "\tIt/pps was/bedz 1/2/cd-nc ``/`` fine/jj ''/'' ./.\n"),
            "The Fulton County said .\nIt was 1/2 `` fine '' .\n");
}

TEST(Corpus, LoadsBrownFolderAndSkipsIndexFiles) {
  std::string dir = TestTmpDir("brown");
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/cats.txt", "ca01 news\n").ok());
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/README", "readme text\n").ok());
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/ca01", "\tA/at dog/nn ./.\n").ok());
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/cb02", "\tRan/vbd fast/rb ./.\n").ok());
  auto corpus = LoadCorpus(dir, CorpusFormat::kAuto);
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ(corpus->format, CorpusFormat::kBrown);
  EXPECT_EQ(corpus->num_files, 2);
  EXPECT_EQ(std::string(corpus->bytes.begin(), corpus->bytes.end()), "A dog .\nRan fast .\n");
}

TEST(Corpus, PlainTextAndErrors) {
  std::string dir = TestTmpDir("plain");
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/a.txt", "hello/world").ok());
  auto corpus = LoadCorpus(dir, CorpusFormat::kAuto);
  ASSERT_TRUE(corpus.ok());
  EXPECT_EQ(std::string(corpus->bytes.begin(), corpus->bytes.end()), "hello/world");
  auto missing = LoadCorpus("/nonexistent/dir", CorpusFormat::kText);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("data_dir: cannot open folder /nonexistent/dir"),
            std::string::npos);
  auto empty = LoadCorpus(TestTmpDir("empty"), CorpusFormat::kText);
  EXPECT_NE(empty.status().message().find("no text found"), std::string::npos);
  EXPECT_FALSE(ParseCorpusFormat("xml").ok());
}

TEST(Batches, PureFunctionOfSeedStepIndex) {
  SyntheticBatches a(7, 256), b(7, 256), c(8, 256);
  std::vector<int32_t> x(4 * 9), y(4 * 9), z(4 * 9);
  a.Batch(3, 0, 0, 4, 8, x.data());
  b.Batch(3, 0, 0, 4, 8, y.data());
  c.Batch(3, 0, 0, 4, 8, z.data());
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  // Sequence j does not depend on which batch slice asked for it.
  std::vector<int32_t> tail(2 * 9);
  a.Batch(3, 2, 0, 2, 8, tail.data());
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), x.begin() + 18));
  for (int32_t t : x) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 256);
  }
  // Different steps give different data.
  std::vector<int32_t> next(4 * 9);
  a.Batch(4, 0, 0, 4, 8, next.data());
  EXPECT_NE(x, next);
}

TEST(Batches, CorpusWindowsAreContiguousSlices) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(1000);
  for (size_t i = 0; i < bytes->size(); ++i) (*bytes)[i] = static_cast<uint8_t>(i % 251);
  CorpusWindows w(1, bytes);
  std::set<int32_t> starts;
  std::vector<int32_t> seq(17);
  for (int j = 0; j < 50; ++j) {
    w.Sequence(SampleKey{0, j, j}, 16, seq.data());
    for (int p = 1; p < 17; ++p) EXPECT_EQ(seq[p], (seq[p - 1] + 1) % 251);
    starts.insert(seq[0]);
  }
  EXPECT_GT(starts.size(), 30u);
}

}  // namespace
}  // namespace satdar::data
