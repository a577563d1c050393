#include "worker/cli_util.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "worker/cli.h"

namespace satdar::worker {

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kAlreadyExists: return 2;
    default: return 1;
  }
}

std::string FlagOrEnv(const FlagSet& flags, const std::string& flag, const char* env) {
  if (flags.Has(flag)) return flags.Get(flag);
  const char* v = std::getenv(env);
  return v == nullptr ? "" : v;
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

absl::Status PrintHelp(const FlagSet& flags) {
  std::fprintf(stdout, "%s", flags.Usage().c_str());
  return absl::OkStatus();
}

void DefineTaskFlags(FlagSet* flags) {
  flags->DefineEnum("--task", "the training task: the data's language modelling, or multi-query "
                    "associative recall", {"lm", "mqar"}, "lm");
  flags->Define("--mqar-keys", "MQAR: distinct key ids", false, "64");
  flags->Define("--mqar-values", "MQAR: distinct value ids", false, "64");
  flags->Define("--mqar-pairs", "MQAR: key-value pairs per sequence", false, "8");
  flags->Define("--mqar-queries", "MQAR: queries per sequence", false, "8");
}

absl::StatusOr<std::optional<data::MqarOptions>> TaskFromFlags(const FlagSet& flags) {
  if (flags.Get("--task") == "lm") {
    for (const char* f : {"--mqar-keys", "--mqar-values", "--mqar-pairs", "--mqar-queries"}) {
      if (flags.Has(f)) {
        return absl::InvalidArgumentError(absl::StrCat("flag ", f, " needs --task mqar"));
      }
    }
    return std::optional<data::MqarOptions>();
  }
  data::MqarOptions m;
  SATDAR_ASSIGN_OR_RETURN(int64_t keys, flags.GetInt("--mqar-keys", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t values, flags.GetInt("--mqar-values", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t pairs, flags.GetInt("--mqar-pairs", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(int64_t queries, flags.GetInt("--mqar-queries", 1, kMaxSeqLen));
  m.keys = static_cast<int>(keys);
  m.values = static_cast<int>(values);
  m.pairs = static_cast<int>(pairs);
  m.queries = static_cast<int>(queries);
  return std::optional<data::MqarOptions>(m);
}

absl::Status CheckInputs(const std::vector<InputPath>& inputs) {
  for (const InputPath& in : inputs) {
    if (in.path.empty()) continue;
    absl::Status s;
    if (in.kind == InputPath::kFile) {
      s = core::CheckRegularFile(in.path);
    } else if (in.kind == InputPath::kFolder) {
      s = core::CheckFolder(in.path);
    } else if (core::CheckFolder(in.path).ok()) {
      s = absl::OkStatus();
    } else {
      s = core::CheckRegularFile(in.path);
    }
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(in.flag, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckOutput(const std::string& flag, const std::string& path, bool folder,
                         const std::vector<InputPath>& inputs) {
  if (path.empty()) return absl::OkStatus();
  absl::Status s = folder ? core::CheckOutputFolder(path) : core::CheckOutputFile(path);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
  for (const InputPath& in : inputs) {
    if (in.path.empty()) continue;
    if (in.path == path || core::SameFile(in.path, path)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is also ", in.flag,
                                                     "; an output never overwrites an input"));
    }
  }
  return absl::OkStatus();
}

}  // namespace satdar::worker
