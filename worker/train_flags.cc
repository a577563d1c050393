#include "worker/train_flags.h"

#include "absl/strings/str_cat.h"
#include "settings/train_settings.h"
#include "worker/cli_util.h"

namespace satdar::worker {

void DefineTrainFlags(FlagSet* flags) {
  DefineSettingFlags(flags, [](const settings::SettingDef&) { return true; });
}

absl::Status ParseTrainOptions(const FlagSet& flags, TrainOptions* o) {
  const absl::Status s = settings::ParseTrainSettings(SettingsOf(flags), o);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("satdar ", flags.command(), ": ", s.message()));
}

}  // namespace satdar::worker
