#include "runtime/task_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "runtime/generate.h"

namespace satdar::runtime {

namespace {

// Rows decoded together: cloze items of one shape, recall prompts handed to Generate at once.
constexpr int kClozeBatch = 16;
constexpr int kRecallBatch = 32;

std::string Where(const Task& task, size_t i) {
  return i < task.where.size() ? task.where[i] : absl::StrCat("task ", task.name, " item ", i);
}

absl::Status Bad(const Task& task, size_t i, const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat(Where(task, i), ": field \"", field, "\": ", why));
}

absl::Status CheckIds(const Task& task, size_t i, const std::string& field,
                      const std::vector<int32_t>& ids, int vocab) {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      return Bad(task, i, field,
                 absl::StrCat("token id ", id, " is outside the model's vocabulary [0, ", vocab,
                              ")"));
    }
  }
  return absl::OkStatus();
}

// A continuation (choice or target) of n tokens fits when it has at most `window` tokens: with
// one context token, its input (context + continuation minus its last token) is n positions.
absl::Status CheckContinuation(const Task& task, size_t i, const std::string& field,
                               const std::vector<int32_t>& ids, int window, int vocab) {
  if (ids.empty()) return Bad(task, i, field, "has no tokens");
  if (static_cast<int64_t>(ids.size()) > window) {
    return Bad(task, i, field,
               absl::StrCat("has ", ids.size(), " tokens, more than the model's window of ",
                            window, " (max_position_embeddings)"));
  }
  return CheckIds(task, i, field, ids, vocab);
}

absl::Status CheckTask(const Task& task, int window, int vocab, const TaskEvalOptions& o) {
  const size_t n = task.kind == TaskKind::kChoice  ? task.choice.size()
                   : task.kind == TaskKind::kCloze ? task.cloze.size()
                                                   : task.recall.size();
  if (n == 0) return absl::InvalidArgumentError(absl::StrCat("task ", task.name, " has no items"));
  if (o.eos_id < 0 || o.eos_id >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("the EOS id ", o.eos_id, " is outside the model's vocabulary of ", vocab));
  }
  for (size_t i = 0; i < n; ++i) {
    if (task.kind == TaskKind::kChoice) {
      const ChoiceItem& item = task.choice[i];
      SATDAR_RETURN_IF_ERROR(CheckIds(task, i, "context", item.context, vocab));
      if (item.choices.empty()) return Bad(task, i, "choices", "is empty");
      if (item.choice_bytes.size() != item.choices.size()) {
        return Bad(task, i, "choices",
                   absl::StrCat(item.choices.size(), " choices but ", item.choice_bytes.size(),
                                " byte lengths"));
      }
      for (size_t k = 0; k < item.choices.size(); ++k) {
        SATDAR_RETURN_IF_ERROR(CheckContinuation(task, i, absl::StrCat("choices[", k, "]"),
                                                 item.choices[k], window, vocab));
        if (item.choice_bytes[k] <= 0) {
          return Bad(task, i, absl::StrCat("choices[", k, "]"), "has no bytes");
        }
      }
      if (item.answer < 0 || item.answer >= static_cast<int>(item.choices.size())) {
        return Bad(task, i, "answer",
                   absl::StrCat(item.answer, " is not a choice (0 to ", item.choices.size() - 1,
                                ")"));
      }
    } else if (task.kind == TaskKind::kCloze) {
      const ClozeItem& item = task.cloze[i];
      SATDAR_RETURN_IF_ERROR(CheckIds(task, i, "context", item.context, vocab));
      SATDAR_RETURN_IF_ERROR(CheckContinuation(task, i, "target", item.target, window, vocab));
    } else {
      const RecallItem& item = task.recall[i];
      SATDAR_RETURN_IF_ERROR(CheckIds(task, i, "prompt", item.prompt, vocab));
      if (item.answers.empty()) return Bad(task, i, "answers", "is empty");
      for (size_t k = 0; k < item.answers.size(); ++k) {
        if (item.answers[k].empty()) {
          return Bad(task, i, absl::StrCat("answers[", k, "]"), "is empty");
        }
      }
    }
  }
  if (task.kind == TaskKind::kRecall) {
    if (o.max_new_tokens < 1 || o.max_new_tokens >= window) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task ", task.name, ": --max-new-tokens ", o.max_new_tokens,
          " must be at least 1 and leave room for a prompt in the model's window of ", window));
    }
    if (!o.detokenize) {
      return absl::InvalidArgumentError(
          absl::StrCat("task ", task.name, ": recall needs a tokenizer to read its answers"));
    }
  }
  return absl::OkStatus();
}

