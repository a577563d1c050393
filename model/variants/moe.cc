#include "model/variants/moe.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/exec.h"
#include "model/layers/linear.h"
#include "model/layers/mlp.h"
#include "model/ops.h"
#include "model/variants/moe_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>

#include "core/dtype.h"
#include "core/ops/gemm_cuda.h"
#endif

namespace satdar::model {

namespace {

template <class B>
class Moe : public FfnT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;
  // f_e^b: double on the CPU, fp32 on CUDA (moe_ops.h).
  using Fraction = std::conditional_t<B::kDevice, float, double>;

  // Expert parallelism: this rank holds routed experts [e0_, e0_ + el_); the router and the
  // shared experts are replicated (so is everything under tensor parallelism).
  Moe(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : c_(c), m_(*c.moe), shard_(shard), d_(c.hidden_size), e_(m_.num_experts), k_(m_.top_k),
        f_(m_.expert_intermediate_size), el_(e_ / shard.ep_size), e0_(shard.ep_rank * el_),
        x_(x), layers_(c.num_hidden_layers),
        load_(c.num_hidden_layers, std::vector<int64_t>(m_.num_experts, 0)) {}

  static std::string Expert(int i, const char* group, int e, const char* proj) {
    return absl::StrCat("model.layers.", i, ".mlp.", group, ".", e, ".", proj, "_proj.weight");
  }
  static std::string Router(int i) { return absl::StrCat("model.layers.", i, ".mlp.router.weight"); }

  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    if (place != ParamPlace::kLayer) return;
    const MoeConfig& m = *c.moe;
    const int64_t d = c.hidden_size, f = m.expert_intermediate_size;
    const int el = m.num_experts / shard.ep_size, e0 = shard.ep_rank * el;
    const ParamInit normal = ParamInit::Normal(c.initializer_range);
    table->Add(Router(i), {m.num_experts, d}, normal);
    for (const char* group : {"experts", "shared_experts"}) {
      const bool routed = group[0] == 'e';
      const int first = routed ? e0 : 0, count = routed ? el : m.num_shared_experts;
      for (int e = first; e < first + count; ++e) {
        // gate and up back to back: one GEMM per expert.
        const bool expert = routed && shard.ep_size > 1;
        table->Add(Expert(i, group, e, "gate"), {f, d}, normal).expert = expert;
        table->Add(Expert(i, group, e, "up"), {f, d}, normal).expert = expert;
        table->Add(Expert(i, group, e, "down"), {d, f}, normal).expert = expert;
      }
    }
  }
  void Bind(const ParamTable& table) override {
    for (int i = 0; i < c_.num_hidden_layers; ++i) {
      if (!shard_.OwnsLayer(c_, i)) continue;
      Layer& L = layers_[i];
      L.router = table.Offset(Router(i));
      L.experts.clear();
      L.shared.clear();
      for (int e = e0_; e < e0_ + el_; ++e) {
        L.experts.push_back(table.Offset(Expert(i, "experts", e, "gate")));
      }
      for (int e = 0; e < m_.num_shared_experts; ++e) {
        L.shared.push_back(table.Offset(Expert(i, "shared_experts", e, "gate")));
      }
    }
  }
  absl::Status Resize(int b, int t) override {
    b_ = b;
    t_ = t;
    const size_t n = static_cast<size_t>(b) * t;
    for (Layer& L : layers_) {
      L.logits.resize(n * e_);
      L.probs.resize(n * e_);
      L.lse.resize(n);
      L.sel.resize(n * k_);
      L.counts.resize(e_);
      L.send_slots.resize(n * k_);
      L.row_of_slot.resize(n * k_);
      L.fraction.resize(static_cast<size_t>(b) * e_);
      L.weight.resize(n * k_);
      L.expert_acts.resize(el_);
      L.expert_in.resize(el_);
      L.shared_acts.resize(m_.num_shared_experts);
      for (auto& a : L.shared_acts) a.Resize(MlpDims{static_cast<int>(n), d_, f_});
    }
    shared_out_.resize(n * d_);
    dlogits_.resize(n * e_);
    dweight_.resize(n * k_);
    plan_counts_.resize(e_);
    return absl::OkStatus();
  }

