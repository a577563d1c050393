// cli/train_flags.h: the flags of `satdar train`: the training settings
// (settings/train_settings.h, which the coordinator also checks job specs with) spelled as
// flags. The config itself is read by the command.
#ifndef SATDAR_CLI_TRAIN_FLAGS_H_
#define SATDAR_CLI_TRAIN_FLAGS_H_

#include "absl/status/status.h"
#include "cli/flags.h"
#include "runtime/train_options.h"

namespace satdar::cli {

void DefineTrainFlags(FlagSet* flags);

// The optimizer, schedule, data, output and layout flags into *o: settings::ParseTrainSettings
// on the flags given; InvalidArgument "satdar train: ..." naming the flag.
absl::Status ParseTrainOptions(const FlagSet& flags, runtime::TrainOptions* o);

}  // namespace satdar::cli

#endif  // SATDAR_CLI_TRAIN_FLAGS_H_
