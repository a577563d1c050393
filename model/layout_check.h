// model/layout_check.h: whether a config can be split into a dp x tp x pp x ep layout, checked
// from the config alone (no model is built), so the coordinator can refuse an impossible job
// at submit and `satdar train` before any rank starts.
#ifndef SATDAR_MODEL_LAYOUT_CHECK_H_
#define SATDAR_MODEL_LAYOUT_CHECK_H_

#include "absl/status/status.h"
#include "model/config.h"

namespace satdar::model {

// Heads, KV heads, intermediate size and vocabulary divisible by tp; layers by pp; experts by
// ep; and every design split across stages able to hand its state over. The InvalidArgument
// error names the flag and the config field.
absl::Status ValidateSharding(const ModelConfig& config, int tp, int pp, int ep);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_LAYOUT_CHECK_H_
