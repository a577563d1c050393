// model/variants/hyper_streams.h: entry and exit of the n-stream hyper hidden state shared by
// HC and mHC. The state is stored interleaved as (B*T, n, C): token r, stream j at
// (r*n + j)*C. Entry copies h0 into every stream; exit sums the streams. A pipeline boundary
// carries the n streams as n tensors of (B*T, C) (JoinStreams / SplitStreams).
#ifndef SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_
#define SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace satdar::model {

template <typename T>
void EnterStreams(T* hyper, const T* h0, int rows, int n, int c) {
  for (int r = 0; r < rows; ++r) {
    const T* src = h0 + static_cast<size_t>(r) * c;
    for (int j = 0; j < n; ++j) std::copy(src, src + c, hyper + (static_cast<size_t>(r) * n + j) * c);
  }
}

// dh0 = sum over streams of d/d(hyper) (the backward of EnterStreams).
template <typename T>
void EnterStreamsBackward(T* dh0, const T* dhyper, int rows, int n, int c) {
  for (int r = 0; r < rows; ++r) {
    T* g = dh0 + static_cast<size_t>(r) * c;
    std::fill(g, g + c, T(0));
    for (int j = 0; j < n; ++j) {
      const T* dj = dhyper + (static_cast<size_t>(r) * n + j) * c;
      for (int e = 0; e < c; ++e) g[e] += dj[e];
    }
  }
}

template <typename T>
void ExitStreams(T* x_final, const T* hyper, int rows, int n, int c) {
  EnterStreamsBackward(x_final, hyper, rows, n, c);  // the same sum over streams
}

// Every stream receives dx_final (the backward of ExitStreams).
template <typename T>
void ExitStreamsBackward(T* dhyper, const T* dx_final, int rows, int n, int c) {
  EnterStreams(dhyper, dx_final, rows, n, c);
}

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
// sublayer) or the n streams for the next stage; backward mirrors both ends.
template <typename T>
void StreamsIn(T* hyper, bool from_h0, const T* h0, const std::vector<const T*>& in, int rows,
               int n, int c) {
  if (from_h0) {
    EnterStreams(hyper, h0, rows, n, c);
  } else {
    JoinStreams(hyper, in, rows, n, c);
  }
}
template <typename T>
void StreamsOut(T* x_final, const std::vector<T*>& out, bool to_final, const T* hyper, int rows,
                int n, int c) {
  if (to_final) {
    ExitStreams(x_final, hyper, rows, n, c);
  } else {
    SplitStreams(out, hyper, rows, n, c);
  }
}
template <typename T>
void StreamsOutBackward(T* dhyper, bool to_final, const T* dx_final,
                        const std::vector<const T*>& dout, int rows, int n, int c) {
  if (to_final) {
    ExitStreamsBackward(dhyper, dx_final, rows, n, c);
  } else {
    JoinStreams(dhyper, dout, rows, n, c);
  }
}
template <typename T>
void StreamsInBackward(T* dh0, const std::vector<T*>& din, bool from_h0, const T* dhyper,
                       int rows, int n, int c) {
  if (from_h0) {
    EnterStreamsBackward(dh0, dhyper, rows, n, c);  // every stream started as h0
  } else {
    SplitStreams(din, dhyper, rows, n, c);
  }
}

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_
