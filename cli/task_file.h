// cli/task_file.h: the JSONL task files of `satdar eval --task FILE.jsonl` (docs/EVAL.md), read
// and tokenized into runtime::Task (runtime/task_eval.h).
//
// One JSON object per line (blank lines are skipped; a UTF-8 byte order mark at the start is
// ignored):
//   {"type": "choice", "context": "...", "choices": ["...", ...], "answer": K}
//   {"type": "cloze", "context": "...", "target": "..."}
//   {"type": "recall", "prompt": "...", "answers": ["...", ...]}
// Rules, each broken one InvalidArgument "FILE:LINE: field \"NAME\": why" (or "FILE:LINE: not
// valid JSON: ..."):
//   - a file holds one type (its metrics: acc_norm exists for choice only); a record of another
//     type than the file's first is an error of field "type";
//   - every field of the type is required and no other is allowed (a misspelt "anwser" is an
//     error, never ignored);
//   - context and prompt are strings, possibly empty (then the model is conditioned on EOS);
//     target, each choice and each answer are non-empty strings; choices and answers are
//     non-empty arrays; answer is an integer in [0, number of choices);
//   - a file without records is an error.
//
// Tokenization (no BOS or EOS added): context ids = Encode(context); a choice's (or target's)
// ids are Encode(context + choice) without the context's ids when those are its prefix (the
// tokens the continuation gets in running text, as lm-eval-harness encodes the whole and
// splits), else Encode(choice) (a tokenizer that merges across the boundary); a choice with
// no tokens is an error of its field. The choice's length for acc_norm is its UTF-8 bytes as
// written in the file.
#ifndef SATDAR_CLI_TASK_FILE_H_
#define SATDAR_CLI_TASK_FILE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/task_eval.h"

namespace satdar::cli {

struct TaskRecord {
  int line = 0;          // 1-based
  std::string context;   // choice, cloze; recall: the prompt
  std::vector<std::string> choices;
  int answer = 0;
  std::string target;
  std::vector<std::string> answers;
};

struct TaskFile {
  std::string path;
  std::string name;  // the file name without its folder and ".jsonl"
  runtime::TaskKind kind = runtime::TaskKind::kChoice;
  std::vector<TaskRecord> records;
};

// "hellaswag" for "data/hellaswag.jsonl".
std::string TaskNameOf(const std::string& path);

// `text` is the content of the file at `path` (named in errors).
absl::StatusOr<TaskFile> ParseTaskFile(const std::string& path, const std::string& text);
absl::StatusOr<TaskFile> ReadTaskFile(const std::string& path);

using Encoder = std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)>;
// The task in token form; its items' `where` are "FILE:LINE".
absl::StatusOr<runtime::Task> TokenizeTaskFile(const TaskFile& file, const Encoder& encode);

}  // namespace satdar::cli

#endif  // SATDAR_CLI_TASK_FILE_H_
