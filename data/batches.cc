#include "data/batches.h"

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "data/corpus.h"

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

absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const SourceOptions& o,
                                                             std::string* description) {
  if (o.synthetic) {
    if (description) *description = absl::StrCat("synthetic tokens, vocab ", o.vocab_size);
    return std::unique_ptr<BatchSource>(std::make_unique<SyntheticBatches>(o.seed, o.vocab_size));
  }
  auto format = ParseCorpusFormat(o.format);
  if (!format.ok()) return format.status();
  auto corpus = LoadCorpus(o.dir, *format);
  if (!corpus.ok()) return corpus.status();
  if (o.vocab_size < 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data: byte-level text needs vocab_size >= 256, the config has ", o.vocab_size));
  }
  if (corpus->bytes.size() < static_cast<size_t>(o.seq_len) + 2) {
    return absl::InvalidArgumentError(absl::StrCat("--data: ", o.dir, " holds ",
                                                   corpus->bytes.size(),
                                                   " bytes, fewer than --seq-len + 1"));
  }
  if (description) {
    *description = absl::StrCat(o.dir, ", ", corpus->num_files, " files, ", corpus->bytes.size(),
                                " bytes (",
                                corpus->format == CorpusFormat::kBrown
                                    ? "Brown corpus, tags stripped"
                                    : "plain text",
                                ", byte-level tokens)");
  }
  auto bytes = std::make_shared<const std::vector<uint8_t>>(std::move(corpus->bytes));
  return std::unique_ptr<BatchSource>(std::make_unique<CorpusWindows>(o.seed, std::move(bytes)));
}

}  // namespace satdar::data
