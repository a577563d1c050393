#include "data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <initializer_list>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "data/permutation.h"
#include "data/pos.h"
#include "nlohmann/json.hpp"

namespace satdar::data {

namespace {
absl::Status Bad(const std::string& dir, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("data_dir: ", dir, ": ", what));
}
}  // namespace

bool Dataset::IsDataset(const std::string& dir) {
  struct stat st;
  return ::stat((dir + "/" + kManifestName).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

namespace {

// A file named by the manifest: a plain name inside the dataset folder, never a path that
// leads out of it.
absl::Status CheckPlainName(const std::string& dir, const std::string& field,
                            const std::string& name) {
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return Bad(dir, absl::StrCat("manifest.json: ", field, " \"", name,
                                 "\" must be a file name inside the dataset folder"));
  }
  return absl::OkStatus();
}

// A non-negative integer field of `object` (required), or an error naming it.
absl::StatusOr<uint64_t> Count(const std::string& dir, const nlohmann::json& object,
                               const std::string& where, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_unsigned()) {
    return Bad(dir, absl::StrCat("manifest.json: ", where, key, " must be an integer >= 0"));
  }
  return it->get<uint64_t>();
}

absl::Status OnlyKnownKeys(const std::string& dir, const nlohmann::json& object,
                           const std::string& where, std::initializer_list<const char*> known) {
  for (const auto& [key, unused] : object.items()) {
    bool found = false;
    for (const char* k : known) found |= key == k;
    if (!found) {
      return Bad(dir, absl::StrCat("manifest.json: unknown field \"", where, key, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Dataset>> Dataset::Open(const std::string& dir,
                                                             int vocab_size) {
  SATDAR_RETURN_IF_ERROR(core::CheckFolder(dir));
  auto text = core::ReadFileToString(dir + "/" + kManifestName, core::kMaxSmallFileBytes);
  if (!text.ok()) return Bad(dir, std::string(text.status().message()));
  auto parsed = core::ParseJson(*text, dir + "/" + kManifestName);
  if (!parsed.ok()) return Bad(dir, std::string(parsed.status().message()));
  const nlohmann::json& m = *parsed;
  if (!m.is_object()) return Bad(dir, "manifest.json is not a JSON object");
  SATDAR_RETURN_IF_ERROR(OnlyKnownKeys(
      dir, m, "", {"version", "tokenizer", "vocab_size", "token_bytes", "eos_id", "pos_groups",
                   "documents", "val_documents", "train_tokens", "val_tokens", "source_bytes",
                   "inputs", "decoding", "shards"}));
  if (!m.contains("version") || !m["version"].is_number_integer() ||
      m["version"].get<int64_t>() != kManifestVersion) {
    return Bad(dir, absl::StrCat("manifest.json: version must be ", kManifestVersion));
  }
  SATDAR_ASSIGN_OR_RETURN(const uint64_t vocab, Count(dir, m, "", "vocab_size"));
  SATDAR_ASSIGN_OR_RETURN(const uint64_t width, Count(dir, m, "", "token_bytes"));
  SATDAR_ASSIGN_OR_RETURN(const uint64_t eos, Count(dir, m, "", "eos_id"));
  if (vocab < 1 || vocab > (uint64_t{1} << 32)) {
    return Bad(dir, absl::StrCat("manifest.json: vocab_size ", vocab, " is not in [1, 2^32]"));
  }
  if ((width != 2 && width != 4) || vocab > (uint64_t{1} << (8 * width))) {
    return Bad(dir, absl::StrCat("manifest.json: token_bytes ", width, " cannot hold ", vocab,
                                 " token ids (2 or 4 bytes)"));
  }
  if (eos >= vocab) {
    return Bad(dir, absl::StrCat("manifest.json: eos_id ", eos, " is not below vocab_size ", vocab));
  }
  if (!m.contains("tokenizer") || !m["tokenizer"].is_string()) {
    return Bad(dir, "manifest.json: tokenizer must be a file name");
  }
  SATDAR_RETURN_IF_ERROR(CheckPlainName(dir, "tokenizer", m["tokenizer"].get<std::string>()));
  if (absl::Status s = core::CheckRegularFile(dir + "/" + m["tokenizer"].get<std::string>());
      !s.ok()) {
    return Bad(dir, absl::StrCat("manifest.json: tokenizer: ", s.message()));
  }
  if (m.contains("pos_groups") && !m["pos_groups"].is_null() && !m["pos_groups"].is_array()) {
    return Bad(dir, "manifest.json: pos_groups must be null or a list");
  }
  if (m.contains("decoding") && !m["decoding"].is_object()) {
    return Bad(dir, "manifest.json: decoding must be an object");
  }
  if (m.contains("inputs") && !m["inputs"].is_array()) {
    return Bad(dir, "manifest.json: inputs must be a list");
  }
  if (!m.contains("shards") || !m["shards"].is_array() || m["shards"].empty()) {
    return Bad(dir, "manifest.json: no shards list");
  }
  auto d = std::make_shared<Dataset>();
  d->dir_ = dir;
  d->tokenizer_vocab_ = static_cast<int>(std::min<uint64_t>(vocab, INT32_MAX));
  if (vocab > static_cast<uint64_t>(vocab_size)) {
    return Bad(dir, absl::StrCat("the tokenizer has ", vocab,
                                 " tokens but the model's vocab_size is ", vocab_size));
  }
  bool any_pos = false, all_pos = true;
  std::set<std::string> files;
  uint64_t docs[2] = {0, 0};
  for (size_t i = 0; i < m["shards"].size(); ++i) {
    const nlohmann::json& s = m["shards"][i];
    const std::string where = absl::StrCat("shards[", i, "].");
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("split") ||
        !s["split"].is_string()) {
      return Bad(dir, "manifest.json: every shard needs a file and a split");
    }
    SATDAR_RETURN_IF_ERROR(
        OnlyKnownKeys(dir, s, where, {"file", "split", "tokens", "documents", "pos"}));
    const std::string file = s["file"].get<std::string>();
    SATDAR_RETURN_IF_ERROR(CheckPlainName(dir, where + "file", file));
    if (!files.insert(file).second) {
      return Bad(dir, absl::StrCat("manifest.json: ", file, " is listed twice"));
    }
    const std::string split = s["split"].get<std::string>();
    if (split != "train" && split != "val") {
      return Bad(dir, absl::StrCat("manifest.json: split '", split, "' is not train or val"));
    }
    SATDAR_ASSIGN_OR_RETURN(const uint64_t tokens, Count(dir, s, where, "tokens"));
    SATDAR_ASSIGN_OR_RETURN(const uint64_t documents, Count(dir, s, where, "documents"));
    Part& part = split == "train" ? d->train_ : d->val_;
    auto shard = Shard::Open(dir + "/" + file, vocab_size);
    if (!shard.ok()) return Bad(dir, std::string(shard.status().message()));
    if (tokens != shard->size() || documents != shard->doc_starts().size()) {
      return Bad(dir, absl::StrCat("manifest.json says ", file, " holds ", tokens, " tokens in ",
                                   documents, " documents, the shard has ", shard->size(),
                                   " in ", shard->doc_starts().size()));
    }
    if (static_cast<uint64_t>(shard->width()) != width || shard->vocab() != vocab) {
      return Bad(dir, absl::StrCat(file, " holds ", shard->width(), "-byte ids of a vocabulary of ",
                                   shard->vocab(), ", the manifest says ", width, "-byte ids of ",
                                   vocab));
    }
    // Documents end with the EOS token the manifest names.
    const auto& starts = shard->doc_starts();
    for (size_t k = 0; k < starts.size(); ++k) {
      const uint64_t end = k + 1 < starts.size() ? starts[k + 1] : shard->size();
      if (end == 0 || end <= starts[k] || shard->at(end - 1) != eos) {
        return Bad(dir, absl::StrCat(file, ": document ", k, " does not end with eos_id ", eos));
      }
    }
    docs[split == "val"] += documents;
    if (s.contains("pos")) {
      if (!s["pos"].is_string()) return Bad(dir, "manifest.json: " + where + "pos must be a file name");
      const std::string pos_name = s["pos"].get<std::string>();
      SATDAR_RETURN_IF_ERROR(CheckPlainName(dir, where + "pos", pos_name));
      if (!files.insert(pos_name).second) {
        return Bad(dir, absl::StrCat("manifest.json: ", pos_name, " is listed twice"));
      }
      auto pos = Shard::Open(dir + "/" + pos_name, 0);
      if (!pos.ok()) return Bad(dir, std::string(pos.status().message()));
      if (pos->size() != shard->size() || pos->width() != 1) {
        return Bad(dir, absl::StrCat(pos_name, " is not aligned with ", file));
      }
      // Every entry is a group of data/pos.h: a larger byte would index past the per-group
      // tallies of `satdar eval --gate-by-category`.
      for (uint64_t i = 0; i < pos->size(); ++i) {
        if (pos->at(i) >= static_cast<uint32_t>(kNumPosGroups)) {
          return Bad(dir, absl::StrCat(pos_name, ": byte ", pos->at(i), " at offset ",
                                       kShardHeaderBytes + i, " (token ", i,
                                       ") is not a part-of-speech group (0 to ",
                                       kNumPosGroups - 1, ")"));
        }
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
  // The totals the manifest states must be what the shards hold.
  const std::pair<const char*, uint64_t> totals[] = {{"train_tokens", d->train_.total},
                                                     {"val_tokens", d->val_.total},
                                                     {"documents", docs[0] + docs[1]},
                                                     {"val_documents", docs[1]}};
  for (const auto& [key, actual] : totals) {
    if (!m.contains(key)) continue;
    SATDAR_ASSIGN_OR_RETURN(const uint64_t stated, Count(dir, m, "", key));
    if (stated != actual) {
      return Bad(dir, absl::StrCat("manifest.json: ", key, " is ", stated, " but the shards hold ",
                                   actual));
    }
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
        dataset->tokens(Split::kVal), " tokens, fewer than seq_len + 1"));
  }
  return std::make_unique<DatasetBatches>(std::move(dataset), Split::kVal, seq_len, seed);
}

}  // namespace satdar::data
