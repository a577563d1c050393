// The MoE FFN's router, plan, permute and combine on the CPU (moe_ops.h): the reference the
// CUDA side is tested against, and what the CPU model runs. The loops are Moe::Route's,
// Forward's and Backward's as they were inline in moe.cc: per element the same operations in
// the same order, so the model's results did not change bit for bit when they moved here.
// Tokens (route, router backward, combine, permute backward) and rows (permute, combine
// backward) are independent and run in parallel; the plan and the losses' sums run serially
// in token order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "model/layout_check.h"
#include "model/variants/moe_ops.h"

namespace satdar::model {
// CheckDeviceSupport refuses configs with copies of the CUDA router's limits (layout_check.h).
static_assert(kDeviceMaxExperts == kMoeMaxExperts,
              "layout_check.h's kDeviceMaxExperts must equal kMoeMaxExperts");
static_assert(kDeviceMaxTopK == kMoeMaxTopK,
              "layout_check.h's kDeviceMaxTopK must equal kMoeMaxTopK");
}  // namespace satdar::model

namespace satdar::model::cpu {

namespace {

constexpr int64_t kRowChunk = 16;  // the least tokens or rows a worker takes

// Token tok's dispatched rows (row_of_slot >= 0) in increasing order into rows (k), their
// slots into slots (k); returns their count. The order of moe.cc's loops over the rows.
int TokenRows(const int* row_of_slot, int64_t tok, int k, int* rows, int* slots) {
  int cnt = 0;
  for (int j = 0; j < k; ++j) {
    const int slot = static_cast<int>(tok * k + j), r = row_of_slot[slot];
    if (r < 0) continue;
    int p = cnt++;
    for (; p > 0 && rows[p - 1] > r; --p) {  // insertion sort, k is small
      rows[p] = rows[p - 1];
      slots[p] = slots[p - 1];
    }
    rows[p] = r;
    slots[p] = slot;
  }
  return cnt;
}

}  // namespace

template <typename T>
void MoeRoute(T* probs, T* lse, int* sel, T* weight, const T* logits, int n, int e, int k,
              bool norm_topk, core::ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t r0, int64_t r1) {
        std::vector<int> order(e);
        for (int64_t r = r0; r < r1; ++r) {
          const T* x = logits + r * e;
          T* pr = probs + r * e;
          T mx = x[0];
          for (int j = 1; j < e; ++j) mx = std::max(mx, x[j]);
          T sum = 0;
          for (int j = 0; j < e; ++j) sum += pr[j] = std::exp(x[j] - mx);
          for (int j = 0; j < e; ++j) pr[j] /= sum;
          lse[r] = mx + std::log(sum);
          for (int j = 0; j < e; ++j) order[j] = j;
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pr[a] > pr[b]; });
          T total = 0;
          for (int j = 0; j < k; ++j) total += pr[order[j]];
          for (int j = 0; j < k; ++j) {
            sel[r * k + j] = order[j];
            weight[r * k + j] = norm_topk ? pr[order[j]] / total : pr[order[j]];
          }
        }
      },
      kRowChunk);
}

void MoePlan(int* counts, int* slots, int* row_of_slot, const int* sel, int n, int e, int k) {
  const int64_t nk = static_cast<int64_t>(n) * k;
  std::fill(counts, counts + e, 0);
  for (int64_t s = 0; s < nk; ++s) ++counts[sel[s]];
  std::vector<int64_t> next(e);  // each expert's next row
  int64_t offset = 0;
  for (int j = 0; j < e; ++j) {
    next[j] = offset;
    offset += counts[j];
  }
  for (int64_t s = 0; s < nk; ++s) {  // slots in increasing (token) order within an expert
    const int64_t row = next[sel[s]]++;
    slots[row] = static_cast<int>(s);
    row_of_slot[s] = static_cast<int>(row);
  }
}

void MoeInvertSlots(int* row_of_slot, const int* slots, int rows, int n, int k) {
  std::fill(row_of_slot, row_of_slot + static_cast<int64_t>(n) * k, -1);
  for (int r = 0; r < rows; ++r) row_of_slot[slots[r]] = r;
}

template <typename T>
void MoeRouterLoss(double* loss_acc, double* fraction, const T* probs, const T* lse,
                   const int* sel, int b, int t, int e, int k, double aux_coef, double z_coef,
                   double scale) {
  const int n = b * t;
  std::fill(fraction, fraction + static_cast<int64_t>(b) * e, 0.0);
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < k; ++j) {
      fraction[(r / t) * e + sel[static_cast<int64_t>(r) * k + j]] +=
          1.0 / (static_cast<double>(t) * k);
    }
  }
  if (loss_acc == nullptr) return;
  // Sequence-wise aux loss: coef * mean_b E sum_e f_e^b P_e^b; z-loss: coef * mean lse^2.
  double aux = 0;
  for (int bb = 0; bb < b; ++bb) {
    double sum = 0;
    for (int j = 0; j < e; ++j) {
      double p = 0;  // P_e^b
      for (int r = bb * t; r < (bb + 1) * t; ++r) p += probs[static_cast<int64_t>(r) * e + j];
      sum += fraction[bb * e + j] * (p / t);
    }
    aux += e * sum;
  }
  aux = aux_coef * aux / b;
  double zl = 0;
  for (int r = 0; r < n; ++r) zl += static_cast<double>(lse[r]) * lse[r];
  zl = z_coef * zl / n;
  *loss_acc += scale * (aux + zl);
}

