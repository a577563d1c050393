#include "data/batches.h"

#include "core/random.h"

namespace satdar::data {

namespace {
// Distinct random streams for the two sources.
constexpr uint64_t kSyntheticStream = 0x73796e7468657469ull;
constexpr uint64_t kWindowStream = 0x77696e646f777321ull;
}  // namespace

void BatchSource::Batch(int64_t step, int64_t first_j, int count, int seq_len,
                        int32_t* out) const {
  for (int i = 0; i < count; ++i) Sequence(step, first_j + i, seq_len, out + i * (seq_len + 1));
}

void SyntheticBatches::Sequence(int64_t step, int64_t j, int seq_len, int32_t* out) const {
  uint64_t stream = core::Mix64(kSyntheticStream ^ core::Mix64(step) ^ (core::Mix64(j) << 1));
  for (int p = 0; p <= seq_len; ++p) {
    out[p] = static_cast<int32_t>(core::RandomBits(seed_, stream, p) % vocab_);
  }
}

void CorpusWindows::Sequence(int64_t step, int64_t j, int seq_len, int32_t* out) const {
  uint64_t stream = core::Mix64(kWindowStream ^ core::Mix64(step));
  uint64_t span = tokens_->size() - (seq_len + 1) + 1;
  uint64_t start = core::RandomBits(seed_, stream, j) % span;
  for (int p = 0; p <= seq_len; ++p) out[p] = (*tokens_)[start + p];
}

}  // namespace satdar::data
