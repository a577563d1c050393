#include "data/dataset.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "data/permutation.h"
#include "nlohmann/json.hpp"

namespace satdar::data {

namespace {
absl::Status Bad(const std::string& dir, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--data: ", dir, ": ", what));
}
}  // namespace

bool Dataset::IsDataset(const std::string& dir) {
  struct stat st;
  return ::stat((dir + "/" + kManifestName).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<std::shared_ptr<const Dataset>> Dataset::Open(const std::string& dir,
                                                             int vocab_size) {
  auto text = core::ReadFileToString(dir + "/" + kManifestName);
  if (!text.ok()) return Bad(dir, std::string(text.status().message()));
  nlohmann::json m = nlohmann::json::parse(*text, nullptr, false);
  if (m.is_discarded() || !m.is_object()) return Bad(dir, "manifest.json is not a JSON object");
  if (!m.contains("version") || !m["version"].is_number_integer() ||
      m["version"].get<int>() != kManifestVersion) {
    return Bad(dir, absl::StrCat("manifest.json: version must be ", kManifestVersion));
  }
  if (!m.contains("vocab_size") || !m["vocab_size"].is_number_integer()) {
    return Bad(dir, "manifest.json: no integer vocab_size");
  }
  if (!m.contains("shards") || !m["shards"].is_array()) {
    return Bad(dir, "manifest.json: no shards list");
  }
  auto d = std::make_shared<Dataset>();
  d->dir_ = dir;
  d->tokenizer_vocab_ = m["vocab_size"].get<int>();
  if (d->tokenizer_vocab_ > vocab_size) {
    return Bad(dir, absl::StrCat("the tokenizer has ", d->tokenizer_vocab_,
                                 " tokens but the model's vocab_size is ", vocab_size));
  }
  bool any_pos = false, all_pos = true;
  for (const auto& s : m["shards"]) {
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("split") ||
        !s["split"].is_string()) {
      return Bad(dir, "manifest.json: every shard needs a file and a split");
    }
    const std::string split = s["split"].get<std::string>();
    if (split != "train" && split != "val") {
      return Bad(dir, absl::StrCat("manifest.json: split '", split, "' is not train or val"));
    }
    Part& part = split == "train" ? d->train_ : d->val_;
    auto shard = Shard::Open(dir + "/" + s["file"].get<std::string>(), vocab_size);
    if (!shard.ok()) return Bad(dir, std::string(shard.status().message()));
    if (s.contains("tokens") && s["tokens"].is_number_unsigned() &&
        s["tokens"].get<uint64_t>() != shard->size()) {
      return Bad(dir, absl::StrCat("manifest.json says ", s["file"].get<std::string>(), " holds ",
                                   s["tokens"].get<uint64_t>(), " tokens, the shard has ",
                                   shard->size()));
    }
    if (s.contains("pos") && s["pos"].is_string()) {
      auto pos = Shard::Open(dir + "/" + s["pos"].get<std::string>(), 0);
      if (!pos.ok()) return Bad(dir, std::string(pos.status().message()));
      if (pos->size() != shard->size() || pos->width() != 1) {
        return Bad(dir, absl::StrCat(s["pos"].get<std::string>(), " is not aligned with ",
                                     s["file"].get<std::string>()));
      }
      part.pos.push_back(std::move(*pos));
      any_pos = true;
    } else {
      all_pos = false;
    }
    part.starts.push_back(part.total);
    part.total += shard->size();
    part.shards.push_back(std::move(*shard));
  }
  if (d->train_.total == 0) return Bad(dir, "the training split is empty");
  d->has_pos_ = any_pos && all_pos;
  return std::shared_ptr<const Dataset>(std::move(d));
}

size_t Dataset::Locate(const Part& part, uint64_t i) {
  auto it = std::upper_bound(part.starts.begin(), part.starts.end(), i);
  return static_cast<size_t>(it - part.starts.begin()) - 1;
}

uint32_t Dataset::token(Split split, uint64_t i) const {
  const Part& part = PartOf(split);
  const size_t s = Locate(part, i);
  return part.shards[s].at(i - part.starts[s]);
}

uint8_t Dataset::pos(Split split, uint64_t i) const {
  const Part& part = PartOf(split);
  const size_t s = Locate(part, i);
  return static_cast<uint8_t>(part.pos[s].at(i - part.starts[s]));
}

uint64_t Dataset::samples(Split split, int seq_len) const {
  const uint64_t n = tokens(split);
  return n > static_cast<uint64_t>(seq_len) ? (n - 1) / seq_len : 0;
}

std::string Dataset::Describe() const {
  return absl::StrCat(dir_, ": ", train_.total, " training tokens in ", train_.shards.size(),
                      " shard(s), ", val_.total, " validation tokens, tokenizer vocabulary ",
                      tokenizer_vocab_, has_pos_ ? ", part-of-speech sidecars" : "");
}

DatasetBatches::DatasetBatches(std::shared_ptr<const Dataset> dataset, Split split, int seq_len,
                               uint64_t seed)
    : dataset_(std::move(dataset)), split_(split), seq_len_(seq_len), seed_(seed),
      samples_(dataset_->samples(split, seq_len)) {}

uint64_t DatasetBatches::WindowStart(int64_t sample) const {
  const uint64_t s = static_cast<uint64_t>(sample);
  const uint64_t epoch = s / samples_, index = s % samples_;
  if (split_ == Split::kVal) return index * seq_len_;
  // A fresh keyed shuffle of the split's samples every epoch.
  KeyedPermutation perm(samples_, core::Mix64(seed_ ^ core::Mix64(epoch + 0x5eed)));
  return perm(index) * seq_len_;
}

void DatasetBatches::Sequence(const SampleKey& key, int seq_len, int32_t* out) const {
  const uint64_t start = WindowStart(key.sample);
  for (int p = 0; p <= seq_len; ++p) out[p] = static_cast<int32_t>(dataset_->token(split_, start + p));
}

absl::StatusOr<std::unique_ptr<DatasetBatches>> OpenValidation(
    std::shared_ptr<const Dataset> dataset, int seq_len, uint64_t seed, const std::string& flag) {
  if (dataset->samples(Split::kVal, seq_len) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": the validation split of ", dataset->dir(), " holds ",
        dataset->tokens(Split::kVal), " tokens, fewer than --seq-len + 1"));
  }
  return std::make_unique<DatasetBatches>(std::move(dataset), Split::kVal, seq_len, seed);
}

}  // namespace satdar::data
