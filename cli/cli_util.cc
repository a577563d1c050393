#include "cli/cli_util.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "cli/cli.h"

namespace satdar::cli {

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

void DefineSettingFlags(FlagSet* flags,
                        const std::function<bool(const settings::SettingDef&)>& pick) {
  for (const settings::SettingDef& d : settings::TrainSettingDefs()) {
    if (!pick(d)) continue;
    const std::string flag = settings::NameOf(d.name, settings::Spelling::kFlags);
    switch (d.kind) {
      case settings::SettingKind::kValue:
        flags->Define(flag, d.help, d.required, d.default_value);
        break;
      case settings::SettingKind::kBool:
        flags->DefineBool(flag, d.help);
        break;
      case settings::SettingKind::kEnum:
        flags->DefineEnum(flag, d.help, d.choices, d.default_value);
        break;
    }
  }
}

settings::SettingValues SettingsOf(const FlagSet& flags) {
  std::map<std::string, std::string> given;
  for (const settings::SettingDef& d : settings::TrainSettingDefs()) {
    const std::string flag = settings::NameOf(d.name, settings::Spelling::kFlags);
    if (!flags.Knows(flag) || !flags.Has(flag)) continue;
    given[d.name] = d.kind == settings::SettingKind::kBool
                        ? (flags.GetBool(flag) ? "true" : "false")
                        : flags.Get(flag);
  }
  return settings::SettingValues(std::move(given), settings::Spelling::kFlags);
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

}  // namespace satdar::cli
