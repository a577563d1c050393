#include "model/sharding.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/dtype.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

namespace satdar::model {

bool Collective(const Sharding& s, std::unique_ptr<comm::Work> work) {
  if (s.errors != nullptr && s.errors->failed()) return false;
  absl::Status status = work->Wait();
  if (status.ok()) return true;
  SATDAR_CHECK(s.errors != nullptr) << "collective failed: " << status.ToString();
  s.errors->Record(std::move(status));
  return false;
}

namespace {

// s.collective; for a device model with an event recorded on its stream as ready_event (one
// event per thread: every collective here completes before the next is issued). Null when
// the event could not be recorded (the error is recorded in s.errors).
const comm::CollectiveOptions* Options(const Sharding& s, comm::CollectiveOptions* o) {
  *o = s.collective;
#if defined(SATDAR_WITH_CUDA)
  if (s.on_device) {
    thread_local cudaEvent_t event = nullptr;
    cudaError_t e = event == nullptr ? cudaEventCreateWithFlags(&event, cudaEventDisableTiming)
                                     : cudaSuccess;
    if (e == cudaSuccess) e = cudaEventRecord(event, s.stream);
    if (e != cudaSuccess) {
      const absl::Status status = absl::InternalError(absl::StrCat(
          "rank ", s.tp_rank, " of the TP group: recording the stream before a collective: ",
          cudaGetErrorString(e)));
      SATDAR_CHECK(s.errors != nullptr) << status.ToString();
      s.errors->Record(status);
      return nullptr;
    }
    o->ready_event = event;
  }
#endif
  return o;
}

// The dtype a collective sends T as (bf16 activations of a device model as kBF16).
template <typename T>
constexpr core::DType CommDType() {
#if defined(SATDAR_WITH_CUDA)
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return core::DType::kBF16;
  else
#endif
    return core::DTypeOf<T>::value;
}
}  // namespace

template <typename T>
void TpAllReduce(const Sharding& s, T* data, size_t n, comm::ReduceOp op) {
  if (s.tp_size == 1 || (s.errors != nullptr && s.errors->failed())) return;
  comm::CollectiveOptions o;
  if (Options(s, &o) == nullptr) return;
  Collective(s, s.tp->AllReduce(data, n, CommDType<T>(), op, o));
}

template <typename T>
void TpAllGather(const Sharding& s, const T* local, T* full, size_t n) {
  if (s.tp_size == 1) {
    std::copy(local, local + n, full);
    return;
  }
  if (s.errors != nullptr && s.errors->failed()) return;
  comm::CollectiveOptions o;
  if (Options(s, &o) == nullptr) return;
  Collective(s, s.tp->AllGather(local, full, n, CommDType<T>(), o));
}

template <typename T>
void TpReduceScatter(const Sharding& s, const T* full, T* local, size_t n) {
  if (s.tp_size == 1) {
    std::copy(full, full + n, local);
    return;
  }
  if (s.errors != nullptr && s.errors->failed()) return;
  comm::CollectiveOptions o;
  if (Options(s, &o) == nullptr) return;
  Collective(s, s.tp->ReduceScatter(full, local, n, CommDType<T>(), comm::ReduceOp::kSum, o));
}

template <typename T>
void EpAllToAllV(const Sharding& s, const T* in, const std::vector<size_t>& send_counts, T* out,
                 const std::vector<size_t>& recv_counts) {
  if (s.errors != nullptr && s.errors->failed()) return;
  comm::CollectiveOptions o;
  if (Options(s, &o) == nullptr) return;
  Collective(s, s.ep->AllToAllV(in, send_counts, out, recv_counts, CommDType<T>(), o));
}

template void EpAllToAllV<float>(const Sharding&, const float*, const std::vector<size_t>&,
                                 float*, const std::vector<size_t>&);
template void EpAllToAllV<double>(const Sharding&, const double*, const std::vector<size_t>&,
                                  double*, const std::vector<size_t>&);
template void TpAllGather<float>(const Sharding&, const float*, float*, size_t);
template void TpAllGather<double>(const Sharding&, const double*, double*, size_t);
template void TpReduceScatter<float>(const Sharding&, const float*, float*, size_t);
template void TpReduceScatter<double>(const Sharding&, const double*, double*, size_t);
template void TpAllReduce<float>(const Sharding&, float*, size_t, comm::ReduceOp);
template void TpAllReduce<double>(const Sharding&, double*, size_t, comm::ReduceOp);
#if defined(SATDAR_WITH_CUDA)
// The device models' activations (DecoderModelT<Cuda<__nv_bfloat16>>).
template void TpAllGather<__nv_bfloat16>(const Sharding&, const __nv_bfloat16*, __nv_bfloat16*,
                                         size_t);
template void TpReduceScatter<__nv_bfloat16>(const Sharding&, const __nv_bfloat16*,
                                             __nv_bfloat16*, size_t);
template void TpAllReduce<__nv_bfloat16>(const Sharding&, __nv_bfloat16*, size_t,
                                         comm::ReduceOp);
template void EpAllToAllV<__nv_bfloat16>(const Sharding&, const __nv_bfloat16*,
                                         const std::vector<size_t>&, __nv_bfloat16*,
                                         const std::vector<size_t>&);
#endif

}  // namespace satdar::model
