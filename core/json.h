// core/json.h: the one JSON parser for everything satdar reads (configs, safetensors headers,
// dataset manifests, checkpoint metadata).
//
//   SATDAR_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, "configs/demo.json"));
//
// Stricter than nlohmann's defaults, so that no input is silently half-read: a key given twice
// in one object ("the last wins" elsewhere), numbers outside the double range (1e999), and
// nesting deeper than kMaxJsonDepth are errors. Every error is InvalidArgument and names
// `source`, the line and column (syntax errors) or the key's path (`moe.top_k`,
// `shards[3].file`).
#ifndef SATDAR_CORE_JSON_H_
#define SATDAR_CORE_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace satdar::core {

inline constexpr int kMaxJsonDepth = 64;

absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text, const std::string& source);

}  // namespace satdar::core

#endif  // SATDAR_CORE_JSON_H_
