#include "runtime/passage_recall.h"

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace satdar::runtime {

PassageRecallOptions ResolvePassageRecallSizes(PassageRecallOptions o, int window) {
  if (o.span_tokens == 0) o.span_tokens = std::min(24, window / 4);
  if (o.target_tokens == 0) o.target_tokens = std::max(1, std::min(8, o.span_tokens / 3));
  if (o.passage_tokens == 0) o.passage_tokens = std::min(128, window - o.span_tokens);
  return o;
}

absl::StatusOr<Task> MakePassageRecall(const data::Dataset& dataset,
                                       const PassageRecallOptions& options, int window) {
  const PassageRecallOptions o = ResolvePassageRecallSizes(options, window);
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--task passage-recall: ", why));
  };
  if (o.items < 1) return bad("--recall-items must be at least 1");
  if (o.target_tokens < 1 || o.target_tokens >= o.span_tokens) {
    return bad(absl::StrCat("--recall-target-tokens ", o.target_tokens,
                            " must be at least 1 and less than --recall-span-tokens ",
                            o.span_tokens));
  }
  if (o.passage_tokens < 2 * o.span_tokens) {
    return bad(absl::StrCat("--recall-passage-tokens ", o.passage_tokens,
                            " must be at least twice --recall-span-tokens ", o.span_tokens,
                            " (sizes not given are chosen from the model's window of ", window,
                            " tokens)"));
  }
  if (static_cast<int64_t>(o.passage_tokens) + o.span_tokens > window) {
    return bad(absl::StrCat("--recall-passage-tokens ", o.passage_tokens,
                            " + --recall-span-tokens ", o.span_tokens,
                            " exceed the model's window of ", window,
                            " tokens (max_position_embeddings)"));
  }
  // The documents long enough for an item: [start, end) of the split, EOS excluded.
  const uint64_t total = dataset.tokens(data::Split::kVal);
  const uint64_t min_length = 2 * static_cast<uint64_t>(o.span_tokens);
  std::vector<std::pair<uint64_t, uint64_t>> documents;
  uint64_t start = 0;
  for (uint64_t i = 0; i <= total; ++i) {
    if (i == total || dataset.token(data::Split::kVal, i) == static_cast<uint32_t>(o.eos_id)) {
      if (i - start >= min_length) documents.emplace_back(start, i);
      start = i + 1;
    }
  }
  if (documents.empty()) {
    return bad(absl::StrCat("the validation split of ", dataset.dir(), " (", total,
                            " tokens) has no document of at least ", min_length,
                            " tokens (twice --recall-span-tokens)"));
  }
  Task task;
  task.name = kPassageRecallName;
  task.kind = TaskKind::kCloze;
  std::mt19937_64 rng(o.seed);
  auto draw = [&rng](uint64_t n) { return rng() % n; };  // [0, n)
  for (int item = 0; item < o.items; ++item) {
    const auto [doc_start, doc_end] = documents[draw(documents.size())];
    const uint64_t length = std::min<uint64_t>(o.passage_tokens, doc_end - doc_start);
    const uint64_t passage = doc_start + draw(doc_end - doc_start - length + 1);
    const uint64_t span = passage + draw(length - o.span_tokens + 1);
    ClozeItem c;
    c.context.reserve(length + o.span_tokens - o.target_tokens);
    for (uint64_t i = passage; i < passage + length; ++i) {
      c.context.push_back(static_cast<int32_t>(dataset.token(data::Split::kVal, i)));
    }
    const uint64_t cut = span + o.span_tokens - o.target_tokens;
    for (uint64_t i = span; i < cut; ++i) {
      c.context.push_back(static_cast<int32_t>(dataset.token(data::Split::kVal, i)));
    }
    for (uint64_t i = cut; i < span + o.span_tokens; ++i) {
      c.target.push_back(static_cast<int32_t>(dataset.token(data::Split::kVal, i)));
    }
    task.cloze.push_back(std::move(c));
    task.where.push_back(absl::StrCat("passage-recall item ", item, " (validation tokens ",
                                      passage, " to ", passage + length, ")"));
  }
  return task;
}

}  // namespace satdar::runtime
