#include "data/batches.h"

#include "absl/strings/str_cat.h"
#include "core/random.h"
#include "data/corpus.h"
#include "data/dataset.h"

namespace satdar::data {

namespace {
// Distinct random streams for the two sources.
constexpr uint64_t kSyntheticStream = 0x73796e7468657469ull;
constexpr uint64_t kWindowStream = 0x77696e646f777321ull;
}  // namespace

void BatchSource::Batch(int64_t step, int64_t first_j, int64_t first_sample, int count,
                        int seq_len, int32_t* out) const {
  for (int i = 0; i < count; ++i) {
    Sequence(SampleKey{step, first_j + i, first_sample + i}, seq_len,
             out + static_cast<size_t>(i) * (seq_len + 1));
  }
}

void SyntheticBatches::Sequence(const SampleKey& key, int seq_len, int32_t* out) const {
  uint64_t stream =
      core::Mix64(kSyntheticStream ^ core::Mix64(key.step) ^ (core::Mix64(key.j) << 1));
  for (int p = 0; p <= seq_len; ++p) {
    out[p] = static_cast<int32_t>(core::RandomBits(seed_, stream, p) % vocab_);
  }
}

void CorpusWindows::Sequence(const SampleKey& key, int seq_len, int32_t* out) const {
  uint64_t stream = core::Mix64(kWindowStream ^ core::Mix64(key.step));
  uint64_t span = tokens_->size() - (seq_len + 1) + 1;
  uint64_t start = core::RandomBits(seed_, stream, key.j) % span;
  for (int p = 0; p <= seq_len; ++p) out[p] = (*tokens_)[start + p];
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const SourceOptions& o,
                                                             std::string* description) {
  if (o.synthetic) {
    if (description) *description = absl::StrCat("synthetic tokens, vocab ", o.vocab_size);
    return std::unique_ptr<BatchSource>(std::make_unique<SyntheticBatches>(o.seed, o.vocab_size));
  }
  if (Dataset::IsDataset(o.dir)) {
    auto dataset = Dataset::Open(o.dir, o.vocab_size);
    if (!dataset.ok()) return dataset.status();
    if ((*dataset)->samples(Split::kTrain, o.seq_len) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.dir_name, ": ", o.dir, ": the training split holds ", (*dataset)->tokens(Split::kTrain),
          " tokens, fewer than ", o.seq_len_name, " + 1 = ", o.seq_len + 1));
    }
    if (description) *description = (*dataset)->Describe();
    return std::unique_ptr<BatchSource>(
        std::make_unique<DatasetBatches>(*dataset, Split::kTrain, o.seq_len, o.seed));
  }
  auto format = ParseCorpusFormat(o.format);
  if (!format.ok()) return format.status();
  auto corpus = LoadCorpus(o.dir, *format);
  if (!corpus.ok()) return corpus.status();
  if (o.vocab_size < 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.dir_name, ": byte-level text needs vocab_size >= 256, the config has ", o.vocab_size));
  }
  if (corpus->bytes.size() < static_cast<size_t>(o.seq_len) + 2) {
    return absl::InvalidArgumentError(absl::StrCat(o.dir_name, ": ", o.dir, " holds ",
                                                   corpus->bytes.size(), " bytes, fewer than ",
                                                   o.seq_len_name, " + 1"));
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
