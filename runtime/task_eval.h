// runtime/task_eval.h: `satdar eval --task`: zero-shot tasks scored the lm-eval-harness way,
// through a DecodeSession (runtime/decode_session.h), on tasks already in token form (the CLI
// tokenizes task files, cli/task_file.h; the built-in passage recall makes its own items,
// runtime/passage_recall.h).
//
//   choice  log-likelihood of each choice as a continuation of the context: the sum over the
//           choice's tokens of the log-softmax (in double) of the logits at the position before
//           each. acc: the answer has the highest total (the first choice wins ties); acc_norm:
//           the highest total divided by the choice's length in UTF-8 bytes.
//   cloze   greedy decoding of as many tokens as the target has reproduces it exactly. Scored
//           as lm-eval-harness's is_greedy: one teacher-forced pass over context + target, every
//           target token the argmax (lowest id on ties, as runtime::Generate) of the logits
//           before it. That is the same test: greedy decoding leaves the target on its first
//           token that is not the argmax.
//   recall  greedy decoding (runtime::Generate) of up to max_new_tokens tokens, stopping at
//           EOS; correct when the lowercased text contains a lowercased answer. Lowercasing is
//           of the ASCII letters A-Z only (bytes >= 0x80 are left alone, so UTF-8 stays intact
//           and non-ASCII letters compare case-sensitively).
//
// An empty context (or prompt) is the EOS id alone, as lm-eval-harness conditions on its EOT
// token. Contexts too long for the model's window (max_position_embeddings) lose tokens from
// the left: for choice and cloze, context + continuation minus its last token must fit (the
// last token is only ever a target, as in lm-eval-harness); for recall, prompt +
// max_new_tokens. Each task logs how many items were truncated. A choice or target that alone
// cannot fit (more tokens than the window) is InvalidArgument naming the task and item.
//
// Standard errors are bootstrap estimates for every metric: 1000 resamples (with replacement)
// of the per-item 0/1 scores, from a generator seeded with `seed` (the same resamples for
// every metric of a task), and the sample standard deviation (n - 1) of the resampled means.
// lm-eval-harness uses the closed form sqrt(var / n) for mean metrics and the bootstrap only for
// others; for a mean of 0/1 scores the two agree to within resampling noise.
#ifndef SATDAR_RUNTIME_TASK_EVAL_H_
#define SATDAR_RUNTIME_TASK_EVAL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/value_residual.h"
#include "nlohmann/json.hpp"
#include "runtime/decode_session.h"

namespace satdar::runtime {

struct ChoiceItem {
  std::vector<int32_t> context;               // empty: the EOS id
  std::vector<std::vector<int32_t>> choices;  // each non-empty
  std::vector<int64_t> choice_bytes;          // UTF-8 bytes of each choice's text (> 0)
  int answer = 0;
};

struct ClozeItem {
  std::vector<int32_t> context;
  std::vector<int32_t> target;  // non-empty
};

struct RecallItem {
  std::vector<int32_t> prompt;
  std::vector<std::string> answers;  // non-empty strings
};

enum class TaskKind { kChoice, kCloze, kRecall };

// One task: items of a single kind (the vector of that kind is the one read).
struct Task {
  std::string name;  // the JSON key: a task file's name without .jsonl, or "passage_recall"
  TaskKind kind = TaskKind::kChoice;
  std::vector<ChoiceItem> choice;
  std::vector<ClozeItem> cloze;
  std::vector<RecallItem> recall;
  // Where each item came from, for errors ("hellaswag.jsonl:12"); empty: "item N" (0-based).
  std::vector<std::string> where;
};

struct TaskEvalOptions {
  int max_new_tokens = 32;  // recall
  int eos_id = 2;
  uint64_t seed = 0;        // the bootstrap's generator
  int bootstrap = 1000;     // resamples
  // Recall: the text of generated ids (the tokenizer's Decode); required for recall tasks.
  std::function<absl::StatusOr<std::string>(const std::vector<int32_t>&)> detokenize;
  // --gate-ablation: each task is scored again with SATFormer's gates set to zero, or to their
  // means over the positions the task's own un-ablated pass read (the mean ablation's
  // statistics are reset before each task, as `satdar eval --gate-ablation mean` gathers them
  // over its own batches).
  model::GateAblation gate_ablation = model::GateAblation::kNone;
  // One line per message (truncation notices); default: stderr.
  std::function<void(const std::string&)> log;
};

// The per-item 0/1 scores of one task.
struct TaskScores {
  std::vector<double> acc;
  std::vector<double> acc_norm;  // choice tasks only
  int64_t truncated = 0;         // items whose context lost tokens on the left
};

// The log-likelihood of each choice of `item` (after truncation to the session's window).
absl::StatusOr<std::vector<double>> ChoiceLogLikelihoods(DecodeSession* session,
                                                         const ChoiceItem& item,
                                                         const TaskEvalOptions& o);

// Checks every item against the window and the kind's rules (InvalidArgument naming the item),
// then scores them. Logs the truncation notice of the task when items were truncated.
absl::StatusOr<TaskScores> ScoreTask(DecodeSession* session, const Task& task,
                                     const TaskEvalOptions& o);

// Bootstrap standard error of the mean of `scores` (0 for fewer than two items).
double BootstrapStderr(const std::vector<double>& scores, int resamples, uint64_t seed);

// {"tasks": {NAME: {"n", "acc", "acc_stderr", ["acc_norm", "acc_norm_stderr"], "truncated",
// ["ablated": {"acc", "acc_stderr", ...}]}}}. Every task is checked before any is scored;
// task names must be unique.
absl::StatusOr<nlohmann::json> EvaluateTasks(DecodeSession* session,
                                             const std::vector<Task>& tasks,
                                             const TaskEvalOptions& o);

// ASCII lowercase (A-Z only); other bytes unchanged.
std::string AsciiLower(std::string s);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_TASK_EVAL_H_
