// model/variants/hyper_streams.h: the ends of a range of sublayers over the n-stream hyper
// state shared by HC and mHC. The state is stored interleaved as (B*T, n, C): token r, stream
// j at (r*n + j)*C. The first sublayer's range enters h0 into every stream and the last one's
// sums the streams (ops::StreamsBroadcast / StreamsSum); a pipeline boundary carries the n
// streams as n tensors of (B*T, C) (ops::JoinStreams / SplitStreams: pure copies). All are
// ops of hyper_ops.h with a CUDA twin.
#ifndef SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_
#define SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_

#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/exec.h"
#include "model/ops.h"
#include "model/topology.h"
#include "model/variants/hyper_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>

#include "core/dtype.h"
#include "core/ops/gemm_cuda.h"
#endif

namespace satdar::model {

namespace hyper_streams_internal {

// list (a B::PtrList of P, model/backend.h) <- parts, published for an op to read as one
// array; parts must hold the n streams.
template <typename Exec, typename P, typename List>
absl::Status PublishParts(const Exec& x, const std::vector<P>& parts, int n, List* list) {
  if (static_cast<int>(parts.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("hyper streams: ", parts.size(), " boundary tensors for ", n, " streams"));
  }
  list->clear();
  for (P p : parts) list->push_back(p);
  return list->Publish(x);
}


}  // namespace hyper_streams_internal

// A range of sublayers (pipeline stages, topology.h) starts from h0 entered into every stream
// (first sublayer 1) or from the previous stage's n streams, and ends in x_final (the last
// sublayer) or the n streams for the next stage; backward mirrors both ends. x is the
// execution context of the ops (hyper_ops.h: a core::CpuExec or a core::CudaExec). A boundary's
// n tensors (in, out, dout, din: the topology's pointers) go to the op through the caller's
// list (a `typename B::template PtrList<const T*>` or `<T*>`), written and published here.
// The analyses' depth states (TopologyT::DepthStates) of the hyper state after every sublayer
// (hyper[0] the entered h0, hyper[l] after sublayer l): each stream after every layer.
template <class B, class V>
void HyperDepthStates(const std::vector<V>& hyper, int rows, int n, int c,
                      std::vector<typename TopologyT<B>::DepthStateRef>* refs) {
  const int64_t whole = static_cast<int64_t>(rows) * n * c;
  for (int j = 0; j < n; ++j) {
    for (int l = 0; l < static_cast<int>(hyper.size()); l += 2) {  // 0, 2, .., 2L
      refs->push_back({j, l / 2, l, hyper[l].data(), whole, static_cast<int64_t>(j) * c,
                       static_cast<int64_t>(n) * c});
    }
  }
}

template <typename Exec, typename T, typename List>
absl::Status StreamsIn(const Exec& x, T* hyper, bool from_h0, const T* h0,
                       const std::vector<const T*>& in, List* in_list, int rows, int n, int c) {
  if (from_h0) {
    SATDAR_RETURN_IF_ERROR(ops::StreamsBroadcast(x, hyper, h0, rows, n, c));
  } else {
    SATDAR_RETURN_IF_ERROR(hyper_streams_internal::PublishParts(x, in, n, in_list));
    SATDAR_RETURN_IF_ERROR(ops::JoinStreams(x, hyper, in_list->data(), rows, n, c));
  }
  return absl::OkStatus();
}
template <typename Exec, typename T, typename List>
absl::Status StreamsOut(const Exec& x, T* x_final, const std::vector<T*>& out, List* out_list,
                        bool to_final, const T* hyper, int rows, int n, int c) {
  if (to_final) {
    SATDAR_RETURN_IF_ERROR(ops::StreamsSum(x, x_final, hyper, rows, n, c));
  } else {
    SATDAR_RETURN_IF_ERROR(hyper_streams_internal::PublishParts(x, out, n, out_list));
    SATDAR_RETURN_IF_ERROR(ops::SplitStreams(x, out_list->data(), hyper, rows, n, c));
  }
  return absl::OkStatus();
}
template <typename Exec, typename T, typename List>
absl::Status StreamsOutBackward(const Exec& x, T* dhyper, bool to_final, const T* dx_final,
                                const std::vector<const T*>& dout, List* dout_list, int rows,
                                int n, int c) {
  if (to_final) {
    // Every stream gets dx_final.
    SATDAR_RETURN_IF_ERROR(ops::StreamsBroadcast(x, dhyper, dx_final, rows, n, c));
  } else {
    SATDAR_RETURN_IF_ERROR(hyper_streams_internal::PublishParts(x, dout, n, dout_list));
    SATDAR_RETURN_IF_ERROR(ops::JoinStreams(x, dhyper, dout_list->data(), rows, n, c));
  }
  return absl::OkStatus();
}
template <typename Exec, typename T, typename List>
absl::Status StreamsInBackward(const Exec& x, T* dh0, const std::vector<T*>& din, List* din_list,
                               bool from_h0, const T* dhyper, int rows, int n, int c) {
  if (from_h0) {
    // Every stream started as h0.
    SATDAR_RETURN_IF_ERROR(ops::StreamsSum(x, dh0, dhyper, rows, n, c));
  } else {
    SATDAR_RETURN_IF_ERROR(hyper_streams_internal::PublishParts(x, din, n, din_list));
    SATDAR_RETURN_IF_ERROR(ops::SplitStreams(x, din_list->data(), dhyper, rows, n, c));
  }
  return absl::OkStatus();
}

}  // namespace satdar::model

#endif  // SATDAR_MODEL_VARIANTS_HYPER_STREAMS_H_
