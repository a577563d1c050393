// The data pipeline: shards, keyed shuffles, prep (tokenizer, POS sidecars, splits), the
// dataset loader across data-parallel ranks and resumes, and MQAR.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "data/dataset.h"
#include "data/mqar.h"
#include "data/permutation.h"
#include "data/pos.h"
#include "data/prep.h"
#include "data/shard.h"
#include "data/stream.h"
#include "gtest/gtest.h"

namespace satdar::data {
namespace {

using core::testing::TestTmpDir;

bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

TEST(Shard, RoundTripAndCorruption) {
  const std::string path = TestTmpDir("shard") + "/a.bin";
  std::vector<uint32_t> tokens = {5, 1, 999, 0, 42};
  ASSERT_TRUE(WriteShard(path, tokens, {0, 3}, 2, 1000).ok());
  auto s = Shard::Open(path, 1000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->size(), 5u);
  EXPECT_EQ(s->at(2), 999u);
  EXPECT_EQ(s->doc_starts(), (std::vector<uint64_t>{0, 3}));
  // Ids must fit the model's vocabulary.
  auto small = Shard::Open(path, 500);
  EXPECT_NE(small.status().message().find("larger than the model's 500"), std::string::npos)
      << small.status();
  // Writing an id >= vocab is refused.
  EXPECT_NE(WriteShard(path + ".x", {7}, {0}, 2, 5).message().find("token id 7"), std::string::npos);
  EXPECT_FALSE(Exists(path + ".x"));
  // One flipped byte: checksum; a cut: truncated.
  auto bytes = core::ReadFileToString(path, core::kNoSizeLimit);
  ASSERT_TRUE(bytes.ok());
  std::string flipped = *bytes;
  flipped[kShardHeaderBytes + 1] ^= 1;
  ASSERT_TRUE(core::WriteFileAtomically(path, flipped).ok());
  EXPECT_NE(Shard::Open(path, 1000).status().message().find("checksum mismatch"), std::string::npos);
  ASSERT_TRUE(core::WriteFileAtomically(path, bytes->substr(0, bytes->size() - 3)).ok());
  EXPECT_NE(Shard::Open(path, 1000).status().message().find("truncated"), std::string::npos);
  ASSERT_TRUE(core::WriteFileAtomically(path, "NOTASHARD" + std::string(80, 'x')).ok());
  EXPECT_NE(Shard::Open(path, 1000).status().message().find("bad magic"), std::string::npos);
}

TEST(KeyedPermutation, IsABijectionAndKeyed) {
  for (uint64_t n : {1ull, 2ull, 7ull, 100ull, 1000ull, 4097ull}) {
    KeyedPermutation p(n, 11);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t x = p(i);
      ASSERT_LT(x, n);
      seen.insert(x);
    }
    EXPECT_EQ(seen.size(), n);
  }
  KeyedPermutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a(i) == b(i);
  EXPECT_LT(same, 20);
}

TEST(Pos, BrownTagGroups) {
  EXPECT_EQ(BrownTagGroup("nn"), kPosContent);
  EXPECT_EQ(BrownTagGroup("np-tl"), kPosContent);
  EXPECT_EQ(BrownTagGroup("vbd"), kPosContent);
  EXPECT_EQ(BrownTagGroup("jj"), kPosContent);
  EXPECT_EQ(BrownTagGroup("nn$"), kPosContent);
  EXPECT_EQ(BrownTagGroup("at"), kPosFunction);
  EXPECT_EQ(BrownTagGroup("in-hl"), kPosFunction);
  EXPECT_EQ(BrownTagGroup("pps+bez"), kPosFunction);
  EXPECT_EQ(BrownTagGroup("bedz"), kPosFunction);
  EXPECT_EQ(BrownTagGroup("fw-nn"), kPosContent);
  EXPECT_EQ(BrownTagGroup("*"), kPosFunction);
  EXPECT_EQ(BrownTagGroup("."), kPosPunctuation);
  EXPECT_EQ(BrownTagGroup("``"), kPosPunctuation);
  auto words = ParseBrownLine("\tThe/at jury/nn said/vbd ./.");
  ASSERT_EQ(words.size(), 4u);
  EXPECT_EQ(words[1].word, "jury");
  EXPECT_EQ(words[3].group, kPosPunctuation);
}

// A small Brown-format corpus: 12 documents of tagged sentences.
std::string WriteBrownFixture(const std::string& name) {
  const std::string dir = TestTmpDir(name);
  core::WriteFileAtomically(dir + "/cats.txt", "ca01 news\n").IgnoreError();
  const char* sentences[] = {
      "The/at jury/nn said/vbd it/pps did/dod find/vb that/cs many/ap of/in Atlanta's/np$ "
      "registration/nn practices/nns were/bed well/ql handled/vbn ./.",
      "The/at city/nn executive/jj committee/nn ,/, which/wdt had/hvd charge/nn of/in the/at "
      "election/nn ,/, deserves/vbz the/at praise/nn ./.",
      "Merger/nn proposed/vbn ;/. a/at new/jj law/nn would/md be/be passed/vbn quickly/rb ./."};
  for (int f = 0; f < 12; ++f) {
    std::string text;
    for (int r = 0; r < 20; ++r) text += std::string("\n\n\t") + sentences[(f + r) % 3] + "\n";
    char fname[8];
    std::snprintf(fname, sizeof(fname), "c%c%02d", 'a' + f % 3, f);
    core::WriteFileAtomically(dir + "/" + fname, text).IgnoreError();
  }
  return dir;
}

PrepOptions Options(const std::string& input, const std::string& out) {
  PrepOptions o;
  o.inputs = {input};
  o.out = out;
  o.vocab_size = 300;
  o.val_fraction = 0.2;
  o.progress = false;
  return o;
}

TEST(Prep, BrownDatasetWithAlignedPosGroups) {
  const std::string out = TestTmpDir("prep") + "/ds";
  auto summary = Prep(Options(WriteBrownFixture("brown_a"), out));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->documents, 12);
  EXPECT_GE(summary->val_documents, 1);
  EXPECT_EQ(summary->vocab_size, 300);
  EXPECT_FALSE(Exists(out + ".tmp." + std::to_string(::getpid())));
  auto ds = Dataset::Open(out, 300);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_TRUE((*ds)->has_pos());
  EXPECT_EQ((*ds)->tokens(Split::kTrain), static_cast<uint64_t>(summary->train_tokens));
  // Every document ends with EOS (id 2), whose group is "none"; words carry their groups.
  std::map<int, int> groups;
  int eos = 0;
  for (uint64_t i = 0; i < (*ds)->tokens(Split::kTrain); ++i) {
    const uint32_t t = (*ds)->token(Split::kTrain, i);
    const int g = (*ds)->pos(Split::kTrain, i);
    if (t == 2) {
      ++eos;
      EXPECT_EQ(g, kPosNone);
    }
    ++groups[g];
  }
  EXPECT_EQ(eos, summary->documents - summary->val_documents);
  EXPECT_GT(groups[kPosContent], groups[kPosPunctuation]);
  EXPECT_GT(groups[kPosFunction], 0);
  EXPECT_GT(groups[kPosPunctuation], 0);
  // The model's vocabulary must hold the tokenizer's.
  EXPECT_NE(Dataset::Open(out, 299).status().message().find("the tokenizer has 300 tokens"),
            std::string::npos);
}

