#include "model/variants/standard.h"

#include <vector>

#include "core/check.h"
#include "model/ops.h"

#if defined(SATDAR_WITH_CUDA)
#include <cuda_bf16.h>
#endif

namespace satdar::model {

namespace {

template <class B>
class Standard : public TopologyT<B> {
 public:
  using T = typename B::T;
  using Acc = typename B::Acc;
  template <typename U>
  using Vec = typename B::template Vec<U>;

  // The stream is replicated over TP ranks; a pipeline stage keeps only its own sublayers'.
  Standard(const ModelConfig& c, const Sharding& shard, const typename B::Exec& x)
      : sublayers_(2 * c.num_hidden_layers), d_(c.hidden_size), x_(x),
        first_(2 * shard.first_layer(c) + 1), last_(2 * shard.end_layer(c)) {}

  absl::Status Resize(int rows) override {
    const size_t nc = static_cast<size_t>(rows) * d_;
    stream_.assign(sublayers_ + 1, Vec<T>());
    for (int l = first_ - 1; l <= last_; ++l) stream_[l].resize(nc);
    y_.resize(nc);
    dy_.resize(nc);
    return absl::OkStatus();
  }

  // A stage boundary carries the one stream h.
  int BoundaryTensors(int l) const override { (void)l; return 1; }

  absl::Status ForwardRange(const Weights<B>& w, int first, int last, const T* h0,
                            const std::vector<const T*>& in, BranchesT<B>* br, T* x_final,
                            const std::vector<T*>& out) override {
    (void)w;
    const int64_t n = static_cast<int64_t>(y_.size());
    const T* start = first == 1 ? h0 : in[0];
    SATDAR_RETURN_IF_ERROR(ops::Copy(x_, stream_[first - 1].data(), start, n));
    for (int l = first; l <= last; ++l) {
      SATDAR_RETURN_IF_ERROR(br->Forward(l, stream_[l - 1].data(), y_.data()));
      SATDAR_RETURN_IF_ERROR(
          ops::Add(x_, stream_[l].data(), stream_[l - 1].data(), y_.data(), n));
    }
    T* end = last == sublayers_ ? x_final : out[0];
    SATDAR_RETURN_IF_ERROR(ops::Copy(x_, end, stream_[last].data(), n));
    return absl::OkStatus();
  }

  absl::Status BackwardRange(const Weights<B>& w, Acc* grads, int first, int last,
                             const T* dx_final, const std::vector<const T*>& dout,
                             BranchesT<B>* br, T* dh0, const std::vector<T*>& din) override {
    (void)w, (void)grads;
    const int64_t n = static_cast<int64_t>(y_.size());
    // dh carries d loss / d h_l down the stream; each branch adds its path.
    T* dh = first == 1 ? dh0 : din[0];
    const T* top = last == sublayers_ ? dx_final : dout[0];
    SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dh, top, n));
    for (int l = last; l >= first; --l) {
      SATDAR_RETURN_IF_ERROR(ops::Copy(x_, dy_.data(), dh, n));
      SATDAR_RETURN_IF_ERROR(br->Backward(l, stream_[l - 1].data(), dy_.data(), dh));
    }
    return absl::OkStatus();
  }

 private:
  const int sublayers_, d_;
  const typename B::Exec x_;
  const int first_, last_;  // this pipeline stage's sublayers
  std::vector<Vec<T>> stream_;  // stream_[l] = h after sublayer l; stream_[0] = h0
  Vec<T> y_, dy_;
};

}  // namespace

template <class B>
std::unique_ptr<TopologyT<B>> MakeStandard(const ModelConfig& config, const Sharding& shard,
                                           const typename B::Exec& x) {
  return std::make_unique<Standard<B>>(config, shard, x);
}

template std::unique_ptr<TopologyT<Cpu<float>>> MakeStandard<Cpu<float>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
template std::unique_ptr<TopologyT<Cpu<double>>> MakeStandard<Cpu<double>>(
    const ModelConfig&, const Sharding&, const core::CpuExec&);
#if defined(SATDAR_WITH_CUDA)
template std::unique_ptr<TopologyT<Cuda<float>>> MakeStandard<Cuda<float>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
template std::unique_ptr<TopologyT<Cuda<__nv_bfloat16>>> MakeStandard<Cuda<__nv_bfloat16>>(
    const ModelConfig&, const Sharding&, const core::CudaExec&);
#endif

}  // namespace satdar::model