// The context (EOS when empty) without the tokens beyond `keep` on the left.
std::vector<int32_t> Truncated(const std::vector<int32_t>& context, int64_t keep, int eos_id,
                               bool* truncated) {
  if (context.empty()) return {eos_id};
  if (static_cast<int64_t>(context.size()) <= keep) return context;
  *truncated = true;
  return std::vector<int32_t>(context.end() - keep, context.end());
}

// Teacher-forced logits of B rows sharing the shape (n context tokens, L continuation tokens):
// the context's first n - 1 tokens are a prefill whose logits are not kept, then the
// continuation's inputs (the context's last token and the continuation's first L - 1) return
// every row: *logits = (B, L, vocab), row j predicting continuation token j.
absl::Status ContinuationLogits(DecodeSession* session,
                                const std::vector<const std::vector<int32_t>*>& contexts,
                                const std::vector<const std::vector<int32_t>*>& continuations,
                                std::vector<double>* logits) {
  const int b = static_cast<int>(contexts.size());
  const int n = static_cast<int>(contexts[0]->size());
  const int len = static_cast<int>(continuations[0]->size());
  SATDAR_RETURN_IF_ERROR(session->Begin(b, n - 1 + len));
  std::vector<int32_t> tokens;
  if (n > 1) {
    tokens.reserve(static_cast<size_t>(b) * (n - 1));
    for (const auto* c : contexts) tokens.insert(tokens.end(), c->begin(), c->end() - 1);
    SATDAR_RETURN_IF_ERROR(session->Step(tokens.data(), b, n - 1, /*all_rows=*/false, logits));
  }
  tokens.clear();
  for (int r = 0; r < b; ++r) {
    tokens.push_back(contexts[r]->back());
    tokens.insert(tokens.end(), continuations[r]->begin(), continuations[r]->end() - 1);
  }
  SATDAR_RETURN_IF_ERROR(session->Step(tokens.data(), b, len, /*all_rows=*/true, logits));
  const size_t vocab = static_cast<size_t>(session->config().vocab_size);
  if (logits->size() != static_cast<size_t>(b) * len * vocab) {
    return absl::InternalError(absl::StrCat("decode step returned ", logits->size(),
                                            " logits, expected ", b, " x ", len, " x ", vocab));
  }
  return absl::OkStatus();
}

double LogSoftmaxAt(const double* row, int vocab, int id) {
  double max = row[0];
  for (int v = 1; v < vocab; ++v) max = std::max(max, row[v]);
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
  return row[id] - (max + std::log(sum));
}

// The lowest id among the largest logits (runtime::Generate's greedy rule).
int32_t Argmax(const double* row, int vocab) {
  int32_t best = 0;
  for (int v = 1; v < vocab; ++v) {
    if (row[v] > row[best]) best = v;
  }
  return best;
}

// The index of the largest value, the first on ties.
int FirstArgmax(const std::vector<double>& values) {
  int best = 0;
  for (int k = 1; k < static_cast<int>(values.size()); ++k) {
    if (values[k] > values[best]) best = k;
  }
  return best;
}

absl::StatusOr<std::vector<double>> ChoiceLogLikelihoodsImpl(DecodeSession* session,
                                                             const ChoiceItem& item,
                                                             const TaskEvalOptions& o,
                                                             bool* truncated) {
  const int window = session->window();
  const int vocab = session->config().vocab_size;
  std::vector<double> ll(item.choices.size(), 0.0);
  // Choices of one length decode as one batch (no padding: every row is exactly what the
  // choice alone would be); each length gets the context that fits beside it.
  std::map<size_t, std::vector<int>> by_length;
  for (int k = 0; k < static_cast<int>(item.choices.size()); ++k) {
    by_length[item.choices[k].size()].push_back(k);
  }
  std::vector<double> logits;
  for (const auto& [len, ks] : by_length) {
    const std::vector<int32_t> context =
        Truncated(item.context, static_cast<int64_t>(window) - static_cast<int64_t>(len) + 1,
                  o.eos_id, truncated);
    std::vector<const std::vector<int32_t>*> contexts(ks.size(), &context), continuations;
    for (int k : ks) continuations.push_back(&item.choices[k]);
    SATDAR_RETURN_IF_ERROR(ContinuationLogits(session, contexts, continuations, &logits));
    for (size_t r = 0; r < ks.size(); ++r) {
      const std::vector<int32_t>& choice = item.choices[ks[r]];
      double sum = 0;
      for (size_t j = 0; j < len; ++j) {
        sum += LogSoftmaxAt(logits.data() + (r * len + j) * vocab, vocab, choice[j]);
      }
      ll[ks[r]] = sum;
    }
  }
  return ll;
}

