// worker/train_flags.h: the flags of `satdar train`: the training settings
// (settings/train_settings.h, which the coordinator also checks job specs with) spelled as
// flags. The config itself is read by the command.
#ifndef SATDAR_WORKER_TRAIN_FLAGS_H_
#define SATDAR_WORKER_TRAIN_FLAGS_H_

#include "absl/status/status.h"
#include "worker/flags.h"
#include "worker/train_options.h"

namespace satdar::worker {

void DefineTrainFlags(FlagSet* flags);

// The optimizer, schedule, data, output and layout flags into *o: settings::ParseTrainSettings
// on the flags given; InvalidArgument "satdar train: ..." naming the flag.
absl::Status ParseTrainOptions(const FlagSet& flags, TrainOptions* o);

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_TRAIN_FLAGS_H_
