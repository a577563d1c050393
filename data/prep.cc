#include "data/prep.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/pos.h"
#include "data/prep_input.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "nlohmann/json.hpp"

namespace satdar::data {

namespace {

// SentencePiece models are a few MB even for 256k pieces.
constexpr size_t kMaxTokenizerBytes = size_t{1} << 30;

// Tokenizer training reads at most this much text, sampled evenly (a keyed hash per line)
// from the training documents: SentencePiece's BPE trainer takes about 85 bytes of memory per
// byte of text (4.7 GB for 55 MB), and a few tens of MB of text are as good a sample of a
// corpus's pieces as all of it.
constexpr int64_t kTokenizerSampleBytes = int64_t{16} << 20;
// SentencePiece skips sentences over 16384 bytes; longer lines are cut at spaces.
constexpr size_t kMaxSampleLine = 8192;

// The group of the word holding a piece's first byte that is not whitespace: "▁the" starts on
// the space before "the" and belongs to "the". Pieces of whitespace only, or of bytes between
// words, are "none". *w is the first word that may still hold a later piece (pieces come in
// text order).
PosGroup PieceGroup(const TextPiece& d, int begin, int end, size_t* w) {
  int at = begin;
  while (at < end && (d.text[at] == ' ' || d.text[at] == '\n' || d.text[at] == '\t')) ++at;
  if (at >= end) return kPosNone;
  while (*w < d.words.size() && d.words[*w].end <= at) ++*w;
  const bool inside = *w < d.words.size() && d.words[*w].begin <= at;
  return inside ? d.words[*w].group : kPosNone;
}

// Which documents are held out: a keyed hash of the name below --val-fraction, and when that
// picks none (and there are two or more), the document of the smallest hash.
class Holdout {
 public:
  explicit Holdout(const PrepOptions& o) : o_(o) {}
  void See(const std::string& name) {
    const double u = U(name);
    val_ += u < o_.val_fraction;
    if (u < min_u_) {
      min_u_ = u;
      min_name_ = name;
    }
  }
  void Finish(int64_t documents) {
    if (o_.val_fraction > 0 && val_ == 0 && documents > 1) {
      fallback_ = min_name_;
      val_ = 1;
    }
  }
  bool Val(const std::string& name) const {
    return U(name) < o_.val_fraction || (!fallback_.empty() && name == fallback_);
  }
  int64_t val() const { return val_; }

 private:
  double U(const std::string& name) const {
    return core::RandomUniform(o_.seed, core::HashString(name), 0);
  }
  const PrepOptions& o_;
  int64_t val_ = 0;
  double min_u_ = 2;
  std::string min_name_, fallback_;
};

absl::Status WriteError(const std::string& path) {
  // ENOSPC and EIO as what they are, naming the file.
  return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
}

class Progress {
 public:
  Progress(bool enabled, int64_t total) : enabled_(enabled), total_(total), tty_(isatty(2)) {
    start_ = std::chrono::steady_clock::now();
  }
  void Update(const char* stage, int64_t done) {
    if (!enabled_) return;
    const double secs = Seconds();
    const double mbps = secs > 0 ? done / 1e6 / secs : 0;
    const int pct = total_ > 0 ? static_cast<int>(100 * done / total_) : 100;
    if (tty_) {
      const int width = 30, fill = width * pct / 100;
      std::fprintf(stderr, "\r%-9s [%s%s] %3d%%  %.1f MB/s ", stage, std::string(fill, '#').c_str(),
                   std::string(width - fill, ' ').c_str(), pct, mbps);
      if (done >= total_) std::fprintf(stderr, "\n");
    } else if (pct >= next_pct_ || done >= total_) {
      std::fprintf(stderr, "%s: %d%% (%.1f MB/s)\n", stage, pct, mbps);
      next_pct_ = pct / 10 * 10 + 10;
    }
    std::fflush(stderr);
  }
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  bool enabled_;
  int64_t total_;
  bool tty_;
  int next_pct_ = 0;
  std::chrono::steady_clock::time_point start_;
};

class TmpDir {
 public:
  explicit TmpDir(std::string path) : path_(std::move(path)) {}
  ~TmpDir() {
    if (!committed_) (void)core::RemoveTree(path_);  // the output of a failed run
  }
  const std::string& path() const { return path_; }
  void Commit() { committed_ = true; }

