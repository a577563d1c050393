// worker/train_flags.h: the flags of `satdar train` and their parsing into TrainOptions (the
// config itself is read by the command). One definition serves the command line and the
// coordinator, which validates a job spec's train settings with exactly these bounds.
#ifndef SATDAR_WORKER_TRAIN_FLAGS_H_
#define SATDAR_WORKER_TRAIN_FLAGS_H_

#include "absl/status/status.h"
#include "model/layout_check.h"
#include "worker/flags.h"
#include "worker/train_options.h"

namespace satdar::worker {

void DefineTrainFlags(FlagSet* flags);

// The optimizer, schedule, data, output and layout flags into *o; InvalidArgument naming the
// flag for anything out of bounds or inconsistent.
absl::Status ParseTrainOptions(const FlagSet& flags, TrainOptions* o);

// What the GPU path (device cuda) cannot run yet, from the options alone: TP/PP/EP,
// statistics, f64, virtual stages, sequence parallelism, a vocabulary multiple. The messages
// name the options as `names` says: `satdar train`'s flags (kFlags: "--tp", which the
// coordinator turns into a job spec's fields) or the flags' names without dashes, the way
// MODELS.md and a job spec's fields spell them (kFields: "tp", "stats_every", "device"; for
// the GPU trainer's own check, CheckCudaEngine).
enum class OptionNames { kFlags, kFields };
absl::Status CheckGpuPathOptions(const TrainOptions& o, OptionNames names);

// The layout sizes as `satdar train` (and a job spec's "train" flags) call them.
// --virtual-stages against the config: pp x V dividing the layers, and a design whose
// parameters are not shared across stages (ResFormer learnable_plus's are).
absl::Status ValidateVirtualStages(const model::ModelConfig& config, const TrainOptions& o,
                                   const model::LayoutNames& names);

inline model::LayoutNames TrainLayoutNames() {
  return {"--tp", "--pp", "--ep", "--vocab-multiple"};
}

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_TRAIN_FLAGS_H_