// A POS sidecar byte outside the groups of data/pos.h (0..3) is refused when the dataset is
// opened, naming the file and the byte's offset, not read later as an index into the tallies.
TEST(Prep, PosSidecarByteOutsideItsGroupsIsRefused) {
  const std::string out = TestTmpDir("prep_pos_bad") + "/ds";
  ASSERT_TRUE(Prep(Options(WriteBrownFixture("brown_pos_bad"), out)).ok());
  const std::string sidecar = out + "/train_00000.pos";
  std::vector<uint32_t> groups;
  std::vector<uint64_t> docs;
  {
    auto pos = Shard::Open(sidecar, 0);
    ASSERT_TRUE(pos.ok()) << pos.status();
    ASSERT_GT(pos->size(), 5u);
    for (uint64_t i = 0; i < pos->size(); ++i) groups.push_back(pos->at(i));
    docs = pos->doc_starts();
  }
  groups[5] = kNumPosGroups;  // 4: one past the last group; the checksum stays valid
  ASSERT_TRUE(WriteShard(sidecar, groups, docs, 1, 0).ok());
  auto ds = Dataset::Open(out, 300);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ds.status().message(),
            "data_dir: " + out + ": train_00000.pos: byte 4 at offset 69 (token 5) is not a "
            "part-of-speech group (0 to 3)");
}

TEST(Prep, BadInputLeavesNothing) {
  const std::string base = TestTmpDir("prep_bad");
  // Empty corpus.
  const std::string empty = TestTmpDir("prep_empty_in");
  auto s = Prep(Options(empty, base + "/empty"));
  EXPECT_NE(s.status().message().find("empty corpus"), std::string::npos) << s.status();
  EXPECT_FALSE(Exists(base + "/empty"));
  // Output folder exists.
  s = Prep(Options(WriteBrownFixture("brown_b"), base));
  EXPECT_NE(s.status().message().find("already exists"), std::string::npos);
  // A tokenizer whose size is not --vocab-size.
  const std::string first = base + "/first";
  ASSERT_TRUE(Prep(Options(WriteBrownFixture("brown_c"), first)).ok());
  PrepOptions o = Options(WriteBrownFixture("brown_d"), base + "/second");
  o.tokenizer = first + "/tokenizer.model";
  o.vocab_size = 512;
  s = Prep(o);
  EXPECT_NE(s.status().message().find("has 300 pieces but vocab_size is 512"),
            std::string::npos) << s.status();
  EXPECT_FALSE(Exists(base + "/second"));
  // Reusing it at its own size works.
  o.vocab_size = 0;
  EXPECT_TRUE(Prep(o).ok());
  // Not a tokenizer.
  o.out = base + "/third";
  o.tokenizer = first + "/manifest.json";
  EXPECT_NE(Prep(o).status().message().find("is not a SentencePiece model"), std::string::npos);
  EXPECT_FALSE(Exists(base + "/third"));
}

