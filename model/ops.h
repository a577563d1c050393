// model/ops.h: what a model class calls its arithmetic by. `ops::X(x_, ...)` inside
// satdar::model finds the designs' ops (namespace satdar::model::ops in <design>_ops.h) and,
// through the directive below, the core ops (core/ops/ops.h: RMSNorm, RoPE, GEMMs, attention,
// embedding, cross-entropy, vocabulary-parallel pieces, elementwise copies and adds), each
// overloaded on the execution context (core/exec.h).
#ifndef SATDAR_MODEL_OPS_H_
#define SATDAR_MODEL_OPS_H_

#include <cstdint>
#include <vector>

#include "core/ops/ops.h"

namespace satdar::model::ops {
using namespace ::satdar::core::ops;  // NOLINT: one ops:: spelling for core and design ops
}  // namespace satdar::model::ops

namespace satdar::model {

// A design's statistics accumulate in fp64 buffers of its backend (ops::AccumulateColumns),
// so a device keeps them without a wait per layer; they are read here when logged: on the
// CPU the buffer itself, on a device a copy into *host (one wait for the stream). Null when
// the buffer is empty (nothing gathered yet) or the copy failed (the stream's error, which
// the next pass returns).
template <class B, class V>
const double* ReadStatistics(const typename B::Exec& x, const V& acc, std::vector<double>* host) {
  if (acc.empty()) return nullptr;
  if constexpr (!B::kDevice) {
    (void)x, (void)host;
    return acc.data();
  } else {
    host->resize(acc.size());
    if (!ops::Download(x, host->data(), acc.data(), static_cast<int64_t>(acc.size())).ok()) {
      return nullptr;
    }
    return host->data();
  }
}

}  // namespace satdar::model

#endif  // SATDAR_MODEL_OPS_H_
