// runtime/train_options.h: what `satdar train` is asked to do (settings/train_options.h) and
// what it reports (TrainSummary).
#ifndef SATDAR_RUNTIME_TRAIN_OPTIONS_H_
#define SATDAR_RUNTIME_TRAIN_OPTIONS_H_

#include <cstdint>

#include "settings/train_options.h"

namespace satdar::runtime {

using settings::GpuOptions;
using settings::TrainOptions;

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;
  double tokens_per_second = 0;
  int64_t peak_rss_bytes = 0;
  // GPU runs: the caching allocator's peak and the model FLOPs utilisation.
  int64_t peak_device_bytes = 0;
  double mfu = 0;
  // --resume found the run finished: no step ran, final_loss is the last checkpoint's.
  bool already_complete = false;
};

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_TRAIN_OPTIONS_H_
