#include "cli/train_flags.h"

#include "absl/strings/str_cat.h"
#include "settings/train_settings.h"
#include "cli/cli_util.h"

namespace satdar::cli {

void DefineTrainFlags(FlagSet* flags) {
  DefineSettingFlags(flags, [](const settings::SettingDef&) { return true; });
}

absl::Status ParseTrainOptions(const FlagSet& flags, runtime::TrainOptions* o) {
  const absl::Status s = settings::ParseTrainSettings(SettingsOf(flags), o);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("satdar ", flags.command(), ": ", s.message()));
}

}  // namespace satdar::cli
