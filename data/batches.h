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

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Writes sequence j of step s: seq_len + 1 token ids into out.
  virtual void Sequence(int64_t step, int64_t j, int seq_len, int32_t* out) const = 0;
  // Fills (count, seq_len + 1) with sequences first_j .. first_j + count - 1 of `step`.
  void Batch(int64_t step, int64_t first_j, int count, int seq_len, int32_t* out) const;
};

// Uniformly random ids in [0, vocab).
class SyntheticBatches : public BatchSource {
 public:
  SyntheticBatches(uint64_t seed, int vocab) : seed_(seed), vocab_(vocab) {}
  void Sequence(int64_t step, int64_t j, int seq_len, int32_t* out) const override;

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
  void Sequence(int64_t step, int64_t j, int seq_len, int32_t* out) const override;

 private:
  uint64_t seed_;
  std::shared_ptr<const std::vector<uint8_t>> tokens_;
};

struct SourceOptions {
  bool synthetic = false;
  std::string dir;             // a folder of text (byte-level tokens) when not synthetic
  std::string format = "auto";  // auto | text | brown
  uint64_t seed = 0;
  int vocab_size = 0;
  int seq_len = 0;
};

// Synthetic tokens, or windows of the corpus in options.dir. Errors (a folder that cannot be
// read, no text, a vocabulary too small for bytes, a corpus shorter than one sequence) are
// InvalidArgument and name --data. `description` (optional) says what was loaded.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const SourceOptions& options,
                                                             std::string* description);

}  // namespace satdar::data

#endif  // SATDAR_DATA_BATCHES_H_