  absl::StatusOr<double> Forward(int i, const Weights<B>& w, const T* z, T* out) override {
    Layer& L = layers_[i];
    const int n = b_ * t_;
    T* p = const_cast<T*>(w.compute);
    SATDAR_RETURN_IF_ERROR(
        layers_internal::LinearForwardAcc(x_, L.logits.data(), z, p + L.router, n, e_, d_));
    // Softmax, top-k (ties to the lower index) and the plan: slots in (expert, token) order.
    SATDAR_RETURN_IF_ERROR(ops::MoeRoute(x_, L.probs.data(), L.lse.data(), L.sel.data(),
                                         L.weight.data(), L.logits.data(), n, e_, k_,
                                         m_.norm_topk_prob));
    SATDAR_RETURN_IF_ERROR(ops::MoePlan(x_, plan_counts_.data(), L.send_slots.data(),
                                        L.row_of_slot.data(), L.sel.data(), n, e_, k_));
    // f_e^b (a count: it carries no gradient), the sequence-wise aux loss and the z-loss (from
    // probs, lse and sel only: here so that the two reads back below wait once).
    loss_.assign(1, 0.0);
    if (loss_.size() != 1) {  // a device allocation failed (the AllocScope has the cause)
      return absl::ResourceExhaustedError("MoE: could not allocate the loss accumulator");
    }
    SATDAR_RETURN_IF_ERROR(ops::MoeRouterLoss(x_, loss_.data(), L.fraction.data(),
                                              L.probs.data(), L.lse.data(), L.sel.data(), b_, t_,
                                              e_, k_, m_.router_aux_loss_coef,
                                              m_.router_z_loss_coef, 1.0));
    // Host reads: the counts (dispatch and stats) and the loss, through ops::Download (on the
    // CPU plain copies; on a device one wait for the stream, then a copy with nothing queued).
    SATDAR_RETURN_IF_ERROR(ops::Download(x_, L.counts.data(), plan_counts_.data(), e_));
    double loss = 0;
    SATDAR_RETURN_IF_ERROR(ops::Download(x_, &loss, loss_.data(), 1));
    if (!recomputing_) {  // a recomputed forward was counted already
      for (int e = 0; e < e_; ++e) load_[i][e] += L.counts[e];
    }
    // Dispatch: every routed (token, choice) slot, in (expert, token) order, to the rank that
    // holds its expert; the experts run on what arrives; the outputs come back in the same
    // order (dropless: every slot is computed).
    SATDAR_RETURN_IF_ERROR(Dispatch(&L));
    const int rows = n * k_;
    Vec<T> xsend, xrecv;
    SATDAR_RETURN_IF_ERROR(
        Allocate<B>(x_, [&] { xsend.resize(static_cast<size_t>(rows) * d_); }));
    SATDAR_RETURN_IF_ERROR(ops::MoePermute(x_, xsend.data(), z, L.send_slots.data(), rows, k_, d_));
    SATDAR_RETURN_IF_ERROR(Exchange(std::move(xsend), &xrecv, L.send_rows, L.recv_rows));
    Vec<T> yrecv;
    SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] { yrecv.resize(xrecv.size()); }));
    for (int j = 0; j < el_; ++j) {
      int ne = 0;
      SATDAR_RETURN_IF_ERROR(GatherExpert(L, j, xrecv, &L.expert_in[j], &ne));
      if (ne == 0) continue;
      MlpDims dims{ne, d_, f_};
      Vec<T> ye;
      SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] {
        L.expert_acts[j].Resize(dims);
        ye.resize(static_cast<size_t>(ne) * d_);
      }));
      SATDAR_RETURN_IF_ERROR(MlpForward(x_, ye.data(), &L.expert_acts[j], L.expert_in[j].data(),
                                        ExpertWeights(p, L.experts[j]), dims));
      SATDAR_RETURN_IF_ERROR(ScatterExpert(L, j, ye, &yrecv));
    }
    SATDAR_RETURN_IF_ERROR(Exchange(std::move(yrecv), &L.slot_out, L.recv_rows, L.send_rows));
    // Combine, in (expert, token) order.
    SATDAR_RETURN_IF_ERROR(ops::MoeCombine(x_, out, L.slot_out.data(), L.weight.data(),
                                           L.row_of_slot.data(), n, k_, d_));
    for (int s = 0; s < m_.num_shared_experts; ++s) {
      SATDAR_RETURN_IF_ERROR(MlpForward(x_, shared_out_.data(), &L.shared_acts[s], z,
                                        ExpertWeights(p, L.shared[s]), MlpDims{n, d_, f_}));
      SATDAR_RETURN_IF_ERROR(ops::AddTo(x_, out, shared_out_.data(),
                                        static_cast<int64_t>(shared_out_.size())));
    }
    return loss;
  }

  absl::Status Backward(int i, const Weights<B>& w, Acc* grads, const T* z, const T* dout,
                        T* dz, double loss_scale) override {
    Layer& L = layers_[i];
    const int n = b_ * t_;
    T* p = const_cast<T*>(w.compute);
    SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] { scratch_.Resize(MlpDims{n, d_, f_}); }));
    for (int s = 0; s < m_.num_shared_experts; ++s) {
      SATDAR_RETURN_IF_ERROR(MlpBackward(x_, dz, ExpertWeights(grads, L.shared[s]), dout,
                                         L.shared_acts[s], z, ExpertWeights(p, L.shared[s]),
                                         MlpDims{n, d_, f_}, &scratch_));
    }
    SATDAR_RETURN_IF_ERROR(ops::Zero(x_, dweight_.data(), static_cast<int64_t>(dweight_.size())));
    // The slots' output gradients go to their experts' ranks and the input gradients come back.
    const int rows = n * k_;
    Vec<T> dysend, dyrecv;
    SATDAR_RETURN_IF_ERROR(
        Allocate<B>(x_, [&] { dysend.resize(static_cast<size_t>(rows) * d_); }));
    SATDAR_RETURN_IF_ERROR(ops::MoeCombineBackward(x_, dysend.data(), dweight_.data(), dout,
                                                   L.slot_out.data(), L.weight.data(),
                                                   L.send_slots.data(), rows, k_, d_));
    SATDAR_RETURN_IF_ERROR(Exchange(std::move(dysend), &dyrecv, L.send_rows, L.recv_rows));
    Vec<T> dxrecv, dy, dxe;
    SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] { dxrecv.resize(dyrecv.size()); }));
    for (int j = 0; j < el_; ++j) {
      int ne = 0;
      SATDAR_RETURN_IF_ERROR(GatherExpert(L, j, dyrecv, &dy, &ne));
      if (ne == 0) continue;
      MlpDims dims{ne, d_, f_};
      SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] {
        scratch_.Resize(dims);
        dxe.assign(static_cast<size_t>(ne) * d_, T(0));
      }));
      SATDAR_RETURN_IF_ERROR(MlpBackward(x_, dxe.data(), ExpertWeights(grads, L.experts[j]),
                                         dy.data(), L.expert_acts[j], L.expert_in[j].data(),
                                         ExpertWeights(p, L.experts[j]), dims, &scratch_));
      SATDAR_RETURN_IF_ERROR(ScatterExpert(L, j, dxe, &dxrecv));
    }
    Vec<T> dxsend;
    SATDAR_RETURN_IF_ERROR(Exchange(std::move(dxrecv), &dxsend, L.recv_rows, L.send_rows));
    SATDAR_RETURN_IF_ERROR(
        ops::MoePermuteBackward(x_, dz, dxsend.data(), L.row_of_slot.data(), n, k_, d_));
    // d loss / d router probabilities, then through the softmax to the logits.
    const double aux_coef = loss_scale * m_.router_aux_loss_coef * e_ / (b_ * static_cast<double>(t_));
    const double z_coef = loss_scale * m_.router_z_loss_coef * 2.0 / n;
    SATDAR_RETURN_IF_ERROR(ops::MoeRouteBackward(
        x_, dlogits_.data(), L.probs.data(), L.lse.data(), L.sel.data(), L.weight.data(),
        dweight_.data(), L.fraction.data(), b_, t_, e_, k_, m_.norm_topk_prob, aux_coef, z_coef));
    SATDAR_RETURN_IF_ERROR(layers_internal::LinearBackward(x_, dz, grads + L.router,
                                                           dlogits_.data(), z, p + L.router, n,
                                                           e_, d_, /*overwrite=*/false));
    return absl::OkStatus();
  }

  void SetRecomputing(bool on) override { recomputing_ = on; }
  void AppendStats(nlohmann::json* stats) const override {
    (*stats)["moe_expert_load"] = load_;  // [layer][expert]: tokens routed since the last reset
    (*stats)["moe_dropped_tokens"] = 0;   // dropless routing
  }
  void ResetStats() override {
    for (auto& l : load_) std::fill(l.begin(), l.end(), 0);
  }

 private:
  struct Layer {
    int64_t router = -1;
    std::vector<int64_t> experts, shared;  // offsets of each expert's gate_proj
    Vec<Acc> logits, probs, lse, weight;  // the routing values (B::Acc, as the moe ops)
    Vec<int> sel;                          // (N, k) chosen experts
    // Dispatch plan: counts (E) slots routed to each expert (on the host, read back from
    // plan_counts_); send_slots (N*k)
    // every slot in (expert, token) order and row_of_slot (N*k) its inverse; rows sent to /
    // received from each EP rank; recv_count[src * el + j]: rows of local expert j from rank
    // src.
    std::vector<int> counts;
    Vec<int> send_slots, row_of_slot;
    std::vector<size_t> send_rows, recv_rows;
    std::vector<int64_t> recv_count;
    std::vector<Vec<T>> expert_in;  // per local expert: its input rows
    Vec<T> slot_out;                // per sent slot: its expert's output
    Vec<Fraction> fraction;         // (B, E): f_e^b (double on the CPU, fp32 on CUDA)
    std::vector<MlpActs<B>> expert_acts, shared_acts;
  };

  template <typename U>
  MlpWeights<U> ExpertWeights(U* base, int64_t gate) const {
    const int64_t size = static_cast<int64_t>(f_) * d_;
    return {base + gate, base + gate + size, base + gate + 2 * size};
  }
  // The dispatch plan of the last MoePlan: which slots go to which rank, and how many rows
  // of each local expert arrive from each rank (exchanged over the EP group).
  absl::Status Dispatch(Layer* L) {
    const int ep = shard_.ep_size;
    L->send_rows.assign(ep, 0);
    std::vector<int64_t> send_count(e_);
    for (int e = 0; e < e_; ++e) {
      send_count[e] = L->counts[e];
      L->send_rows[e / el_] += L->counts[e];
    }
    L->recv_count.assign(static_cast<size_t>(ep) * el_, 0);
    if (ep == 1) {
      L->recv_count = send_count;
    } else if constexpr (B::kDevice) {
      // A device communicator moves device memory: the counts go as doubles (exact).
      const std::vector<size_t> each(ep, el_);
      std::vector<double> sent(send_count.begin(), send_count.end()), got(sent.size());
      Vec<double> dsent, dgot;
      SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] {
        dsent.resize(sent.size());
        dgot.resize(got.size());
      }));
      SATDAR_RETURN_IF_ERROR(
          ops::Upload(x_, dsent.data(), sent.data(), static_cast<int64_t>(sent.size())));
      EpAllToAllV(shard_, dsent.data(), each, dgot.data(), each);
      SATDAR_RETURN_IF_ERROR(
          ops::Download(x_, got.data(), dgot.data(), static_cast<int64_t>(got.size())));
      for (size_t i = 0; i < got.size(); ++i) L->recv_count[i] = static_cast<int64_t>(got[i]);
    } else {
      Collective(shard_, shard_.ep->AllToAllV(send_count.data(), std::vector<size_t>(ep, el_),
                                              L->recv_count.data(), std::vector<size_t>(ep, el_),
                                              core::DType::kI64, shard_.collective));
    }
    L->recv_rows.assign(ep, 0);
    for (int src = 0; src < ep; ++src) {
      for (int j = 0; j < el_; ++j) L->recv_rows[src] += L->recv_count[src * el_ + j];
    }
    return absl::OkStatus();
  }
  // Rows (send_rows[q] to rank q) to rows (recv_rows[q] from rank q), over the EP group.
  // With one EP rank the rows stay where they are (moved, not copied).
  absl::Status Exchange(Vec<T>&& in, Vec<T>* out, const std::vector<size_t>& send_rows,
                        const std::vector<size_t>& recv_rows) {
    if (shard_.ep_size == 1) {
      *out = std::move(in);
      return absl::OkStatus();
    }
    size_t total = 0;
    for (size_t r : recv_rows) total += r;
    SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] { out->assign(total * d_, T(0)); }));
    std::vector<size_t> sc(send_rows.size()), rc(recv_rows.size());
    for (size_t q = 0; q < sc.size(); ++q) sc[q] = send_rows[q] * d_;
    for (size_t q = 0; q < rc.size(); ++q) rc[q] = recv_rows[q] * d_;
    EpAllToAllV(shard_, in.data(), sc, out->data(), rc);
    return absl::OkStatus();
  }
  // Local expert j's rows of a received buffer (every source rank's, in rank order); their
  // count (*ne). One copy per source rank.
  absl::Status GatherExpert(const Layer& L, int j, const Vec<T>& recv, Vec<T>* out,
                            int* ne) const {
    size_t total = 0;
    for (int src = 0; src < shard_.ep_size; ++src) total += L.recv_count[src * el_ + j];
    SATDAR_RETURN_IF_ERROR(Allocate<B>(x_, [&] { out->assign(total * d_, T(0)); }));
    size_t row = 0, taken = 0;
    for (int src = 0; src < shard_.ep_size; ++src) {
      for (int jj = 0; jj < el_; ++jj) {
        const size_t cnt = L.recv_count[src * el_ + jj];
        if (jj == j) {
          SATDAR_RETURN_IF_ERROR(ops::Copy(x_, out->data() + taken * d_, recv.data() + row * d_,
                                           static_cast<int64_t>(cnt * d_)));
          taken += cnt;
        }
        row += cnt;
      }
    }
    *ne = static_cast<int>(total);
    return absl::OkStatus();
  }
  // The inverse of GatherExpert: local expert j's rows back into a received-layout buffer.
  absl::Status ScatterExpert(const Layer& L, int j, const Vec<T>& rows, Vec<T>* recv) const {
    size_t row = 0, taken = 0;
    for (int src = 0; src < shard_.ep_size; ++src) {
      for (int jj = 0; jj < el_; ++jj) {
        const size_t cnt = L.recv_count[src * el_ + jj];
        if (jj == j) {
          SATDAR_RETURN_IF_ERROR(ops::Copy(x_, recv->data() + row * d_, rows.data() + taken * d_,
                                           static_cast<int64_t>(cnt * d_)));
          taken += cnt;
        }
        row += cnt;
      }
    }
    return absl::OkStatus();
  }
  const ModelConfig c_;
  const MoeConfig m_;
  const Sharding shard_;
  const int d_, e_, k_, f_, el_, e0_;
  const typename B::Exec x_;
  std::vector<Layer> layers_;
  int b_ = 0, t_ = 0;
  Vec<T> shared_out_, dlogits_;
  Vec<Acc> dweight_;
  Vec<int> plan_counts_;  // (E): MoePlan's counts, read back into a layer's counts
  Vec<double> loss_;      // (1): MoeRouterLoss's accumulator, read back by Forward
  MlpScratch<B> scratch_;
  std::vector<std::vector<int64_t>> load_;
  bool recomputing_ = false;
};

}  // namespace

void AddMoeParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                  ParamTable* table) {
  Moe<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<FfnT<B>> MakeMoe(const ModelConfig& config, const Sharding& shard,
                                 const typename B::Exec& x) {
  return std::make_unique<Moe<B>>(config, shard, x);
}

template std::unique_ptr<FfnT<Cpu<float>>> MakeMoe<Cpu<float>>(const ModelConfig&,
                                                               const Sharding&,
                                                               const core::CpuExec&);
template std::unique_ptr<FfnT<Cpu<double>>> MakeMoe<Cpu<double>>(const ModelConfig&,
                                                                 const Sharding&,
                                                                 const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<FfnT<Cuda<float>>> MakeMoe<Cuda<float>>(const ModelConfig&,
                                                                 const Sharding&,
                                                                 const core::CudaExec&);
template std::unique_ptr<FfnT<Cuda<__nv_bfloat16>>> MakeMoe<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