std::shared_ptr<const Dataset> SmallDataset() {
  static std::shared_ptr<const Dataset> ds = [] {
    const std::string out = TestTmpDir("prep_loader") + "/ds";
    auto summary = Prep(Options(WriteBrownFixture("brown_loader"), out));
    SATDAR_CHECK(summary.ok()) << summary.status();
    auto d = Dataset::Open(out, 300);
    SATDAR_CHECK(d.ok()) << d.status();
    return *d;
  }();
  return ds;
}

TEST(Loader, EpochIsAPermutationOfTheSamples) {
  const int t = 16;
  DatasetBatches src(SmallDataset(), Split::kTrain, t, 5);
  const uint64_t n = src.samples_per_epoch();
  ASSERT_GT(n, 20u);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<uint64_t> starts;
    for (uint64_t i = 0; i < n; ++i) starts.insert(src.WindowStart(epoch * n + i));
    EXPECT_EQ(starts.size(), n);
    EXPECT_EQ(*starts.rbegin(), (n - 1) * t);
  }
  // A new shuffle every epoch.
  int same = 0;
  for (uint64_t i = 0; i < n; ++i) same += src.WindowStart(i) == src.WindowStart(n + i);
  EXPECT_LT(same, static_cast<int>(n / 4));
}

// Everything rank r of `world` reads in `steps` steps starting at (first_step, first_sample).
std::vector<std::vector<int32_t>> Read(const BatchSource* src, int world, int rank, int batch,
                                       int micro, int steps, int64_t first_step,
                                       int64_t first_sample) {
  BatchStream stream(src, {16, batch, micro, rank, world, first_step, first_sample});
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> b;
  for (int i = 0; i < steps * micro; ++i) {
    stream.Next(&b);
    for (int s = 0; s < batch / micro; ++s) {
      out.emplace_back(b.begin() + s * 17, b.begin() + (s + 1) * 17);
    }
  }
  return out;
}

TEST(Loader, RanksSplitTheGlobalBatchAndResumeContinues) {
  DatasetBatches src(SmallDataset(), Split::kTrain, 16, 5);
  // One rank with a global batch of 8 over 3 steps...
  auto single = Read(&src, 1, 0, 8, 2, 3, 1, 0);
  // ... equals 4 ranks of 2, interleaved per step.
  std::vector<std::vector<std::vector<int32_t>>> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(Read(&src, 4, r, 2, 1, 3, 1, 0));
  for (int step = 0; step < 3; ++step) {
    for (int r = 0; r < 4; ++r) {
      for (int s = 0; s < 2; ++s) {
        EXPECT_EQ(ranks[r][step * 2 + s], single[step * 8 + r * 2 + s]);
      }
    }
  }
  // Resuming at sample 8 (after one step) reads what the uninterrupted run read next...
  auto resumed = Read(&src, 1, 0, 8, 1, 2, 2, 8);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(resumed[i], single[8 + i]);
  // ... also with another number of ranks: 2 ranks of 4 continue at the same sample.
  auto r0 = Read(&src, 2, 0, 4, 1, 1, 2, 8), r1 = Read(&src, 2, 1, 4, 1, 1, 2, 8);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r0[i], single[8 + i]);
    EXPECT_EQ(r1[i], single[12 + i]);
  }
}

TEST(Mqar, SequencesAndQueryPositions) {
  MqarOptions o;
  o.keys = 10;
  o.values = 7;
  o.pairs = 4;
  o.queries = 3;
  ASSERT_TRUE(o.Validate(18, 16).ok());
  EXPECT_NE(o.Validate(17, 16).message().find("needs 18 token ids"), std::string::npos);
  EXPECT_NE(o.Validate(18, 12).message().find("too short"), std::string::npos);
  MqarBatches m(3, o);
  std::vector<int32_t> seq(17);
  m.Sequence(SampleKey{0, 0, 42}, 16, seq.data());
  std::map<int32_t, int32_t> kv;
  std::set<int32_t> keys;
  for (int i = 0; i < 4; ++i) {
    EXPECT_GE(seq[2 * i], 1);
    EXPECT_LE(seq[2 * i], 10);
    EXPECT_GE(seq[2 * i + 1], 11);
    EXPECT_LE(seq[2 * i + 1], 17);
    keys.insert(seq[2 * i]);
    kv[seq[2 * i]] = seq[2 * i + 1];
  }
  EXPECT_EQ(keys.size(), 4u);  // distinct keys
  for (int t : m.QueryPositions(16)) {
    ASSERT_TRUE(kv.count(seq[t])) << "query key " << seq[t] << " was not listed";
    EXPECT_EQ(seq[t + 1], kv[seq[t]]);
  }
  EXPECT_EQ(m.QueryPositions(16), (std::vector<int>{8, 10, 12}));
  for (int i = 14; i < 17; ++i) EXPECT_EQ(seq[i], 0);  // padding
}

}  // namespace
}  // namespace satdar::data
