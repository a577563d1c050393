#include "model/variants/transparent.h"

#include <string>
#include <vector>

#include "core/check.h"
#include "model/ops.h"
#include "model/variants/denseformer_ops.h"
#include "model/variants/depth_sources.h"
#include "model/variants/transparent_ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

// u = sum_i softmax(z_l)_i X_i over the sources (depth_sources.h): DenseFormer's weighted sum
// (denseformer_ops.h) over the softmax of the sublayer's logits (transparent_ops.h).
template <class B>
class Transparent final : public DepthSourcesTopology<B, Transparent<B>> {
  using Base = DepthSourcesTopology<B, Transparent<B>>;
  friend Base;

 public:
  using typename Base::Acc;
  using typename Base::T;

  Transparent(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : Base(c, shard, x), logits_(sublayers_ + 1, -1) {}

  // |X| at step l (1..2L, 2L + 1 the final readout): h0, the blocks completed before it, and
  // the partial sum when its block has begun.
  static int Sources(int l, int block) {
    return 1 + (l - 1) / block + ((l - 1) % block != 0 ? 1 : 0);
  }
  static void AddParams(const ModelConfig& c, const Sharding& shard, ParamPlace place, int i,
                        ParamTable* table) {
    (void)shard;
    const int block = c.block_size > 0 ? c.block_size : 1;
    if (place == ParamPlace::kLayer) {
      // Layer 0's attention reads h0 alone and has no logits.
      for (int l : {2 * i + 1, 2 * i + 2}) {
        if (l > 1) AddLogits(Prefix(l), Sources(l, block), table);
      }
    } else if (place == ParamPlace::kFinal) {
      AddLogits(Prefix(0), Sources(2 * c.num_hidden_layers + 1, block), table);
    }
  }
  void Bind(const ParamTable& table) override {
    for (int l = 2; l <= sublayers_ + 1; ++l) {
      if (!Owned(l)) continue;
      logits_[l - 1] = table.Offset(Prefix(l == sublayers_ + 1 ? 0 : l) + ".logits");
    }
  }

 private:
  using Base::dsources_;
  using Base::grads_;
  using Base::inputs_;
  using Base::Owned;
  using Base::Prefix;
  using Base::sources_;
  using Base::sublayers_;
  using Base::x_;
  using typename Base::Step;

  // [sublayer 1..2L, final][source: embedding, blocks..., partial]: softmax(z_l), the mean
  // over the passes since the last ResetStats (the weights change with every step).
  static constexpr char kStatsKey[] = "transparent_depth_weights";
  static constexpr bool kWeightsPerToken = false;  // softmax(z_l): one row
  // 1: the weight of h0 at the first sublayer, which has no logits (for the statistics).
  static constexpr double kInitialWeight = 1.0;

  static void AddLogits(const std::string& prefix, int64_t count, ParamTable* table) {
    table->Add(prefix + ".logits", {count}, ParamInit::Constant(0.0));  // uniform at init
  }
  void ResizeMix(int max_sources) { dweights_.assign(max_sources, Acc(0)); }
  // s.weights <- softmax(z_l) (B::Acc, the master weights' type), then the weighted sum.
  absl::Status MixForward(const Weights<B>& w, int l, Step& s, T* u) {
    const int64_t n = this->Elements();
    const int count = s.count();
    if (count == 1) return ops::Copy(x_, u, sources_[0], n);  // h0 as it is
    SATDAR_RETURN_IF_ERROR(this->PublishInputs(s));
    SATDAR_RETURN_IF_ERROR(
        ops::DepthSoftmaxForward(x_, s.weights.data(), w.master + logits_[l - 1], count));
    return ops::DwaForward(x_, u, inputs_.data(), count, s.weights.data(), n);
  }
  // d/d(sources) += a_i dout; d/dz_l by the softmax's backward of <X_i, dout>. The backward
  // reads the softmax weights its forward kept, not w.
  absl::Status MixBackward(const Weights<B>& /*w*/, Acc* grads, int l, const Step& s,
                           const T* dout) {
    const int64_t n = this->Elements();
    const int count = s.count();
    if (count == 1) return ops::AddTo(x_, dsources_[0].data(), dout, n);
    SATDAR_RETURN_IF_ERROR(this->PublishLists(s));
    SATDAR_RETURN_IF_ERROR(ops::Zero(x_, dweights_.data(), count));
    SATDAR_RETURN_IF_ERROR(ops::DwaBackward(x_, grads_.data(), dweights_.data(), dout,
                                            inputs_.data(), count, s.weights.data(), n));
    return ops::DepthSoftmaxBackward(x_, grads + logits_[l - 1], s.weights.data(),
                                     dweights_.data(), count);
  }

  std::vector<int64_t> logits_;  // per sublayer 2..2L, then the final readout
  typename Base::template Vec<Acc> dweights_;  // d/d softmax(z_l) of the step differentiated
};

}  // namespace

void AddTransparentParams(const ModelConfig& config, const Sharding& shard, ParamPlace place,
                          int layer, ParamTable* table) {
  Transparent<Cpu<float>>::AddParams(config, shard, place, layer, table);
}

template <class B>
std::unique_ptr<TopologyT<B>> MakeTransparent(const ModelConfig& config, const Sharding& shard,
                                              const typename B::Exec& x) {
  return std::make_unique<Transparent<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeTransparent<Cpu<float>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeTransparent<Cpu<double>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeTransparent<Cuda<float>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeTransparent<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