 private:
  std::string path_;
  bool committed_ = false;
};

// What decoding changed and skipped, for the manifest: a dataset says what its text was.
nlohmann::json DecodingJson(const PrepSummary& s) {
  nlohmann::json replaced = nlohmann::json::object(), skipped = nlohmann::json::object();
  for (const DecodedFile& f : s.decoded) {
    if (f.skipped.empty()) {
      replaced[f.name] = f.replaced;
    } else {
      skipped[f.name] = f.skipped;
    }
  }
  return {{"files", s.files},
          {"replaced_sequences", s.replaced},
          {"replaced_by_file", replaced},
          {"skipped_files", skipped},
          {"bom_files", s.bom_files},
          {"crlf_files", s.crlf_files}};
}

// A bounded sample of the training documents' lines, for tokenizer training.
absl::Status WriteTokenizerSample(const PrepOptions& o, const std::vector<Source>& sources,
                                  const Holdout& holdout, int64_t text_bytes,
                                  const std::string& path, int64_t* sampled) {
  const double p = std::min(1.0, static_cast<double>(kTokenizerSampleBytes) /
                                     static_cast<double>(std::max<int64_t>(1, text_bytes)));
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return WriteError(path);
  bool failed = false;
  auto put = [&](absl::string_view line) {
    failed |= std::fwrite(line.data(), 1, line.size(), f) != line.size() ||
              std::fputc('\n', f) == EOF;
    *sampled += static_cast<int64_t>(line.size()) + 1;
  };
  int64_t doc = -1, line_index = 0;
  uint64_t key = 0;
  absl::Status s = ForEachPiece(o, sources, [&](TextPiece& piece) -> absl::Status {
    if (piece.doc != doc) {
      doc = piece.doc;
      line_index = 0;
      const std::string name = DocumentName(piece);
      key = holdout.Val(name) ? 0 : core::HashString(name) | 1;  // 0: a held-out document
    }
    if (key == 0) return absl::OkStatus();
    absl::string_view text(piece.text);
    for (size_t pos = 0; pos < text.size() && !failed;) {
      size_t eol = text.find('\n', pos);
      if (eol == absl::string_view::npos) eol = text.size();
      absl::string_view line = text.substr(pos, eol - pos);
      pos = eol + 1;
      if (line.empty() || core::RandomUniform(o.seed + 1, key, line_index++) >= p) continue;
      while (line.size() > kMaxSampleLine) {
        size_t cut = line.rfind(' ', kMaxSampleLine);
        if (cut == absl::string_view::npos || cut == 0) cut = kMaxSampleLine;
        while (cut > 1 && (static_cast<unsigned char>(line[cut]) & 0xc0) == 0x80) --cut;
        put(line.substr(0, cut));
        line.remove_prefix(cut);
      }
      put(line);
    }
    return failed ? WriteError(path) : absl::OkStatus();
  });
  failed |= std::fclose(f) != 0;
  SATDAR_RETURN_IF_ERROR(s);
  return failed ? WriteError(path) : absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(
    const PrepOptions& o, const std::vector<Source>& sources, const Holdout& holdout,
    int64_t text_bytes, const std::string& tmp, PrepSummary* summary) {
  const std::string model_path = tmp + "/tokenizer.model";
  if (!o.tokenizer.empty()) {
    auto bytes = core::ReadFileToString(o.tokenizer, kMaxTokenizerBytes);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", bytes.status().message()));
    }
    SATDAR_RETURN_IF_ERROR(core::WriteFileAtomically(model_path, *bytes));
  } else {
    const std::string text_path = tmp + "/train_text.txt";
    SATDAR_RETURN_IF_ERROR(WriteTokenizerSample(o, sources, holdout, text_bytes, text_path,
                                                &summary->tokenizer_sample_bytes));
    if (o.progress) {
      std::fprintf(stderr, "prep: training a %d-piece BPE tokenizer on %.1f MB of sampled text\n",
                   o.vocab_size, summary->tokenizer_sample_bytes / 1e6);
    }
    std::string error;
    if (!Tokenizer::Train(text_path, tmp + "/tokenizer", o.vocab_size, o.threads, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("vocab_size ", o.vocab_size, ": ", error));
    }
    ::unlink(text_path.c_str());
    ::unlink((tmp + "/tokenizer.vocab").c_str());
  }
  std::string load_error;
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::Load(model_path, &load_error);
  if (tokenizer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.tokenizer.empty() ? "tokenizer training: " : "tokenizer: ", o.tokenizer, ": ",
        load_error));
  }
  summary->vocab_size = tokenizer->vocab_size();
  if (o.vocab_size > 0 && o.vocab_size != summary->vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer: ", o.tokenizer, " has ", summary->vocab_size, " pieces but vocab_size is ",
        o.vocab_size));
  }
  return tokenizer;
}

