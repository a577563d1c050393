// runtime/passage_recall.h: the built-in recall task for small models (`satdar eval --task
// passage-recall --data DIR`, reported as "passage_recall"): can the model copy a stretch of
// text it was shown, the retrieval ability SATFormer claims, measured on real held-out text at
// CPU scale.
//
// Items come from the validation split of a prepared dataset (documents are the spans between
// EOS tokens). Each item, drawn from a generator seeded with `seed`:
//   1. picks a document with at least 2 x span_tokens tokens, uniformly among those documents
//      (with replacement: a split with few documents gives several items per document);
//   2. a passage: min(passage_tokens, document length) consecutive tokens of it, from a random
//      start;
//   3. a span: span_tokens consecutive tokens of the passage, from a random start.
// The item is a cloze (runtime/task_eval.h): context = passage, then the span without its last
// target_tokens tokens, with no separator (the span reads as the passage repeating itself);
// target = those target_tokens tokens. A model that finds the span's beginning in the passage
// and copies what follows reproduces them exactly under greedy decoding; one that only models
// language rarely does. Positions are drawn by 64-bit modulo of std::mt19937_64 draws (not
// std's distributions, which differ between standard libraries), so the items are the same
// everywhere for a seed.
#ifndef SATDAR_RUNTIME_PASSAGE_RECALL_H_
#define SATDAR_RUNTIME_PASSAGE_RECALL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "data/dataset.h"
#include "runtime/task_eval.h"

namespace satdar::runtime {

inline constexpr char kPassageRecallTask[] = "passage-recall";      // --task
inline constexpr char kPassageRecallName[] = "passage_recall";      // its JSON name

// Sizes of 0 are chosen from the model's window W, so that the defaults fit small models:
//   span_tokens = min(24, W / 4), target_tokens = max(1, min(8, span_tokens / 3)),
//   passage_tokens = min(128, W - span_tokens)
// (W = 2048: 128, 24 and 8; W = 64: 48, 16 and 5).
struct PassageRecallOptions {
  int items = 200;
  int passage_tokens = 0;  // at most; shorter documents give shorter passages
  int span_tokens = 0;     // the repeated stretch, its last target_tokens being the target
  int target_tokens = 0;
  uint64_t seed = 0;
  int eos_id = 2;
};

// `o` with its sizes of 0 chosen for `window` as above.
PassageRecallOptions ResolvePassageRecallSizes(PassageRecallOptions o, int window);

// Resolves the sizes, then: InvalidArgument naming the flag for sizes that do not fit the window (passage + span must be
// at most `window` tokens), target_tokens >= span_tokens, or a split without a document of
// 2 x span_tokens tokens.
absl::StatusOr<Task> MakePassageRecall(const data::Dataset& dataset,
                                       const PassageRecallOptions& o, int window);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_PASSAGE_RECALL_H_