absl::Status ScoreChoice(DecodeSession* session, const Task& task, const TaskEvalOptions& o,
                         TaskScores* scores) {
  for (const ChoiceItem& item : task.choice) {
    bool truncated = false;
    SATDAR_ASSIGN_OR_RETURN(std::vector<double> ll,
                            ChoiceLogLikelihoodsImpl(session, item, o, &truncated));
    std::vector<double> norm(ll.size());
    for (size_t k = 0; k < ll.size(); ++k) norm[k] = ll[k] / static_cast<double>(item.choice_bytes[k]);
    scores->acc.push_back(FirstArgmax(ll) == item.answer ? 1.0 : 0.0);
    scores->acc_norm.push_back(FirstArgmax(norm) == item.answer ? 1.0 : 0.0);
    scores->truncated += truncated;
  }
  return absl::OkStatus();
}

absl::Status ScoreCloze(DecodeSession* session, const Task& task, const TaskEvalOptions& o,
                        TaskScores* scores) {
  const int window = session->window();
  const int vocab = session->config().vocab_size;
  const size_t n = task.cloze.size();
  std::vector<std::vector<int32_t>> contexts(n);
  // Items of one shape (context tokens, target tokens) decode together, in item order.
  std::map<std::pair<size_t, size_t>, std::vector<size_t>> by_shape;
  for (size_t i = 0; i < n; ++i) {
    const ClozeItem& item = task.cloze[i];
    bool truncated = false;
    contexts[i] = Truncated(item.context,
                            static_cast<int64_t>(window) - static_cast<int64_t>(item.target.size()) + 1,
                            o.eos_id, &truncated);
    scores->truncated += truncated;
    by_shape[{contexts[i].size(), item.target.size()}].push_back(i);
  }
  scores->acc.assign(n, 0.0);
  std::vector<double> logits;
  for (const auto& [shape, items] : by_shape) {
    const size_t len = shape.second;
    for (size_t first = 0; first < items.size(); first += kClozeBatch) {
      const size_t b = std::min<size_t>(kClozeBatch, items.size() - first);
      std::vector<const std::vector<int32_t>*> ctx, targets;
      for (size_t r = 0; r < b; ++r) {
        ctx.push_back(&contexts[items[first + r]]);
        targets.push_back(&task.cloze[items[first + r]].target);
      }
      SATDAR_RETURN_IF_ERROR(ContinuationLogits(session, ctx, targets, &logits));
      for (size_t r = 0; r < b; ++r) {
        bool exact = true;
        for (size_t j = 0; j < len && exact; ++j) {
          exact = Argmax(logits.data() + (r * len + j) * vocab, vocab) == (*targets[r])[j];
        }
        scores->acc[items[first + r]] = exact ? 1.0 : 0.0;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ScoreRecall(DecodeSession* session, const Task& task, const TaskEvalOptions& o,
                         TaskScores* scores) {
  const int keep = session->window() - o.max_new_tokens;
  SamplingOptions sampling;
  sampling.max_new_tokens = o.max_new_tokens;
  sampling.temperature = 0;
  sampling.eos_id = o.eos_id;
  const size_t n = task.recall.size();
  for (size_t first = 0; first < n; first += kRecallBatch) {
    const size_t b = std::min<size_t>(kRecallBatch, n - first);
    std::vector<std::vector<int32_t>> prompts;
    for (size_t r = 0; r < b; ++r) {
      bool truncated = false;
      prompts.push_back(Truncated(task.recall[first + r].prompt, keep, o.eos_id, &truncated));
      scores->truncated += truncated;
    }
    SATDAR_ASSIGN_OR_RETURN(GenerateResult generated,
                            Generate(session, prompts, sampling, [](int, int32_t) {}));
    for (size_t r = 0; r < b; ++r) {
      std::vector<int32_t> ids = generated.ids[r];
      if (!ids.empty() && ids.back() == o.eos_id) ids.pop_back();
      SATDAR_ASSIGN_OR_RETURN(std::string text, o.detokenize(ids));
      text = AsciiLower(std::move(text));
      bool found = false;
      for (const std::string& answer : task.recall[first + r].answers) {
        found = found || text.find(AsciiLower(answer)) != std::string::npos;
      }
      scores->acc.push_back(found ? 1.0 : 0.0);
    }
  }
  return absl::OkStatus();
}

nlohmann::json Metrics(const TaskScores& s, uint64_t seed, int resamples) {
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double x : v) sum += x;
    return sum / static_cast<double>(v.size());
  };
  nlohmann::json m;
  m["n"] = s.acc.size();
  m["acc"] = mean(s.acc);
  m["acc_stderr"] = BootstrapStderr(s.acc, resamples, seed);
  if (!s.acc_norm.empty()) {
    m["acc_norm"] = mean(s.acc_norm);
    m["acc_norm_stderr"] = BootstrapStderr(s.acc_norm, resamples, seed);
  }
  return m;
}

}  // namespace

std::string AsciiLower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

absl::StatusOr<std::vector<double>> ChoiceLogLikelihoods(DecodeSession* session,
                                                         const ChoiceItem& item,
                                                         const TaskEvalOptions& o) {
  Task task;
  task.name = "choice";
  task.kind = TaskKind::kChoice;
  task.choice = {item};
  SATDAR_RETURN_IF_ERROR(CheckTask(task, session->window(), session->config().vocab_size, o));
  bool truncated = false;
  return ChoiceLogLikelihoodsImpl(session, item, o, &truncated);
}

absl::StatusOr<TaskScores> ScoreTask(DecodeSession* session, const Task& task,
                                     const TaskEvalOptions& o) {
  const int window = session->window();
  SATDAR_RETURN_IF_ERROR(CheckTask(task, window, session->config().vocab_size, o));
  TaskScores scores;
  switch (task.kind) {
    case TaskKind::kChoice:
      SATDAR_RETURN_IF_ERROR(ScoreChoice(session, task, o, &scores));
      break;
    case TaskKind::kCloze:
      SATDAR_RETURN_IF_ERROR(ScoreCloze(session, task, o, &scores));
      break;
    case TaskKind::kRecall:
      SATDAR_RETURN_IF_ERROR(ScoreRecall(session, task, o, &scores));
      break;
  }
  if (scores.truncated > 0) {
    const std::string line =
        absl::StrCat("task ", task.name, ": ", scores.truncated,
                     " items truncated from the left to the window of ", window, " tokens");
    if (o.log) {
      o.log(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  return scores;
}

double BootstrapStderr(const std::vector<double>& scores, int resamples, uint64_t seed) {
  const size_t n = scores.size();
  if (n < 2 || resamples < 2) return 0.0;
  // Indices by modulo, not std::uniform_int_distribution (whose output differs between
  // standard libraries): the same seed gives the same resamples everywhere. The modulo bias
  // is below n / 2^64.
  std::mt19937_64 rng(seed);
  std::vector<double> means(resamples);
  for (int b = 0; b < resamples; ++b) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += scores[rng() % n];
    means[b] = sum / static_cast<double>(n);
  }
  double mean = 0;
  for (double m : means) mean += m;
  mean /= resamples;
  double var = 0;
  for (double m : means) var += (m - mean) * (m - mean);
  return std::sqrt(var / (resamples - 1));
}

absl::StatusOr<nlohmann::json> EvaluateTasks(DecodeSession* session,
                                             const std::vector<Task>& tasks,
                                             const TaskEvalOptions& o) {
  // Every task is checked before any is scored: a bad item fails in a second, not after hours.
  std::set<std::string> names;
  for (const Task& task : tasks) {
    if (!names.insert(task.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("two tasks are named ", task.name, " (task names are file names without "
                       ".jsonl and must differ)"));
    }
    SATDAR_RETURN_IF_ERROR(CheckTask(task, session->window(), session->config().vocab_size, o));
  }
  const bool ablate = o.gate_ablation != model::GateAblation::kNone;
  const bool mean = o.gate_ablation == model::GateAblation::kMean;
  if (ablate) {
    // A model without gates refuses every mode but kNone; the probe's mode is undone at once.
    const bool has_gates = session->SetGateAblation(o.gate_ablation);
    session->SetGateAblation(model::GateAblation::kNone);
    if (!has_gates) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gate-ablation: the model has no SATFormer gates (value_residual \"",
                       model::Name(session->config().value_residual), "\")"));
    }
  }
  // The gates' statistics are only read by the mean ablation.
  session->SetStatsEnabled(mean);
  nlohmann::json result;
  result["tasks"] = nlohmann::json::object();
  for (const Task& task : tasks) {
    if (mean) session->ResetStats();
    SATDAR_ASSIGN_OR_RETURN(TaskScores scores, ScoreTask(session, task, o));
    nlohmann::json m = Metrics(scores, o.seed, o.bootstrap);
    m["truncated"] = scores.truncated;
    if (ablate) {
      session->SetGateAblation(o.gate_ablation);  // mean: freezes the means of the pass above
      TaskEvalOptions quiet = o;
      quiet.log = [](const std::string&) {};  // the truncation was logged once
      absl::StatusOr<TaskScores> ablated = ScoreTask(session, task, quiet);
      session->SetGateAblation(model::GateAblation::kNone);
      if (!ablated.ok()) return ablated.status();
      nlohmann::json a = Metrics(*ablated, o.seed, o.bootstrap);
      a.erase("n");
      m["ablated"] = a;
    }
    result["tasks"][task.name] = m;
  }
  return result;
}

}  // namespace satdar::runtime
