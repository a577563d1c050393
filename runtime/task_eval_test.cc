// Task evaluation (runtime/task_eval.h) on a tiny f64 model with random weights: choice
// log-likelihoods against full forward passes, acc and acc_norm on items whose answer is known,
// cloze and recall against greedy generation, truncation, the bootstrap's standard error, the
// checks that name the item, and the built-in passage recall (runtime/passage_recall.h).
#include "runtime/task_eval.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/ops/gradcheck_testutil.h"
#include "core/testing/tmp_dir.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "runtime/decode_session.h"
#include "runtime/generate.h"
#include "runtime/passage_recall.h"

namespace satdar::runtime {
namespace {

using core::testing::RandomVector;

constexpr int kWindow = 32;

model::ModelConfig Config(const std::string& value_residual = "satformer") {
  auto c = model::ParseModelConfig(
      absl::StrCat(R"({"vocab_size": 64, "hidden_size": 16, "intermediate_size": 24,
          "num_hidden_layers": 3, "max_position_embeddings": )",
                   kWindow, R"(, "num_attention_heads": 2, "num_key_value_heads": 1,
          "value_residual": ")",
                   value_residual, "\"}"),
      "test");
  SATDAR_CHECK(c.ok()) << c.status();
  return *c;
}

// Initial weights moved off their init values, so that logits differ between tokens.
std::vector<double> Params(const model::ModelConfig& config) {
  core::ThreadPool pool(1);
  auto m = model::CreateModel<double>(config, &pool);
  SATDAR_CHECK(m.ok()) << m.status();
  std::vector<double> p((*m)->params().size());
  (*m)->params().Initialize(p.data(), 3);
  const std::vector<double> noise = RandomVector(p.size(), 99, 0.5);
  for (size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
  return p;
}

std::unique_ptr<DecodeSession> Session(const model::ModelConfig& config) {
  auto s = DecodeSession::FromParams(config, Params(config), 1);
  SATDAR_CHECK(s.ok()) << s.status();
  return *std::move(s);
}

Task MakeTask(const std::string& name, TaskKind kind) {
  Task t;
  t.name = name;
  t.kind = kind;
  return t;
}

std::vector<int32_t> Ids(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = 3 + static_cast<int32_t>(rng() % 61);
  return ids;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The summed negative log-likelihood of tokens[1:] given their prefixes, by a full forward pass.
double ForwardNll(const model::ModelConfig& config, const std::vector<int32_t>& tokens) {
  if (tokens.size() < 2) return 0;
  core::ThreadPool pool(1);
  auto m = model::CreateModel<double>(config, &pool);
  SATDAR_CHECK(m.ok());
  const std::vector<double> p = Params(config);
  const int t = static_cast<int>(tokens.size()) - 1;
  SATDAR_CHECK((*m)->Forward(p.data(), tokens.data(), 1, t).ok());
  return (*m)->last_cross_entropy() * t;
}

TEST(TaskEval, ChoiceLogLikelihoodEqualsFullForwardPasses) {
  const model::ModelConfig config = Config();
  auto session = Session(config);
  ChoiceItem item;
  item.context = Ids(6, 1);
  item.choices = {Ids(1, 2), Ids(3, 3), Ids(3, 4), Ids(5, 5)};
  item.choice_bytes = {1, 3, 3, 5};
  TaskEvalOptions o;
  auto ll = ChoiceLogLikelihoods(session.get(), item, o);
  ASSERT_TRUE(ll.ok()) << ll.status();
  for (size_t k = 0; k < item.choices.size(); ++k) {
    const double want = -(ForwardNll(config, Concat(item.context, item.choices[k])) -
                          ForwardNll(config, item.context));
    EXPECT_NEAR((*ll)[k], want, 1e-9 * std::abs(want)) << "choice " << k;
  }
  // An empty context is the EOS id alone.
  item.context.clear();
  auto eos = ChoiceLogLikelihoods(session.get(), item, o);
  ASSERT_TRUE(eos.ok()) << eos.status();
  for (size_t k = 0; k < item.choices.size(); ++k) {
    const double want = -ForwardNll(config, Concat({2}, item.choices[k]));
    EXPECT_NEAR((*eos)[k], want, 1e-9 * std::abs(want)) << "choice " << k;
  }
}

TEST(TaskEval, AccAndAccNormPickTheKnownAnswers) {
  auto session = Session(Config());
  TaskEvalOptions o;
  // Identical choices: the first wins ties.
  Task same = MakeTask("same", TaskKind::kChoice);
  ChoiceItem tie{Ids(5, 7), {Ids(2, 8), Ids(2, 8)}, {2, 2}, 0};
  same.choice = {tie, tie};
  same.choice[1].answer = 1;
  auto s = ScoreTask(session.get(), same, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->acc, (std::vector<double>{1, 0}));
  EXPECT_EQ(s->acc_norm, (std::vector<double>{1, 0}));
  // Two different choices: the better by total log-likelihood is the answer, but it is given
  // far fewer bytes, so that per byte the other wins.
  ChoiceItem item{Ids(5, 9), {Ids(2, 10), Ids(2, 11)}, {1, 1}, 0};
  auto ll = ChoiceLogLikelihoods(session.get(), item, o);
  ASSERT_TRUE(ll.ok());
  ASSERT_NE((*ll)[0], (*ll)[1]);
  const int better = (*ll)[0] > (*ll)[1] ? 0 : 1;
  item.answer = better;
  item.choice_bytes[better] = 1;
  item.choice_bytes[1 - better] = 1000000;
  Task t = MakeTask("t", TaskKind::kChoice);
  t.choice = {item};
  s = ScoreTask(session.get(), t, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->acc, (std::vector<double>{1}));
  EXPECT_EQ(s->acc_norm, (std::vector<double>{0}));
  EXPECT_EQ(s->truncated, 0);
}

// A cloze item is right exactly when greedy generation reproduces its target.
TEST(TaskEval, ClozeIsGreedyReproduction) {
  auto session = Session(Config());
  Task t = MakeTask("cloze", TaskKind::kCloze);
  SamplingOptions greedy;
  greedy.max_new_tokens = 4;
  greedy.eos_id = -1;  // never stops early
  for (int i = 0; i < 6; ++i) {
    const std::vector<int32_t> context = Ids(5 + i % 2, 20 + i);
    auto g = Generate(session.get(), {context}, greedy, nullptr);
    ASSERT_TRUE(g.ok()) << g.status();
    ClozeItem item{context, g->ids[0]};
    if (i % 3 == 2) item.target.back() = (item.target.back() + 1) % 64;  // one token off
    t.cloze.push_back(item);
  }
  auto s = ScoreTask(session.get(), t, TaskEvalOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->acc, (std::vector<double>{1, 1, 0, 1, 1, 0}));
  EXPECT_TRUE(s->acc_norm.empty());
}

TEST(TaskEval, RecallMatchesAnswersCaseInsensitively) {
  auto session = Session(Config());
  TaskEvalOptions o;
  o.max_new_tokens = 4;
  o.detokenize = [](const std::vector<int32_t>& ids) -> absl::StatusOr<std::string> {
    std::string s;
    for (int32_t id : ids) absl::StrAppend(&s, "tok", id, " ");
    return s;
  };
  const std::vector<int32_t> prompt = Ids(7, 30);
  SamplingOptions greedy;
  greedy.max_new_tokens = 4;
  auto g = Generate(session.get(), {prompt}, greedy, nullptr);
  ASSERT_TRUE(g.ok());
  ASSERT_FALSE(g->ids[0].empty());
  const std::string first = absl::StrCat("TOK", g->ids[0][0], " ");
  Task t = MakeTask("recall", TaskKind::kRecall);
  t.recall = {{prompt, {"nowhere", first}}, {prompt, {"nowhere"}}, {{}, {"tok"}}};
  auto s = ScoreTask(session.get(), t, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->acc[0], 1);
  EXPECT_EQ(s->acc[1], 0);
  // An empty prompt is EOS; anything generated that is not EOS reads "tok".
  EXPECT_EQ(AsciiLower("AbC\xC3\x89z"), "abc\xC3\x89z");
  o.detokenize = nullptr;
  EXPECT_NE(ScoreTask(session.get(), t, o).status().message().find("needs a tokenizer"),
            std::string::npos);
}

TEST(TaskEval, LongContextsAreTruncatedFromTheLeft) {
  const model::ModelConfig config = Config();
  auto session = Session(config);
  ChoiceItem item{Ids(40, 40), {Ids(3, 41), Ids(1, 42)}, {3, 1}, 0};
  std::vector<std::string> logged;
  TaskEvalOptions o;
  o.log = [&logged](const std::string& line) { logged.push_back(line); };
  auto ll = ChoiceLogLikelihoods(session.get(), item, o);
  ASSERT_TRUE(ll.ok()) << ll.status();
  // context + choice minus its last token fill the window exactly.
  const std::vector<int32_t> kept3(item.context.end() - (kWindow - 3 + 1), item.context.end());
  const std::vector<int32_t> kept1(item.context.end() - kWindow, item.context.end());
  EXPECT_NEAR((*ll)[0],
              -(ForwardNll(config, Concat(kept3, item.choices[0])) - ForwardNll(config, kept3)),
              1e-9);
  EXPECT_NEAR((*ll)[1],
              -(ForwardNll(config, Concat(kept1, item.choices[1])) - ForwardNll(config, kept1)),
              1e-9);
  Task t = MakeTask("long", TaskKind::kChoice);
  t.choice = {item, ChoiceItem{Ids(4, 43), {Ids(2, 44)}, {2}, 0}};
  auto s = ScoreTask(session.get(), t, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->truncated, 1);
  EXPECT_EQ(logged,
            (std::vector<std::string>{
                "task long: 1 items truncated from the left to the window of 32 tokens"}));
  // A choice longer than the window alone is refused, naming the item and field.
  t.choice[1].choices[0] = Ids(kWindow + 1, 45);
  t.where = {"long.jsonl:1", "long.jsonl:2"};
  absl::Status bad = ScoreTask(session.get(), t, o).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("long.jsonl:2: field \"choices[0]\": has 33 tokens, more than the "
                               "model's window of 32"),
            std::string::npos)
      << bad;
}

TEST(TaskEval, BadItemsAreNamed) {
  auto session = Session(Config());
  TaskEvalOptions o;
  auto message = [&](const Task& t) {
    absl::Status s = EvaluateTasks(session.get(), {t}, o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  Task t = MakeTask("t", TaskKind::kChoice);
  EXPECT_NE(message(t).find("task t has no items"), std::string::npos);
  t.choice = {ChoiceItem{Ids(3, 1), {Ids(1, 2)}, {1}, 1}};
  EXPECT_NE(message(t).find("task t item 0: field \"answer\": 1 is not a choice"),
            std::string::npos);
  t.choice[0].answer = 0;
  t.choice[0].choices[0] = {};
  EXPECT_NE(message(t).find("field \"choices[0]\": has no tokens"), std::string::npos);
  t.choice[0].choices[0] = {64};
  EXPECT_NE(message(t).find("token id 64 is outside"), std::string::npos);
  Task c = MakeTask("c", TaskKind::kCloze);
  c.cloze = {ClozeItem{Ids(3, 1), {}}};
  EXPECT_NE(message(c).find("field \"target\": has no tokens"), std::string::npos);
  Task r = MakeTask("r", TaskKind::kRecall);
  r.recall = {RecallItem{Ids(3, 1), {""}}};
  o.detokenize = [](const std::vector<int32_t>&) -> absl::StatusOr<std::string> { return ""; };
  EXPECT_NE(message(r).find("field \"answers[0]\": is empty"), std::string::npos);
  Task ok = MakeTask("ok", TaskKind::kCloze);
  ok.cloze = {ClozeItem{Ids(3, 1), Ids(1, 2)}};
  absl::Status twice = EvaluateTasks(session.get(), {ok, ok}, o).status();
  EXPECT_NE(twice.message().find("two tasks are named ok"), std::string::npos) << twice;
  // --gate-ablation needs SATFormer's gates.
  auto plain = Session(Config("none"));
  o.gate_ablation = model::GateAblation::kZero;
  absl::Status gates = EvaluateTasks(plain.get(), {ok}, o).status();
  EXPECT_NE(gates.message().find("no SATFormer gates"), std::string::npos) << gates;
}

TEST(TaskEval, ResultJsonAndGateAblation) {
  auto session = Session(Config());
  Task choice = MakeTask("choice", TaskKind::kChoice);
  Task cloze = MakeTask("cloze", TaskKind::kCloze);
  for (int i = 0; i < 5; ++i) {
    choice.choice.push_back(ChoiceItem{Ids(6, 50 + i), {Ids(2, 60 + i), Ids(3, 70 + i)}, {2, 3}, i % 2});
    cloze.cloze.push_back(ClozeItem{Ids(6, 80 + i), Ids(1, 90 + i)});
  }
  TaskEvalOptions o;
  auto plain = EvaluateTasks(session.get(), {choice, cloze}, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const nlohmann::json& c = (*plain)["tasks"]["choice"];
  EXPECT_EQ(c["n"], 5);
  for (const char* key : {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "truncated"}) {
    EXPECT_TRUE(c.contains(key)) << key;
  }
  EXPECT_FALSE((*plain)["tasks"]["cloze"].contains("acc_norm"));
  EXPECT_FALSE(c.contains("ablated"));
  for (auto mode : {model::GateAblation::kZero, model::GateAblation::kMean}) {
    o.gate_ablation = mode;
    auto ablated = EvaluateTasks(session.get(), {choice, cloze}, o);
    ASSERT_TRUE(ablated.ok()) << ablated.status();
    // The un-ablated numbers are unchanged, and the ablated ones are there.
    EXPECT_EQ((*ablated)["tasks"]["choice"]["acc"], c["acc"]);
    EXPECT_EQ((*ablated)["tasks"]["cloze"]["acc"], (*plain)["tasks"]["cloze"]["acc"]);
    const nlohmann::json& a = (*ablated)["tasks"]["choice"]["ablated"];
    EXPECT_TRUE(a.contains("acc") && a.contains("acc_norm_stderr")) << a;
  }
}

TEST(TaskEval, BootstrapStderrMatchesTheBinomialFormula) {
  std::vector<double> scores(400, 0.0);
  for (int i = 0; i < 120; ++i) scores[i * 3] = 1;  // p = 0.3
  const double want = std::sqrt(0.3 * 0.7 / 400);
  const double got = BootstrapStderr(scores, 1000, 5);
  EXPECT_NEAR(got, want, 0.1 * want);
  EXPECT_EQ(BootstrapStderr(scores, 1000, 5), got);  // deterministic from the seed
  EXPECT_NE(BootstrapStderr(scores, 1000, 6), got);
  EXPECT_EQ(BootstrapStderr({1.0}, 1000, 5), 0);
  EXPECT_EQ(BootstrapStderr(std::vector<double>(50, 1.0), 1000, 5), 0);
}

// A prepared dataset whose validation split holds documents of the given lengths (EOS 2
// included), random ids in [3, 64) otherwise.
std::string WriteDataset(const std::string& name, const std::vector<int>& docs) {
  const std::string dir = core::testing::TestTmpDir(name);
  std::mt19937 gen(3);
  std::vector<uint32_t> val;
  std::vector<uint64_t> starts;
  for (int len : docs) {
    starts.push_back(val.size());
    for (int i = 0; i + 1 < len; ++i) val.push_back(3 + gen() % 61);
    val.push_back(2);
  }
  std::vector<uint32_t> train(100, 5);
  train.back() = 2;
  SATDAR_CHECK(data::WriteShard(dir + "/train_00000.bin", train, {0}, 2, 64).ok());
  SATDAR_CHECK(data::WriteShard(dir + "/val_00000.bin", val, starts, 2, 64).ok());
  SATDAR_CHECK(core::WriteFileAtomically(dir + "/tokenizer.model", "not read").ok());
  const nlohmann::json manifest = {
      {"version", 1}, {"tokenizer", "tokenizer.model"}, {"vocab_size", 64}, {"token_bytes", 2},
      {"eos_id", 2},
      {"shards",
       {{{"file", "train_00000.bin"}, {"split", "train"}, {"tokens", 100}, {"documents", 1}},
        {{"file", "val_00000.bin"}, {"split", "val"}, {"tokens", val.size()},
         {"documents", docs.size()}}}}};
  SATDAR_CHECK(core::WriteFileAtomically(dir + "/manifest.json", manifest.dump()).ok());
  return dir;
}

TEST(PassageRecall, ItemsAreCopiesFromTheirPassageAndRepeatFromTheSeed) {
  auto ds = data::Dataset::Open(WriteDataset("passage_recall", {10, 80, 30, 200}), 64);
  ASSERT_TRUE(ds.ok()) << ds.status();
  PassageRecallOptions o;
  o.items = 20;
  o.seed = 4;
  // Window 32: span 8, target 2, passage 24 (documents of at least 16 tokens).
  auto task = MakePassageRecall(**ds, o, kWindow);
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->name, "passage_recall");
  EXPECT_EQ(task->kind, TaskKind::kCloze);
  ASSERT_EQ(task->cloze.size(), 20u);
  for (const ClozeItem& item : task->cloze) {
    ASSERT_EQ(item.target.size(), 2u);
    ASSERT_EQ(item.context.size(), 24u + 6u);
    // The span's first 6 tokens and the target are a stretch of the passage.
    const std::vector<int32_t> passage(item.context.begin(), item.context.begin() + 24);
    const std::vector<int32_t> span =
        Concat(std::vector<int32_t>(item.context.begin() + 24, item.context.end()), item.target);
    EXPECT_NE(std::search(passage.begin(), passage.end(), span.begin(), span.end()),
              passage.end());
    for (int32_t id : item.context) EXPECT_NE(id, 2);  // within one document
  }
  auto again = MakePassageRecall(**ds, o, kWindow);
  ASSERT_TRUE(again.ok());
  o.seed = 5;
  auto other = MakePassageRecall(**ds, o, kWindow);
  ASSERT_TRUE(other.ok());
  bool same = true, differs = false;
  for (size_t i = 0; i < 20; ++i) {
    same = same && again->cloze[i].context == task->cloze[i].context &&
           again->cloze[i].target == task->cloze[i].target;
    differs = differs || other->cloze[i].context != task->cloze[i].context;
  }
  EXPECT_TRUE(same);
  EXPECT_TRUE(differs);
  // It scores as a cloze task on the window it was made for.
  auto session = Session(Config());
  auto s = ScoreTask(session.get(), *task, TaskEvalOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->truncated, 0);
  // Sizes that cannot fit, and a split without a long enough document.
  o.passage_tokens = 30;
  EXPECT_NE(MakePassageRecall(**ds, o, kWindow).status().message().find("exceed the model's window"),
            std::string::npos);
  o.passage_tokens = 0;
  o.target_tokens = 8;
  EXPECT_NE(MakePassageRecall(**ds, o, kWindow).status().message().find("--recall-target-tokens"),
            std::string::npos);
  auto short_docs = data::Dataset::Open(WriteDataset("passage_recall_short", {10, 12}), 64);
  ASSERT_TRUE(short_docs.ok()) << short_docs.status();
  EXPECT_NE(MakePassageRecall(**short_docs, PassageRecallOptions(), kWindow)
                .status()
                .message()
                .find("has no document of at least 16 tokens"),
            std::string::npos);
}

}  // namespace
}  // namespace satdar::runtime
