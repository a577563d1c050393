#include "model/variants/attnres.h"

#include <string>
#include <vector>

#include "core/check.h"
#include "model/ops.h"
#include "model/variants/depth_retrieval_ops.h"
#include "model/variants/depth_sources.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

// u = sum_i alpha_i X_i over the sources (depth_sources.h), alpha per token: the softmax of a
// learned pseudo-query's dot products with the sources' RMSNorm (depth_retrieval_ops.h).
template <class B>
class AttnRes final : public DepthSourcesTopology<B, AttnRes<B>> {
  using Base = DepthSourcesTopology<B, AttnRes<B>>;
  friend Base;

 public:
  using typename Base::Acc;
  using typename Base::T;

  AttnRes(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : Base(c, shard, x), eps_(c.rms_norm_eps), query_(sublayers_ + 1, -1),
        norm_(sublayers_ + 1, -1) {}

  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    (void)shard;
    if (place == ParamPlace::kLayer) {
      for (int l : {2 * i + 1, 2 * i + 2}) AddRetrieval(Prefix(l), c.hidden_size, table);
    } else if (place == ParamPlace::kFinal) {
      AddRetrieval(Prefix(0), c.hidden_size, table);
    }
  }
  void Bind(const ParamTable& table) override {
    for (int l = 1; l <= sublayers_ + 1; ++l) {
      if (!Owned(l)) continue;
      std::string p = Prefix(l == sublayers_ + 1 ? 0 : l);
      query_[l - 1] = table.Offset(p + ".query");
      norm_[l - 1] = table.Offset(p + ".norm.weight");
    }
  }

 private:
  using Base::d_;
  using Base::grads_;
  using Base::inputs_;
  using Base::Owned;
  using Base::Prefix;
  using Base::rows_;
  using Base::sublayers_;
  using Base::x_;
  using typename Base::Step;

  // [sublayer 1..2L, final][source: embedding, blocks..., partial], the mean over the tokens.
  static constexpr char kStatsKey[] = "attnres_depth_weights";
  static constexpr bool kWeightsPerToken = true;  // alpha (N, sources)
  static constexpr double kInitialWeight = 0.0;

  static void AddRetrieval(const std::string& prefix, int64_t d, ParamTable* table) {
    table->Add(prefix + ".query", {d}, ParamInit::Constant(0.0));
    table->Add(prefix + ".norm.weight", {d}, ParamInit::Constant(1.0));
  }
  absl::Status MixForward(const Weights<B>& w, int l, Step& s, T* u) {
    SATDAR_RETURN_IF_ERROR(this->PublishInputs(s));
    return ops::DepthRetrievalForward(
        x_, u, s.weights.data(), inputs_.data(), inputs_.data(),
        static_cast<int>(inputs_.size()), w.compute + query_[l - 1], w.compute + norm_[l - 1],
        rows_, d_, eps_);
  }
  // The sources are the keys and the values: their gradients go to one list.
  absl::Status MixBackward(const Weights<B>& w, Acc* grads, int l, const Step& s, const T* dout) {
    SATDAR_RETURN_IF_ERROR(this->PublishLists(s));
    return ops::DepthRetrievalBackward(
        x_, grads_.data(), grads_.data(), grads + query_[l - 1], grads + norm_[l - 1], dout,
        s.weights.data(), inputs_.data(), inputs_.data(), static_cast<int>(inputs_.size()),
        w.compute + query_[l - 1], w.compute + norm_[l - 1], rows_, d_, eps_);
  }

  const double eps_;
  std::vector<int64_t> query_, norm_;  // per sublayer 1..2L, then the final readout
};

}  // namespace

void AddAttnResParams(const ModelConfig& config, const Sharding& shard, ParamPlace place, int layer,
                      ParamTable* table) {
  AttnRes<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<TopologyT<B>> MakeAttnRes(const ModelConfig& config, const Sharding& shard,
                                          const typename B::Exec& x) {
  return std::make_unique<AttnRes<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeAttnRes<Cpu<float>>(const ModelConfig&,
                                                                        const Sharding&,
                                                                        const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeAttnRes<Cpu<double>>(const ModelConfig&,
                                                                          const Sharding&,
                                                                          const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeAttnRes<Cuda<float>>(const ModelConfig&,
                                                                          const Sharding&,
                                                                          const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeAttnRes<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
