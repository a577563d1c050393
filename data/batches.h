// data/batches.h: where each training sequence comes from.
//
// Sequence j (global index across data-parallel ranks) of step s is a pure function of
// (seed, s, j), for synthetic tokens and for windows of a corpus alike. A resumed run
// therefore sees exactly the batches it would have seen, and every parallel layout sees the
// same global batch.
#ifndef SATDAR_DATA_BATCHES_H_
#define SATDAR_DATA_BATCHES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace satdar::data {

// Which sequence to produce: index j of the global batch of optimizer step `step`, which is
// sample number `sample` counted over the whole run (samples consumed before it, by every
// data-parallel rank). Sources keyed by (step, j) ignore `sample` and vice versa.
struct SampleKey {
  int64_t step = 0;
  int64_t j = 0;
  int64_t sample = 0;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Writes seq_len + 1 token ids into out.
  virtual void Sequence(const SampleKey& key, int seq_len, int32_t* out) const = 0;
  // Fills (count, seq_len + 1) with sequences j = first_j .. of `step`, whose first sample
  // number is first_sample.
  void Batch(int64_t step, int64_t first_j, int64_t first_sample, int count, int seq_len,
             int32_t* out) const;
};

// Uniformly random ids in [0, vocab).
class SyntheticBatches : public BatchSource {
 public:
  SyntheticBatches(uint64_t seed, int vocab) : seed_(seed), vocab_(vocab) {}
  void Sequence(const SampleKey& key, int seq_len, int32_t* out) const override;

 private:
  uint64_t seed_;
  int vocab_;
};

// Windows of seq_len + 1 bytes starting at keyed random offsets of a byte stream.
class CorpusWindows : public BatchSource {
 public:
  // REQUIRES: tokens->size() > seq_len + 1 (checked by the caller with a message).
  CorpusWindows(uint64_t seed, std::shared_ptr<const std::vector<uint8_t>> tokens)
      : seed_(seed), tokens_(std::move(tokens)) {}
  void Sequence(const SampleKey& key, int seq_len, int32_t* out) const override;

 private:
  uint64_t seed_;
  std::shared_ptr<const std::vector<uint8_t>> tokens_;
};

struct SourceOptions {
  bool synthetic = false;
  // A prepared dataset (satdar prep; its training split), or a folder of raw text read as
  // byte-level tokens.
  std::string dir;
  std::string format = "auto";  // auto | text | brown
  uint64_t seed = 0;
  int vocab_size = 0;
  int seq_len = 0;
  // What the caller calls `dir` and `seq_len` in its messages (the command line: its flags).
  std::string dir_name = "data folder";
  std::string seq_len_name = "the sequence length";
};

// Synthetic tokens, a prepared dataset's training split, or windows of raw text in
// options.dir. Errors (a folder that cannot be read, a corrupted shard, no text, a vocabulary
// too small for bytes, data shorter than one sequence) are InvalidArgument and name --data.
// `description` (optional) says what was loaded.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const SourceOptions& options,
                                                             std::string* description);

}  // namespace satdar::data

#endif  // SATDAR_DATA_BATCHES_H_
