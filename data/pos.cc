#include "data/pos.h"

#include <cctype>

#include "absl/strings/match.h"

namespace satdar::data {

const char* PosGroupName(int group) {
  static const char* kNames[kNumPosGroups] = {"none", "content", "function", "punctuation"};
  return group >= 0 && group < kNumPosGroups ? kNames[group] : "?";
}

PosGroup BrownTagGroup(absl::string_view tag) {
  std::string t(tag);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (absl::StartsWith(t, "fw-")) t = t.substr(3);  // foreign words keep their role
  size_t plus = t.find('+');                          // contractions: the first part decides
  if (plus != std::string::npos && plus > 0) t = t.substr(0, plus);
  size_t dash = t.find('-', 1);                       // -tl, -hl, -nc markers
  if (dash != std::string::npos) t = t.substr(0, dash);
  while (!t.empty() && t.back() == '$') t.pop_back();  // possessives
  bool letters = false;
  for (char c : t) letters |= std::isalpha(static_cast<unsigned char>(c)) != 0;
  if (!letters) return t == "*" ? kPosFunction : kPosPunctuation;  // "*" is "not"
  auto starts = [&](const char* p) { return absl::StartsWith(t, p); };
  if (starts("nn") || starts("np") || starts("nr") || starts("vb") || starts("jj") ||
      t == "rb" || t == "rbr" || t == "rbt" || t == "cd" || t == "od" || t == "uh") {
    return kPosContent;
  }
  return kPosFunction;
}

std::vector<TaggedWord> ParseBrownLine(absl::string_view line) {
  std::vector<TaggedWord> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    size_t start = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i == start) continue;
    absl::string_view token = line.substr(start, i - start);
    size_t slash = token.rfind('/');
    if (slash == absl::string_view::npos || slash == 0) {
      out.push_back({std::string(token), kPosNone});
    } else {
      out.push_back({std::string(token.substr(0, slash)), BrownTagGroup(token.substr(slash + 1))});
    }
  }
  return out;
}

}  // namespace satdar::data