// One split's shards being written: documents never span shards; a document longer than a
// shard is cut there (it continues as the next document).
class ShardSplit {
 public:
  ShardSplit(const PrepOptions& o, const std::string& tmp, const char* split, bool pos,
             int width, int vocab, int eos, nlohmann::json* shards, PrepSummary* summary)
      : o_(o), tmp_(tmp), split_(split), pos_(pos), width_(width), vocab_(vocab), eos_(eos),
        shards_(shards), summary_(summary) {}

  void Append(int id, PosGroup group) {
    if (!open_) {
      starts_.push_back(tokens_.size());
      open_ = true;
    }
    tokens_.push_back(static_cast<uint32_t>(id));
    if (pos_) groups_.push_back(group);
  }
  // The end of a piece: of its document (last), or a cut when the shard is full.
  absl::Status EndPiece(bool last) {
    if (!open_) return absl::OkStatus();
    const bool full = static_cast<int64_t>(tokens_.size()) >= o_.shard_tokens;
    if (!last && !full) return absl::OkStatus();
    if (!last) ++summary_->cut_documents;
    Append(eos_, kPosNone);
    open_ = false;
    return full ? Flush() : absl::OkStatus();
  }
  absl::Status Flush() {
    if (tokens_.empty()) return absl::OkStatus();
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%05d.bin", split_, index_);
    SATDAR_RETURN_IF_ERROR(WriteShard(tmp_ + "/" + name, tokens_, starts_, width_, vocab_));
    nlohmann::json entry = {{"file", name}, {"split", split_}, {"tokens", tokens_.size()},
                            {"documents", starts_.size()}};
    if (pos_) {
      char pos_name[64];
      std::snprintf(pos_name, sizeof(pos_name), "%s_%05d.pos", split_, index_);
      SATDAR_RETURN_IF_ERROR(WriteShard(tmp_ + "/" + pos_name, groups_, starts_, 1, 0));
      entry["pos"] = pos_name;
    }
    shards_->push_back(entry);
    const bool val = std::string(split_) == "val";
    (val ? summary_->val_tokens : summary_->train_tokens) += static_cast<int64_t>(tokens_.size());
    (val ? summary_->val_documents : summary_->documents) += static_cast<int64_t>(starts_.size());
    ++summary_->shards;
    ++index_;
    tokens_.clear();
    groups_.clear();
    starts_.clear();
    return absl::OkStatus();
  }

 private:
  const PrepOptions& o_;
  std::string tmp_;
  const char* split_;
  bool pos_;
  int width_, vocab_, eos_;
  nlohmann::json* shards_;
  PrepSummary* summary_;
  std::vector<uint32_t> tokens_, groups_;
  std::vector<uint64_t> starts_;
  int index_ = 0;
  bool open_ = false;
};

