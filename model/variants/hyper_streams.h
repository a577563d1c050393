// model/variants/hyper_streams.h: entry and exit of the n-stream hyper hidden state shared by
// HC and mHC. The state is stored interleaved as (B*T, n, C): token r, stream j at
// (r*n + j)*C. Entry copies h0 into every stream; exit sums the streams.
#ifndef SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_
#define SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_

#include <algorithm>
#include <cstddef>

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

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_
