#include "model/sharding.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/dtype.h"

namespace satdar::model {

bool Collective(const Sharding& s, std::unique_ptr<comm::Work> work) {
  if (s.errors != nullptr && s.errors->failed()) return false;
  absl::Status status = work->Wait();
  if (status.ok()) return true;
  SATDAR_CHECK(s.errors != nullptr) << "collective failed: " << status.ToString();
  s.errors->Record(std::move(status));
  return false;
}

template <typename T>
void TpAllReduce(const Sharding& s, T* data, size_t n, comm::ReduceOp op) {
  if (s.tp_size == 1 || (s.errors != nullptr && s.errors->failed())) return;
  Collective(s, s.tp->AllReduce(data, n, core::DTypeOf<T>::value, op, s.collective));
}

template <typename T>
void TpAllGather(const Sharding& s, const T* local, T* full, size_t n) {
  if (s.tp_size == 1) {
    std::copy(local, local + n, full);
    return;
  }
  if (s.errors != nullptr && s.errors->failed()) return;
  Collective(s, s.tp->AllGather(local, full, n, core::DTypeOf<T>::value, s.collective));
}

template <typename T>
void TpReduceScatter(const Sharding& s, const T* full, T* local, size_t n) {
  if (s.tp_size == 1) {
    std::copy(full, full + n, local);
    return;
  }
  if (s.errors != nullptr && s.errors->failed()) return;
  Collective(s, s.tp->ReduceScatter(full, local, n, core::DTypeOf<T>::value,
                                    comm::ReduceOp::kSum, s.collective));
}

template void TpAllGather<float>(const Sharding&, const float*, float*, size_t);
template void TpAllGather<double>(const Sharding&, const double*, double*, size_t);
template void TpReduceScatter<float>(const Sharding&, const float*, float*, size_t);
template void TpReduceScatter<double>(const Sharding&, const double*, double*, size_t);
template void TpAllReduce<float>(const Sharding&, float*, size_t, comm::ReduceOp);
template void TpAllReduce<double>(const Sharding&, double*, size_t, comm::ReduceOp);

}  // namespace satdar::model
