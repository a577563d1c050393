// comm/rank_order_reduce.h: the reduction of gathered per-rank blocks in rank order, which
// the CPU communicators that gather and then reduce (MPI, Gloo) share, so a sum is
// bit-identical however the ranks are connected (the in-process communicator adds in the same
// order).
#ifndef SATDAR_COMM_RANK_ORDER_REDUCE_H_
#define SATDAR_COMM_RANK_ORDER_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "core/dtype.h"
#include "comm/communicator.h"

namespace satdar::comm {

// The dtypes RankOrderReduce takes.
inline bool RankOrderReducible(core::DType d) {
  return d == core::DType::kF32 || d == core::DType::kF64 || d == core::DType::kI32 ||
         d == core::DType::kI64;
}

template <typename T>
void RankOrderReduceBlocks(T* out, const char* gathered, int n, size_t count, ReduceOp op) {
  const T* base = reinterpret_cast<const T*>(gathered);
  for (size_t i = 0; i < count; ++i) {
    T acc = base[i];
    for (int r = 1; r < n; ++r) {
      const T v = base[r * count + i];
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
      if (op == ReduceOp::kMax) acc = v > acc ? v : acc;
      if (op == ReduceOp::kMin) acc = v < acc ? v : acc;
    }
    if (op == ReduceOp::kAvg) acc /= static_cast<T>(n);
    out[i] = acc;
  }
}

// out (count) = the rank-order reduction of the n blocks (count each) of gathered.
inline void RankOrderReduce(void* out, const char* gathered, int n, size_t count, core::DType d,
                            ReduceOp op) {
  switch (d) {
    case core::DType::kF32:
      return RankOrderReduceBlocks(static_cast<float*>(out), gathered, n, count, op);
    case core::DType::kF64:
      return RankOrderReduceBlocks(static_cast<double*>(out), gathered, n, count, op);
    case core::DType::kI32:
      return RankOrderReduceBlocks(static_cast<int32_t*>(out), gathered, n, count, op);
    case core::DType::kI64:
      return RankOrderReduceBlocks(static_cast<int64_t*>(out), gathered, n, count, op);
    default:
      SATDAR_CHECK(false) << "reductions of " << core::DTypeName(d) << " are not supported";
  }
}

}  // namespace satdar::comm

#endif  // SATDAR_COMM_RANK_ORDER_REDUCE_H_