// Encodes every document into its split's shards: pieces in batches, each batch's pieces in
// parallel, appended in order.
absl::Status EncodeAll(const PrepOptions& o, const std::vector<Source>& sources,
                       const Holdout& holdout, const Tokenizer& tokenizer, bool brown,
                       const std::string& tmp, int64_t text_bytes, nlohmann::json* shards,
                       PrepSummary* summary) {
  const int width = summary->vocab_size <= 65536 ? 2 : 4;
  const int eos = tokenizer.eos_id();
  // Shard entries list train shards first: each split's entries are kept apart.
  nlohmann::json train_shards = nlohmann::json::array(), val_shards = nlohmann::json::array();
  ShardSplit train(o, tmp, "train", brown, width, summary->vocab_size, eos, &train_shards, summary);
  ShardSplit val(o, tmp, "val", brown, width, summary->vocab_size, eos, &val_shards, summary);
  core::ThreadPool pool(o.threads);
  Progress progress(o.progress, text_bytes);
  const size_t batch_size = static_cast<size_t>(4 * o.threads);
  std::vector<TextPiece> batch;
  std::vector<bool> held_out;
  std::vector<std::vector<int>> ids(batch_size), begins(batch_size), ends(batch_size);
  int64_t done = 0, doc = -1;
  bool doc_val = false;
  auto run = [&]() -> absl::Status {
    pool.ParallelFor(static_cast<int64_t>(batch.size()), [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) tokenizer.Encode(batch[k].text, &ids[k], &begins[k], &ends[k]);
    });
    for (size_t k = 0; k < batch.size(); ++k) {
      ShardSplit& split = held_out[k] ? val : train;
      size_t w = 0;
      for (size_t i = 0; i < ids[k].size(); ++i) {
        split.Append(ids[k][i], brown ? PieceGroup(batch[k], begins[k][i], ends[k][i], &w) : kPosNone);
      }
      SATDAR_RETURN_IF_ERROR(split.EndPiece(batch[k].last));
      done += static_cast<int64_t>(batch[k].text.size());
    }
    progress.Update("tokenize", std::min(done, text_bytes));
    batch.clear();
    held_out.clear();
    return absl::OkStatus();
  };
  SATDAR_RETURN_IF_ERROR(ForEachPiece(o, sources, [&](TextPiece& piece) -> absl::Status {
    if (piece.doc != doc) {
      doc = piece.doc;
      doc_val = holdout.Val(DocumentName(piece));
    }
    held_out.push_back(doc_val);
    batch.push_back(std::move(piece));
    return batch.size() == batch_size ? run() : absl::OkStatus();
  }));
  SATDAR_RETURN_IF_ERROR(run());
  SATDAR_RETURN_IF_ERROR(train.Flush());
  SATDAR_RETURN_IF_ERROR(val.Flush());
  progress.Update("tokenize", text_bytes);
  for (auto* list : {&train_shards, &val_shards}) {
    for (auto& entry : *list) shards->push_back(std::move(entry));
  }
  return absl::OkStatus();
}

