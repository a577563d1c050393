#include "data/stream.h"

namespace satdar::data {

BatchStream::BatchStream(const BatchSource* source, const StreamLayout& layout, int depth)
    : source_(source), layout_(layout), depth_(depth < 1 ? 1 : depth) {
  thread_ = std::thread([this] { Produce(); });
}

BatchStream::~BatchStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchStream::Produce() {
  const StreamLayout& l = layout_;
  const int micro = l.batch_per_rank / l.microbatches;
  const int64_t global = static_cast<int64_t>(l.batch_per_rank) * l.world;
  for (int64_t step = l.first_step;; ++step) {
    const int64_t step_sample = l.first_sample + (step - l.first_step) * global;
    for (int m = 0; m < l.microbatches; ++m) {
      const int64_t j = static_cast<int64_t>(l.rank) * l.batch_per_rank + m * micro;
      std::vector<int32_t> batch(static_cast<size_t>(micro) * (l.seq_len + 1));
      source_->Batch(step, j, step_sample + j, micro, l.seq_len, batch.data());
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(ready_.size()) < depth_; });
      if (stop_) return;
      ready_.push_back(std::move(batch));
      cv_.notify_all();
    }
  }
}

void BatchStream::Next(std::vector<int32_t>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty(); });
  *out = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();
}

}  // namespace satdar::data
