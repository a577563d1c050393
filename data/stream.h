// data/stream.h: the batches one data-parallel rank trains on, produced ahead of time by a
// background thread.
//
// The global batch of a step is world * batch_per_rank sequences; rank r takes sequences
// j = r * batch_per_rank .. of it, split into `microbatches` micro-batches. Sample numbers
// count every rank's sequences since the start of the run, so a run resumed at sample
// position P (saved in the checkpoint) continues exactly where it stopped, also with a
// different number of ranks (see docs/DATA.md).
#ifndef SATDAR_DATA_STREAM_H_
#define SATDAR_DATA_STREAM_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "data/batches.h"

namespace satdar::data {

struct StreamLayout {
  int seq_len = 0;
  int batch_per_rank = 0;
  int microbatches = 1;
  int rank = 0;
  int world = 1;
  int64_t first_step = 1;    // the step of the first batch
  int64_t first_sample = 0;  // samples consumed (by all ranks) before it
};

class BatchStream {
 public:
  // Prefetches up to `depth` micro-batches; source must outlive the stream.
  BatchStream(const BatchSource* source, const StreamLayout& layout, int depth = 4);
  ~BatchStream();
  BatchStream(const BatchStream&) = delete;
  BatchStream& operator=(const BatchStream&) = delete;

  // The next micro-batch: (batch_per_rank / microbatches, seq_len + 1) token ids.
  void Next(std::vector<int32_t>* out);

 private:
  void Produce();

  const BatchSource* source_;
  const StreamLayout layout_;
  const int depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<int32_t>> ready_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread thread_;
};

}  // namespace satdar::data

#endif  // SATDAR_DATA_STREAM_H_
