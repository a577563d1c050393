#include "model/variants/standard.h"

#include <algorithm>
#include <vector>

namespace satdar::model {

namespace {

template <typename T>
class Standard : public Topology<T> {
 public:
  Standard(const ModelConfig& c, core::ThreadPool* pool)
      : sublayers_(2 * c.num_hidden_layers), d_(c.hidden_size), pool_(pool) {}

  void Resize(int rows) override {
    const size_t nc = static_cast<size_t>(rows) * d_;
    stream_.assign(sublayers_ + 1, std::vector<T>(nc));
    y_.resize(nc);
    dy_.resize(nc);
  }

  void Forward(const T* params, const T* h0, Branches<T>* br, T* x_final) override {
    (void)params;
    std::copy(h0, h0 + stream_[0].size(), stream_[0].begin());
    for (int l = 1; l <= sublayers_; ++l) {
      br->Forward(l, stream_[l - 1].data(), y_.data());
      Add(stream_[l].data(), stream_[l - 1].data(), y_.data());
    }
    std::copy(stream_.back().begin(), stream_.back().end(), x_final);
  }

  void Backward(const T* params, T* grads, const T* dx_final, Branches<T>* br, T* dh0) override {
    (void)params, (void)grads;
    // dh0 carries d loss / d h_l down the stream; each branch adds its path.
    std::copy(dx_final, dx_final + y_.size(), dh0);
    for (int l = sublayers_; l >= 1; --l) {
      std::copy(dh0, dh0 + y_.size(), dy_.begin());
      br->Backward(l, stream_[l - 1].data(), dy_.data(), dh0);
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
  std::vector<std::vector<T>> stream_;  // stream_[l] = h after sublayer l; stream_[0] = h0
  std::vector<T> y_, dy_;
};

}  // namespace

template <typename T>
std::unique_ptr<Topology<T>> MakeStandard(const ModelConfig& config, core::ThreadPool* pool) {
  return std::make_unique<Standard<T>>(config, pool);
}

template std::unique_ptr<Topology<float>> MakeStandard<float>(const ModelConfig&,
                                                              core::ThreadPool*);
template std::unique_ptr<Topology<double>> MakeStandard<double>(const ModelConfig&,
                                                                core::ThreadPool*);

}  // namespace satdar::model
