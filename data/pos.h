// data/pos.h: part-of-speech groups of Brown corpus tags, for the SATFormer paper's category
// analysis (`satdar eval --gate-by-category`). Each token of a prepared Brown dataset carries
// the group of the word it came from in a sidecar file beside its shard.
#ifndef SATDAR_DATA_POS_H_
#define SATDAR_DATA_POS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace satdar::data {

enum PosGroup : uint8_t { kPosNone = 0, kPosContent = 1, kPosFunction = 2, kPosPunctuation = 3 };
inline constexpr int kNumPosGroups = 4;
const char* PosGroupName(int group);  // "none", "content", "function", "punctuation"

// The group of a Brown tag such as "nn", "np-tl", "vbd", "at", "pps+bez", "fw-in", ".".
// Nouns, verbs, adjectives, adverbs and numbers are content words; determiners, pronouns,
// prepositions, conjunctions, auxiliaries (be/have/do/modals), particles and wh-words are
// function words; tags without letters are punctuation.
PosGroup BrownTagGroup(absl::string_view tag);

struct TaggedWord {
  std::string word;
  PosGroup group;
};

// One line of Brown text ("The/at jury/nn said/vbd ./.") as words with their groups.
std::vector<TaggedWord> ParseBrownLine(absl::string_view line);

}  // namespace satdar::data

#endif  // SATDAR_DATA_POS_H_
