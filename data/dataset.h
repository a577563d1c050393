// data/dataset.h: a prepared dataset folder (written by `satdar prep`, data/prep.h):
//   manifest.json           what is in the folder (format below), written last
//   tokenizer.model         the SentencePiece model the ids come from
//   train_00000.bin ...     token shards (data/shard.h) of the training split
//   val_00000.bin ...       shards of the validation split
//   *.pos                   POS-group sidecars beside the shards (tagged Brown input only)
// Opening it memory-maps and verifies every shard (checksums, ids < vocab_size).
//
// Samples of a split are windows of seq_len + 1 tokens taken with stride seq_len from the
// split's token stream (shards in order, documents separated by their EOS token).
#ifndef SATDAR_DATA_DATASET_H_
#define SATDAR_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batches.h"
#include "data/shard.h"

namespace satdar::data {

inline constexpr char kManifestName[] = "manifest.json";
inline constexpr int kManifestVersion = 1;

enum class Split { kTrain, kVal };

class Dataset {
 public:
  // vocab_size: the model's; shards with larger ids or a larger tokenizer are rejected.
  static absl::StatusOr<std::shared_ptr<const Dataset>> Open(const std::string& dir,
                                                             int vocab_size);
  static bool IsDataset(const std::string& dir);  // has a manifest.json

  const std::string& dir() const { return dir_; }
  int tokenizer_vocab_size() const { return tokenizer_vocab_; }
  uint64_t tokens(Split split) const { return PartOf(split).total; }
  uint32_t token(Split split, uint64_t i) const;
  bool has_pos() const { return has_pos_; }
  uint8_t pos(Split split, uint64_t i) const;
  // Windows of seq_len + 1 tokens with stride seq_len.
  uint64_t samples(Split split, int seq_len) const;
  std::string Describe() const;

 private:
  struct Part {
    std::vector<Shard> shards, pos;
    std::vector<uint64_t> starts;  // first global index of each shard
    uint64_t total = 0;
  };
  const Part& PartOf(Split split) const { return split == Split::kTrain ? train_ : val_; }
  static size_t Locate(const Part& part, uint64_t i);

  std::string dir_;
  int tokenizer_vocab_ = 0;
  bool has_pos_ = false;
  Part train_, val_;
};

// Sample `key.sample` of a split: in shuffled order for training (a keyed permutation per
// epoch, epochs = passes over the split's samples), in order for validation.
class DatasetBatches : public BatchSource {
 public:
  DatasetBatches(std::shared_ptr<const Dataset> dataset, Split split, int seq_len, uint64_t seed);
  void Sequence(const SampleKey& key, int seq_len, int32_t* out) const override;
  // The first token position of the window that sample `sample` reads.
  uint64_t WindowStart(int64_t sample) const;
  uint64_t samples_per_epoch() const { return samples_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  Split split_;
  int seq_len_;
  uint64_t seed_, samples_;
};

// The validation split of `dataset` as windows of seq_len + 1 tokens (in order). When the split
// is shorter than one window: InvalidArgument naming `flag`, the folder and the token count.
absl::StatusOr<std::unique_ptr<DatasetBatches>> OpenValidation(
    std::shared_ptr<const Dataset> dataset, int seq_len, uint64_t seed, const std::string& flag);

}  // namespace satdar::data

#endif  // SATDAR_DATA_DATASET_H_
