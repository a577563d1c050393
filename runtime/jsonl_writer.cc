#include "runtime/jsonl_writer.h"

#include "core/file_util.h"

namespace satdar::runtime {

absl::StatusOr<int64_t> DropJsonlStepsAfter(const std::string& path, int64_t step) {
  if (core::PathKind(path) == "missing") return 0;
  auto text = core::ReadFileToString(path, core::kNoSizeLimit);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("log_jsonl: ", text.status().message()));
  }
  std::string kept;
  kept.reserve(text->size());
  int64_t dropped = 0;
  for (size_t pos = 0; pos < text->size();) {
    size_t eol = text->find('\n', pos);
    const bool complete = eol != std::string::npos;
    if (!complete) eol = text->size();
    const std::string line = text->substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    bool drop = false;
    if (j.is_discarded()) {
      drop = !complete;  // the last line of a killed run, cut in the middle
    } else if (j.is_object()) {
      const auto it = j.find("step");
      drop = it != j.end() && it->is_number_integer() && it->get<int64_t>() > step;
    }
    if (drop) {
      ++dropped;
    } else {
      kept += line;
      kept += '\n';
    }
  }
  if (dropped == 0) return 0;
  if (absl::Status s = core::WriteFileAtomically(path, kept); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("log_jsonl: ", s.message()));
  }
  return dropped;
}

}  // namespace satdar::runtime
