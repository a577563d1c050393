// model/variants/hyper_streams.h: the ends of a range of sublayers over the n-stream hyper
// state shared by HC and mHC on the CPU. The state is stored interleaved as (B*T, n, C): token
// r, stream j at (r*n + j)*C. The first sublayer's range enters h0 into every stream and the
// last one's sums the streams (ops::StreamsBroadcast / StreamsSum, hyper_ops.h: the ops with
// a CUDA twin); a pipeline boundary carries the n streams as n tensors of (B*T, C)
// (JoinStreams / SplitStreams here: pure copies, which only the CPU's pipeline stages use).
#ifndef SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_
#define SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_

#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "core/check.h"
#include "model/variants/hyper_ops.h"

namespace satdar::model {

// hyper (B*T, n, C) <- stream j from parts[j] (B*T, C).
template <typename T>
void JoinStreams(T* hyper, const std::vector<const T*>& parts, int rows, int n, int c) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      const T* src = parts[j] + static_cast<size_t>(r) * c;
      std::copy(src, src + c, hyper + (static_cast<size_t>(r) * n + j) * c);
    }
  }
}

// parts[j] (B*T, C) <- stream j of hyper (B*T, n, C).
template <typename T>
void SplitStreams(const std::vector<T*>& parts, const T* hyper, int rows, int n, int c) {
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < n; ++j) {
      const T* src = hyper + (static_cast<size_t>(r) * n + j) * c;
      std::copy(src, src + c, parts[j] + static_cast<size_t>(r) * c);
    }
  }
}

// A range of sublayers (pipeline stages, topology.h) starts from h0 entered into every stream
// (first sublayer 1) or from the previous stage's n streams, and ends in x_final (the last
// sublayer) or the n streams for the next stage; backward mirrors both ends. x is the
// execution context of the ops (hyper_ops.h: a core::CpuExec or a core::CudaExec); the
// pipeline boundaries' join / split are the host copies above.
template <typename Exec, typename T>
absl::Status StreamsIn(const Exec& x, T* hyper, bool from_h0, const T* h0,
                       const std::vector<const T*>& in, int rows, int n, int c) {
  if (from_h0) {
    SATDAR_RETURN_IF_ERROR(ops::StreamsBroadcast(x, hyper, h0, rows, n, c));
  } else {
    JoinStreams(hyper, in, rows, n, c);
  }
  return absl::OkStatus();
}
template <typename Exec, typename T>
absl::Status StreamsOut(const Exec& x, T* x_final, const std::vector<T*>& out, bool to_final,
                        const T* hyper, int rows, int n, int c) {
  if (to_final) {
    SATDAR_RETURN_IF_ERROR(ops::StreamsSum(x, x_final, hyper, rows, n, c));
  } else {
    SplitStreams(out, hyper, rows, n, c);
  }
  return absl::OkStatus();
}
template <typename Exec, typename T>
absl::Status StreamsOutBackward(const Exec& x, T* dhyper, bool to_final, const T* dx_final,
                                const std::vector<const T*>& dout, int rows, int n, int c) {
  if (to_final) {
    // Every stream gets dx_final.
    SATDAR_RETURN_IF_ERROR(ops::StreamsBroadcast(x, dhyper, dx_final, rows, n, c));
  } else {
    JoinStreams(dhyper, dout, rows, n, c);
  }
  return absl::OkStatus();
}
template <typename Exec, typename T>
absl::Status StreamsInBackward(const Exec& x, T* dh0, const std::vector<T*>& din, bool from_h0,
                               const T* dhyper, int rows, int n, int c) {
  if (from_h0) {
    // Every stream started as h0.
    SATDAR_RETURN_IF_ERROR(ops::StreamsSum(x, dh0, dhyper, rows, n, c));
  } else {
    SplitStreams(din, dhyper, rows, n, c);
  }
  return absl::OkStatus();
}

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_
