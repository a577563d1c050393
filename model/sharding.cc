#include "model/sharding.h"

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

template void TpAllReduce<float>(const Sharding&, float*, size_t, comm::ReduceOp);
template void TpAllReduce<double>(const Sharding&, double*, size_t, comm::ReduceOp);

}  // namespace satdar::model