absl::StatusOr<PrepSummary> PrepInto(const PrepOptions& o, const std::string& tmp) {
  PrepSummary summary;
  SATDAR_ASSIGN_OR_RETURN(std::vector<Source> sources, ListSources(o));
  Holdout holdout(o);
  SATDAR_RETURN_IF_ERROR(ScanSources(o, &sources, &summary,
                                     [&](const std::string& name) { holdout.See(name); }));
  const int64_t documents = summary.documents;
  if (documents == 0) {
    return absl::InvalidArgumentError("inputs hold no text (empty corpus)");
  }
  holdout.Finish(documents);
  if (holdout.val() == documents) {
    return absl::InvalidArgumentError(absl::StrCat(
        "val_fraction ", o.val_fraction, " leaves no training document among ", documents));
  }
  bool brown = false;
  int64_t text_bytes = 0;
  for (const Source& s : sources) {
    if (s.skipped) continue;
    text_bytes += s.bytes;
    brown |= s.kind == SourceKind::kBrown;
  }
  if (brown) {
    for (const Source& s : sources) {
      if (!s.skipped && s.kind != SourceKind::kBrown) {
        return absl::InvalidArgumentError(absl::StrCat(
            "inputs: ", s.name, " mixes plain text with the Brown corpus; prepare them apart"));
      }
    }
  }
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                          MakeTokenizer(o, sources, holdout, text_bytes, tmp, &summary));
  // The counts are what the shards hold (a cut document counts as the documents it became).
  summary.documents = summary.val_documents = 0;
  nlohmann::json shards = nlohmann::json::array();
  SATDAR_RETURN_IF_ERROR(
      EncodeAll(o, sources, holdout, *tokenizer, brown, tmp, text_bytes, &shards, &summary));
  summary.documents += summary.val_documents;
  nlohmann::json manifest = {
      {"version", kManifestVersion},
      {"tokenizer", "tokenizer.model"},
      {"vocab_size", summary.vocab_size},
      {"token_bytes", summary.vocab_size <= 65536 ? 2 : 4},
      {"eos_id", tokenizer->eos_id()},
      {"pos_groups", brown ? nlohmann::json{"none", "content", "function", "punctuation"}
                           : nlohmann::json(nullptr)},
      {"documents", summary.documents},
      {"val_documents", summary.val_documents},
      {"train_tokens", summary.train_tokens},
      {"val_tokens", summary.val_tokens},
      {"source_bytes", summary.bytes},
      {"inputs", o.inputs},
      {"decoding", DecodingJson(summary)},
      {"shards", shards}};
  SATDAR_RETURN_IF_ERROR(
      core::WriteFileAtomically(tmp + "/" + kManifestName, manifest.dump(2) + "\n"));
  return summary;
}

}  // namespace

std::string PrepTmpPath(const std::string& out) { return absl::StrCat(out, ".tmp.", ::getpid()); }

absl::StatusOr<PrepSummary> Prep(const PrepOptions& o) {
  if (o.inputs.empty()) {
    return absl::InvalidArgumentError("satdar prep: inputs is empty; give at least one input");
  }
  if (o.tokenizer.empty() && o.vocab_size < 260) {
    return absl::InvalidArgumentError(
        "satdar prep: give vocab_size N (>= 260: byte fallback needs 256 pieces plus the "
        "special ones) or an existing model as tokenizer");
  }
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    return absl::InvalidArgumentError("satdar prep: val_fraction must be in [0, 1)");
  }
  if (o.format != "auto" && o.format != "text" && o.format != "brown" && o.format != "jsonl") {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar prep: format must be auto, text, brown or jsonl, got '", o.format, "'"));
  }
  if (o.jsonl_key.empty()) return absl::InvalidArgumentError("satdar prep: jsonl_key is empty");
  struct stat st;
  if (::stat(o.out.c_str(), &st) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "out: ", o.out, " already exists; choose a new folder (prep never overwrites)"));
  }
  // Missing parent folders are created, as mkdir -p does (out/ on a fresh clone).
  std::string parent = o.out;
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  const size_t slash = parent.rfind('/');
  parent = slash == std::string::npos ? "." : slash == 0 ? "/" : parent.substr(0, slash);
  if (absl::Status made = core::MakeDirs(parent); !made.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("out: ", made.message()));
  }
  TmpDir tmp(PrepTmpPath(o.out));
  if (::mkdir(tmp.path().c_str(), 0755) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: cannot create ", tmp.path(), ": ", std::strerror(errno)));
  }
  const auto start = std::chrono::steady_clock::now();
  SATDAR_ASSIGN_OR_RETURN(PrepSummary summary, PrepInto(o, tmp.path()));
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (::rename(tmp.path().c_str(), o.out.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("out: cannot rename ", tmp.path(), " to ", o.out));
  }
  tmp.Commit();
  return summary;
}

}  // namespace satdar::data
