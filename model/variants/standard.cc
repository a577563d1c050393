#include "model/variants/standard.h"

#include <algorithm>
#include <vector>

namespace satdar::model {

namespace {

template <typename T>
class Standard : public Topology<T> {
 public:
  // The stream is replicated over TP ranks; a pipeline stage keeps only its own sublayers'.
  Standard(const ModelConfig& c, const Sharding& shard, core::ThreadPool* pool)
      : sublayers_(2 * c.num_hidden_layers), d_(c.hidden_size), pool_(pool),
        first_(2 * shard.first_layer(c) + 1), last_(2 * shard.end_layer(c)) {}

  void Resize(int rows) override {
    const size_t nc = static_cast<size_t>(rows) * d_;
    stream_.assign(sublayers_ + 1, std::vector<T>());
    for (int l = first_ - 1; l <= last_; ++l) stream_[l].resize(nc);
    y_.resize(nc);
    dy_.resize(nc);
  }

  // A stage boundary carries the one stream h.
  int BoundaryTensors(int l) const override { (void)l; return 1; }

  void ForwardRange(const T* params, int first, int last, const T* h0,
                    const std::vector<const T*>& in, Branches<T>* br, T* x_final,
                    const std::vector<T*>& out) override {
    (void)params;
    const T* start = first == 1 ? h0 : in[0];
    std::copy(start, start + y_.size(), stream_[first - 1].begin());
    for (int l = first; l <= last; ++l) {
      br->Forward(l, stream_[l - 1].data(), y_.data());
      Add(stream_[l].data(), stream_[l - 1].data(), y_.data());
    }
    T* end = last == sublayers_ ? x_final : out[0];
    std::copy(stream_[last].begin(), stream_[last].end(), end);
  }

  void BackwardRange(const T* params, T* grads, int first, int last, const T* dx_final,
                     const std::vector<const T*>& dout, Branches<T>* br, T* dh0,
                     const std::vector<T*>& din) override {
    (void)params, (void)grads;
    // dh carries d loss / d h_l down the stream; each branch adds its path.
    T* dh = first == 1 ? dh0 : din[0];
    const T* top = last == sublayers_ ? dx_final : dout[0];
    std::copy(top, top + y_.size(), dh);
    for (int l = last; l >= first; --l) {
      std::copy(dh, dh + y_.size(), dy_.begin());
      br->Backward(l, stream_[l - 1].data(), dy_.data(), dh);
    }
  }

 private:
  void Add(T* out, const T* a, const T* b) {
    pool_->ParallelFor(
        static_cast<int64_t>(y_.size()),
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
        },
        4096);
  }

  const int sublayers_, d_;
  core::ThreadPool* pool_;
  const int first_, last_;  // this pipeline stage's sublayers
  std::vector<std::vector<T>> stream_;  // stream_[l] = h after sublayer l; stream_[0] = h0
  std::vector<T> y_, dy_;
};

}  // namespace

template <typename T>
std::unique_ptr<Topology<T>> MakeStandard(const ModelConfig& config, const Sharding& shard, core::ThreadPool* pool) {
  return std::make_unique<Standard<T>>(config, shard, pool);
}

template std::unique_ptr<Topology<float>> MakeStandard<float>(const ModelConfig&, const Sharding&, core::ThreadPool*);
template std::unique_ptr<Topology<double>> MakeStandard<double>(const ModelConfig&, const Sharding&, core::ThreadPool*);

}  // namespace satdar::model
