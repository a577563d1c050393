// model/ops.h: what a model class calls its arithmetic by. `ops::X(x_, ...)` inside
// satdar::model finds the designs' ops (namespace satdar::model::ops in <design>_ops.h) and,
// through the directive below, the core ops (core/ops/ops.h: RMSNorm, RoPE, GEMMs, attention,
// embedding, cross-entropy, vocabulary-parallel pieces, elementwise copies and adds), each
// overloaded on the execution context (core/exec.h).
#ifndef SATDAR_MODEL_OPS_H_
#define SATDAR_MODEL_OPS_H_

#include "core/ops/ops.h"

namespace satdar::model::ops {
using namespace ::satdar::core::ops;  // NOLINT: one ops:: spelling for core and design ops
}  // namespace satdar::model::ops

#endif  // SATDAR_MODEL_OPS_H_
