// BuildParamTable (model.h) against tables recorded from the models themselves.
//
// model/testdata/param_tables.txt holds one line per (design, layout, rank): a digest of every
// spec's name, shape, init rule, offset and sharding flags, recorded on 2026-12-02 from
// CreateModel<float>(...)->params() before the table moved out of the model. Checkpoints are
// read by these names and offsets, so any change to a line is a change to the checkpoint
// format. To print the current lines: SATDAR_PRINT_PARAM_TABLES=1 bazel test
// //model:param_layout_test --test_output=all.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/model.h"

namespace satdar::model {
namespace {

struct Design {
  std::string name;
  std::string json;  // fields added to the base config
};

const std::vector<Design>& Designs() {
  static const std::vector<Design> designs = {
      {"baseline", ""},
      {"untied", R"("tie_word_embeddings": false)"},
      {"noqknorm", R"("qk_norm": false)"},
      {"satformer", R"("value_residual": "satformer")"},
      {"resformer_fixed", R"("value_residual": "resformer")"},
      {"resformer_learnable_plus",
       R"("value_residual": "resformer", "resformer_mode": "learnable_plus")"},
      {"attnres_full", R"("residual": "attnres")"},
      {"attnres_block4", R"("residual": "attnres", "block_size": 4)"},
      {"transparent_full", R"("residual": "transparent")"},
      {"transparent_block4", R"("residual": "transparent", "block_size": 4)"},
      {"dar_full", R"("residual": "dar")"},
      {"dar_block4_satformer",
       R"("residual": "dar", "block_size": 4, "value_residual": "satformer")"},
      {"dar_moe", R"("residual": "dar", "block_size": 4,
                     "moe": {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 6,
                             "num_shared_experts": 1})"},
      {"hc4", R"("residual": "hc")"},
      {"hc2_satformer", R"("residual": "hc", "hc_streams": 2, "value_residual": "satformer")"},
      {"mhc4", R"("residual": "mhc")"},
      {"denseformer", R"("residual": "denseformer")"},
      {"denseformer_resformer", R"("residual": "denseformer", "value_residual": "resformer",
                                   "resformer_mode": "learnable_plus")"},
      {"muddformer", R"("residual": "muddformer")"},
      {"muddformer_satformer", R"("residual": "muddformer", "value_residual": "satformer")"},
  };
  return designs;
}

// vocab 13: no TP size divides it (the embedding and head are padded).
ModelConfig Config(const Design& d) {
  const std::string json =
      R"({"vocab_size": 13, "hidden_size": 16, "intermediate_size": 12,
          "num_hidden_layers": 4, "max_position_embeddings": 64, "num_attention_heads": 4,
          "num_key_value_heads": 2)" +
      (d.json.empty() ? std::string() : ", " + d.json) + "}";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(json, d.name);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

struct Layout {
  std::string name;
  int tp = 1, pp = 1, ep = 1, vocab_multiple = 1;
  bool sequence_parallel = false;
};

std::vector<Layout> Layouts(const ModelConfig& c) {
  std::vector<Layout> out = {{"single"},
                             {"tp2", 2},
                             {"pp2", 1, 2},
                             {"pp4", 1, 4},
                             {"tp2_pp2", 2, 2},
                             {"tp2_sp", 2, 1, 1, 1, true},
                             {"tp2_vocab8", 2, 1, 1, 8}};
  if (c.moe) {
    out.push_back({"ep2", 1, 1, 2});
    out.push_back({"ep2_pp2", 1, 2, 2});
  }
  return out;
}

// Every field of every spec, in order, as one 64-bit digest.
std::string Digest(const ParamTable& table) {
  std::ostringstream s;
  for (const ParamSpec& p : table.specs()) {
    s << p.name << '|' << static_cast<int>(p.init.kind) << ',' << p.init.value;
    for (double v : p.init.values) s << ',' << v;
    s << '|';
    for (int64_t x : p.shape) s << x << ',';
    s << '|' << p.offset << ',' << p.numel << ',' << p.unused << ',' << p.shard_dim << ','
      << p.shard_index << ',' << p.shard_count << '|';
    for (int64_t x : p.global_shape) s << x << ',';
    s << '|' << p.tp_partial_grad << p.pp_partial_grad << p.expert << '\n';
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(core::HashString(s.str())));
  return absl::StrCat(table.specs().size(), " specs ", table.size(), " elements ", hex);
}

// Calls fn("design layout tp_rank/pp_rank/ep_rank", config, table, sharding) for every rank of
// every layout of every design.
template <typename Fn>
void ForEachRankTable(Fn fn) {
  for (const Design& d : Designs()) {
    const ModelConfig c = Config(d);
    for (const Layout& l : Layouts(c)) {
      for (int tr = 0; tr < l.tp; ++tr) {
        for (int pr = 0; pr < l.pp; ++pr) {
          for (int er = 0; er < l.ep; ++er) {
            Sharding shard;
            shard.tp_size = l.tp;
            shard.tp_rank = tr;
            shard.pp_size = l.pp;
            shard.pp_rank = pr;
            shard.ep_size = l.ep;
            shard.ep_rank = er;
            shard.vocab_multiple = l.vocab_multiple;
            shard.sequence_parallel = l.sequence_parallel;
            const std::string key = absl::StrCat(d.name, " ", l.name, " ", tr, "/", pr, "/", er);
            absl::StatusOr<ParamTable> table = BuildParamTable(c, shard);
            EXPECT_TRUE(table.ok()) << key << ": " << table.status();
            if (table.ok()) fn(key, c, *table, shard);
          }
        }
      }
    }
  }
}

std::map<std::string, std::string> Actual() {
  std::map<std::string, std::string> out;
  ForEachRankTable([&](const std::string& key, const ModelConfig&, const ParamTable& table,
                       const Sharding&) {
    out[key] = Digest(table);
  });
  return out;
}

std::map<std::string, std::string> Golden() {
  std::map<std::string, std::string> out;
  std::ifstream in("model/testdata/param_tables.txt");
  EXPECT_TRUE(in.good()) << "model/testdata/param_tables.txt is missing";
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(": ");
    EXPECT_NE(colon, std::string::npos) << line;
    if (colon != std::string::npos) out[line.substr(0, colon)] = line.substr(colon + 2);
  }
  return out;
}

TEST(BuildParamTable, EqualsTheRecordedTablesOfEveryDesignAndLayout) {
  const std::map<std::string, std::string> actual = Actual();
  if (std::getenv("SATDAR_PRINT_PARAM_TABLES") != nullptr) {
    for (const auto& [key, digest] : actual) std::printf("%s: %s\n", key.c_str(), digest.c_str());
  }
  const std::map<std::string, std::string> golden = Golden();
  EXPECT_EQ(actual.size(), golden.size());
  for (const auto& [key, digest] : golden) {
    auto it = actual.find(key);
    ASSERT_NE(it, actual.end()) << key;
    EXPECT_EQ(it->second, digest) << key;
  }
}

// Every design's classes find their parameters in the table they are given (a missing name
// aborts in Bind), for a sharded rank with the final stage.
TEST(BuildParamTable, EveryDesignBindsTheTableItIsGiven) {
  for (const Design& d : Designs()) {
    const ModelConfig c = Config(d);
    Sharding shard;
    shard.tp_size = 2;
    shard.tp_rank = 1;
    shard.pp_size = 2;
    shard.pp_rank = 1;
    core::ThreadPool pool(1);
    absl::StatusOr<std::unique_ptr<Model<float>>> model = CreateModel<float>(c, shard, &pool);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<ParamTable> table = BuildParamTable(c, shard);
    ASSERT_TRUE(table.ok()) << table.status();
    EXPECT_EQ(Digest(*table), Digest((*model)->params())) << d.name;
  }
}

// The roles agree with the names (MODELS.md section 5): block i's parameters are
// "model.layers.<i>.*", the final norm opens the kFinal run, and BlockStarts finds each block's
// first parameter and the final norm.
TEST(BuildParamTable, RolesAndBlocksAgreeWithTheNames) {
  int tables = 0;
  ForEachRankTable([&](const std::string& key, const ModelConfig& c, const ParamTable& table,
                       const Sharding&) {
    ++tables;
    const std::vector<ParamSpec>& specs = table.specs();
    std::vector<size_t> expected;
    for (size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& s = specs[i];
      const std::string where = absl::StrCat(key, " ", s.name);
      int layer = -1;
      if (std::sscanf(s.name.c_str(), "model.layers.%d.", &layer) == 1) {
        EXPECT_EQ(s.role, ParamRole::kLayer) << where;
        EXPECT_EQ(s.layer, layer) << where;
        EXPECT_LT(layer, c.num_hidden_layers) << where;
        if (s.name == absl::StrCat("model.layers.", layer, ".input_layernorm.weight")) {
          expected.push_back(i);
        }
        continue;
      }
      EXPECT_EQ(s.layer, -1) << where;
      if (s.name == "model.embed_tokens.weight") {
        EXPECT_EQ(s.role, ParamRole::kEmbedding) << where;
      } else if (s.name == "lm_head.weight") {
        EXPECT_EQ(s.role, ParamRole::kHead) << where;
      } else if (s.name == "model.norm.weight") {
        EXPECT_EQ(s.role, ParamRole::kFinal) << where;
        expected.push_back(i);
      } else {
        // Past the final norm: the topology's final readout; before the blocks: global.
        const ParamSpec* norm = table.Find("model.norm.weight");
        const bool after = norm != nullptr && s.offset > norm->offset;
        EXPECT_EQ(s.role, after ? ParamRole::kFinal : ParamRole::kGlobal) << where;
      }
    }
    if (table.Find("model.norm.weight") == nullptr) expected.push_back(specs.size());
    EXPECT_EQ(table.BlockStarts(), expected) << key;
  });
  EXPECT_EQ(tables, 346);  // every (design, layout, rank) of the golden file
}

// A pipeline rank with virtual stages holds its chunks' tables appended (ParamTable::Append):
// the roles travel with the specs, and the blocks are still found in table order.
TEST(BuildParamTable, BlockStartsOfAppendedChunks) {
  ModelConfig c = Config(Designs()[0]);  // tied embeddings: the last stage holds a copy
  c.num_hidden_layers = 4;
  ParamTable rank;
  std::vector<int64_t> expected;
  for (int stage : {1, 3}) {  // pipeline rank 1 of 2 with 2 virtual stages: stages 1 and 3 of 4
    Sharding shard;
    shard.pp_size = 4;
    shard.pp_rank = stage;
    absl::StatusOr<ParamTable> chunk = BuildParamTable(c, shard);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    const int64_t base = rank.Append(*chunk);
    for (size_t i : chunk->BlockStarts()) {
      if (i < chunk->specs().size()) expected.push_back(base + chunk->specs()[i].offset);
    }
  }
  std::vector<int64_t> actual;
  for (size_t i : rank.BlockStarts()) actual.push_back(rank.specs()[i].offset);
  // Layer 1, layer 3, then the final norm (the last chunk's).
  ASSERT_EQ(actual.size(), 3u);
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(rank.specs()[rank.BlockStarts()[0]].name, "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(rank.specs()[rank.BlockStarts()[1]].name, "model.layers.3.input_layernorm.weight");
  EXPECT_EQ(rank.specs()[rank.BlockStarts()[2]].name, "model.norm.weight");
  EXPECT_EQ(rank.Find("model.embed_tokens.weight")->role, ParamRole::kEmbedding);
}

// The GPU's tables (align 32) hold the same tensors as the packed ones, each at a multiple of
// 32 elements, with zero padding that CopyTensors leaves alone both ways.
TEST(BuildParamTable, AlignedTablesHoldTheSameTensors) {
  constexpr int64_t kAlign = 32;
  int ranks = 0;
  ForEachRankTable([&](const std::string& key, const ModelConfig& c, const ParamTable& packed,
                       const Sharding& shard) {
    absl::StatusOr<ParamTable> aligned = BuildParamTable(c, shard, kAlign);
    ASSERT_TRUE(aligned.ok()) << key << ": " << aligned.status();
    ++ranks;
    EXPECT_EQ(packed.align(), 1) << key;
    EXPECT_EQ(packed.packed_size(), packed.size()) << key;
    EXPECT_EQ(aligned->align(), kAlign) << key;
    EXPECT_EQ(aligned->packed_size(), packed.size()) << key;
    EXPECT_EQ(aligned->size() % kAlign, 0) << key;
    EXPECT_EQ(aligned->BlockStarts(), packed.BlockStarts()) << key;
    ASSERT_EQ(aligned->specs().size(), packed.specs().size()) << key;
    int64_t next = 0;
    for (size_t i = 0; i < packed.specs().size(); ++i) {
      const ParamSpec &a = aligned->specs()[i], &p = packed.specs()[i];
      EXPECT_EQ(a.name, p.name) << key;
      EXPECT_EQ(a.shape, p.shape) << key << " " << a.name;
      EXPECT_EQ(a.role, p.role) << key << " " << a.name;
      EXPECT_EQ(a.layer, p.layer) << key << " " << a.name;
      EXPECT_EQ(a.expert, p.expert) << key << " " << a.name;
      EXPECT_EQ(a.shard_index, p.shard_index) << key << " " << a.name;
      EXPECT_EQ(p.stride, p.numel) << key << " " << p.name;
      EXPECT_EQ(a.offset, next) << key << " " << a.name;
      EXPECT_EQ(a.offset % kAlign, 0) << key << " " << a.name;
      EXPECT_GE(a.stride, a.numel) << key << " " << a.name;
      EXPECT_LT(a.stride - a.numel, kAlign) << key << " " << a.name;
      next = a.offset + a.stride;
    }
    EXPECT_EQ(next, aligned->size()) << key;
    std::vector<float> p(packed.size()), device(aligned->size(), 0.0f), back(packed.size(), 0.0f);
    packed.Initialize(p.data(), 5);
    CopyTensors(packed, p.data(), *aligned, device.data());
    CopyTensors(*aligned, device.data(), packed, back.data());
    EXPECT_EQ(back, p) << key;
    double padding = 0;
    for (const ParamSpec& a : aligned->specs()) {
      for (int64_t e = a.offset + a.numel; e < a.offset + a.stride; ++e) padding += std::abs(device[e]);
    }
    EXPECT_EQ(padding, 0.0) << key;
  });
  EXPECT_EQ(ranks, 346);
  absl::StatusOr<ParamTable> bad = BuildParamTable(Config(Designs()[0]), Sharding{}, 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "parameter alignment 0 is not positive");
}

// Appending keeps the chunks' relative offsets only at one alignment: aligned chunks append to
// an aligned table, each tensor still at a multiple of the alignment.
TEST(BuildParamTable, AlignedChunksAppendToAnAlignedTable) {
  const ModelConfig c = Config(Designs()[0]);
  ParamTable rank(32);
  for (int stage : {1, 3}) {  // pipeline rank 1 of 2 with 2 virtual stages
    Sharding shard;
    shard.pp_size = 4;
    shard.pp_rank = stage;
    absl::StatusOr<ParamTable> chunk = BuildParamTable(c, shard, 32);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    const int64_t base = rank.Append(*chunk);
    EXPECT_EQ(base % 32, 0);
    for (size_t i = 0; i < chunk->specs().size(); ++i) {
      EXPECT_EQ(rank.Find(chunk->specs()[i].name)->offset, base + chunk->specs()[i].offset);
    }
  }
  for (const ParamSpec& spec : rank.specs()) EXPECT_EQ(spec.offset % 32, 0) << spec.name;
  EXPECT_DEATH(rank.Append(ParamTable()), "appending a table of align 1 to one of align 32");
}

TEST(BuildParamTable, RefusesALayoutTheConfigCannotSplit) {
  ModelConfig c = Config(Designs()[0]);
  Sharding shard;
  shard.tp_size = 3;  // 4 heads
  absl::StatusOr<ParamTable> table = BuildParamTable(c, shard);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  shard.tp_size = 1;
  shard.pp_size = 3;  // 4 layers
  table = BuildParamTable(c, shard);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace satdar::model