template <typename T>
void MoeRouteBackward(T* dlogits, const T* probs, const T* lse, const int* sel, const T* weight,
                      const T* dweight, const double* fraction, int b, int t, int e, int k,
                      bool norm_topk, double aux_grad, double z_grad, core::ThreadPool* pool) {
  pool->ParallelFor(
      static_cast<int64_t>(b) * t,
      [&](int64_t r0, int64_t r1) {
        std::vector<double> dp(e);  // d loss / d probs of the token
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t bb = r / t;
          for (int j = 0; j < e; ++j) dp[j] = aux_grad * fraction[bb * e + j];
          const int* s = sel + r * k;
          const T* w = weight + r * k;
          const T* dw = dweight + r * k;
          if (norm_topk) {
            double sum = 0, dot = 0;
            for (int j = 0; j < k; ++j) {
              sum += probs[r * e + s[j]];
              dot += static_cast<double>(dw[j]) * w[j];
            }
            for (int j = 0; j < k; ++j) dp[s[j]] += (dw[j] - dot) / sum;
          } else {
            for (int j = 0; j < k; ++j) dp[s[j]] += dw[j];
          }
          const T* pr = probs + r * e;
          double pdp = 0;
          for (int j = 0; j < e; ++j) pdp += pr[j] * dp[j];
          T* dl = dlogits + r * e;
          for (int j = 0; j < e; ++j) {
            dl[j] = static_cast<T>(pr[j] * (dp[j] - pdp) + z_grad * lse[r] * pr[j]);
          }
        }
      },
      kRowChunk);
}

template <typename T>
void MoePermute(T* xp, const T* x, const int* slots, int rows, int k, int d,
                core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* src = x + static_cast<int64_t>(slots[r] / k) * d;
          std::copy(src, src + d, xp + r * d);
        }
      },
      kRowChunk);
}

template <typename T>
void MoePermuteBackward(T* dx, const T* dxp, const int* row_of_slot, int n, int k, int d,
                        core::ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t t0, int64_t t1) {
        std::vector<int> rows(k), slots(k);
        for (int64_t tok = t0; tok < t1; ++tok) {
          const int cnt = TokenRows(row_of_slot, tok, k, rows.data(), slots.data());
          T* o = dx + tok * d;
          for (int i = 0; i < cnt; ++i) {
            const T* g = dxp + static_cast<int64_t>(rows[i]) * d;
            for (int c = 0; c < d; ++c) o[c] += g[c];
          }
        }
      },
      kRowChunk);
}

template <typename T>
void MoeCombine(T* out, const T* y, const T* weight, const int* row_of_slot, int n, int k, int d,
                core::ThreadPool* pool) {
  pool->ParallelFor(
      n,
      [&](int64_t t0, int64_t t1) {
        std::vector<int> rows(k), slots(k);
        for (int64_t tok = t0; tok < t1; ++tok) {
          T* o = out + tok * d;
          std::fill(o, o + d, T(0));
          const int cnt = TokenRows(row_of_slot, tok, k, rows.data(), slots.data());
          for (int i = 0; i < cnt; ++i) {
            const T w = weight[slots[i]];
            const T* yr = y + static_cast<int64_t>(rows[i]) * d;
            for (int c = 0; c < d; ++c) o[c] += w * yr[c];
          }
        }
      },
      kRowChunk);
}

template <typename T>
void MoeCombineBackward(T* dy, T* dweight, const T* dout, const T* y, const T* weight,
                        const int* slots, int rows, int k, int d, core::ThreadPool* pool) {
  pool->ParallelFor(
      rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int slot = slots[r], tok = slot / k;
          const T* g = dout + static_cast<int64_t>(tok) * d;
          const T* yr = y + r * d;
          T dot = 0;
          for (int c = 0; c < d; ++c) {
            dy[r * d + c] = weight[slot] * g[c];
            dot += yr[c] * g[c];
          }
          dweight[slot] = dot;
        }
      },
      kRowChunk);
}

#define SATDAR_MOE_OPS_INSTANTIATE(T)                                                           \
  template void MoeRoute<T>(T*, T*, int*, T*, const T*, int, int, int, bool,                   \
                            core::ThreadPool*);                                                 \
  template void MoeRouterLoss<T>(double*, double*, const T*, const T*, const int*, int, int,   \
                                 int, int, double, double, double);                            \
  template void MoeRouteBackward<T>(T*, const T*, const T*, const int*, const T*, const T*,    \
                                    const double*, int, int, int, int, bool, double, double,   \
                                    core::ThreadPool*);                                         \
  template void MoePermute<T>(T*, const T*, const int*, int, int, int, core::ThreadPool*);     \
  template void MoePermuteBackward<T>(T*, const T*, const int*, int, int, int,                 \
                                      core::ThreadPool*);                                       \
  template void MoeCombine<T>(T*, const T*, const T*, const int*, int, int, int,               \
                              core::ThreadPool*);                                               \
  template void MoeCombineBackward<T>(T*, T*, const T*, const T*, const T*, const int*, int,   \
                                      int, int, core::ThreadPool*);
SATDAR_MOE_OPS_INSTANTIATE(float)
SATDAR_MOE_OPS_INSTANTIATE(double)
#undef SATDAR_MOE_OPS_INSTANTIATE

}  // namespace satdar::model::cpu
