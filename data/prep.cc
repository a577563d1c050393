#include "data/prep.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/random.h"
#include "core/thread_pool.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/pos.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "nlohmann/json.hpp"

namespace satdar::data {

namespace {

// SentencePiece models are a few MB even for 256k pieces.
constexpr size_t kMaxTokenizerBytes = size_t{1} << 30;

struct Word {
  int begin, end;  // byte range in the document text
  PosGroup group;
};

struct Document {
  std::string name;
  std::string text;
  std::vector<Word> words;  // Brown only
  bool val = false;
};

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Brown text: one sentence per line, words joined by spaces, each word's group recorded.
Document BrownDocument(const std::string& name, const std::string& tagged) {
  Document doc;
  doc.name = name;
  size_t pos = 0;
  while (pos < tagged.size()) {
    size_t eol = tagged.find('\n', pos);
    if (eol == std::string::npos) eol = tagged.size();
    std::vector<TaggedWord> words = ParseBrownLine(absl::string_view(tagged).substr(pos, eol - pos));
    for (size_t i = 0; i < words.size(); ++i) {
      if (i > 0) doc.text.push_back(' ');
      const int begin = static_cast<int>(doc.text.size());
      doc.text += words[i].word;
      doc.words.push_back({begin, static_cast<int>(doc.text.size()), words[i].group});
    }
    if (!words.empty()) doc.text.push_back('\n');
    pos = eol + 1;
  }
  return doc;
}

bool IsJsonlName(const std::string& name) {
  return name.size() > 6 && name.compare(name.size() - 6, 6, ".jsonl") == 0;
}

// One document per non-blank line: the string under o.jsonl_key of the object on it.
absl::Status ReadJsonl(const PrepOptions& o, const std::string& name, const std::string& text,
                       std::vector<Document>* docs) {
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const absl::string_view line = absl::string_view(text).substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r\f") == absl::string_view::npos) continue;
    const std::string where = absl::StrCat("--input: ", name, " line ", line_no);
    SATDAR_ASSIGN_OR_RETURN(nlohmann::json j, core::ParseJson(line, where));
    if (!j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected a JSON object (one document per line)"));
    }
    const auto it = j.find(o.jsonl_key);
    if (it == j.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the object has no \"", o.jsonl_key, "\" field (the text's key: --jsonl-key)"));
    }
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field \"", o.jsonl_key, "\" is not a string"));
    }
    std::string doc = it->get<std::string>();
    if (doc.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field \"", o.jsonl_key, "\" holds a NUL character"));
    }
    if (doc.empty()) continue;
    Document d;
    d.name = absl::StrCat(name, ":", line_no);
    d.text = std::move(doc);
    docs->push_back(std::move(d));
  }
  return absl::OkStatus();
}

// A file's text, decoded leniently (or strictly with --strict-utf8); false when the file is
// skipped (binary or empty), recorded in the summary either way.
absl::StatusOr<bool> DecodeFile(const PrepOptions& o, const std::string& name,
                                const std::string& path, std::string* text, PrepSummary* summary) {
  auto bytes = core::ReadFileToString(path, core::kNoSizeLimit);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--input: ", bytes.status().message()));
  }
  summary->bytes += static_cast<int64_t>(bytes->size());
  auto skip = [&](std::string why) {
    std::fprintf(stderr, "prep: warning: skipping %s: %s\n", name.c_str(), why.c_str());
    summary->decoded.push_back({name, 0, std::move(why)});
    return false;
  };
  if (bytes->empty()) return skip("empty");
  if (o.strict_utf8) {
    SATDAR_RETURN_IF_ERROR(CheckIsText(*bytes, path, "--input", /*utf8=*/true));
  }
  DecodeStats stats;
  *text = DecodeText(*bytes, &stats);
  const std::string binary = BinaryReason(stats, bytes->size());
  if (!binary.empty()) return skip(absl::StrCat("binary (", binary, ")"));
  ++summary->files;
  summary->bom_files += stats.bom;
  summary->crlf_files += stats.crlf;
  if (stats.replaced > 0) {
    summary->replaced += stats.replaced;
    summary->decoded.push_back({name, stats.replaced, ""});
  }
  return true;
}

absl::Status ReadInputs(const PrepOptions& o, std::vector<Document>* docs, bool* brown,
                        PrepSummary* summary) {
  *brown = false;
  for (const std::string& input : o.inputs) {
    std::vector<std::pair<std::string, std::string>> files;  // (display name, path)
    bool is_brown = o.format == "brown";
    if (IsDir(input)) {
      SATDAR_ASSIGN_OR_RETURN(std::vector<std::string> names, ListFiles(input, "--input"));
      SATDAR_RETURN_IF_ERROR(CheckNotPreparedDataset(input, names, "--input"));
      if (o.format == "auto") is_brown = std::count(names.begin(), names.end(), "cats.txt") > 0;
      for (const std::string& n : names) {
        if (is_brown && !IsBrownFile(n)) continue;
        files.emplace_back(input + "/" + n, input + "/" + n);
      }
    } else {
      files.emplace_back(input, input);
    }
    for (const auto& [name, path] : files) {
      std::string text;
      SATDAR_ASSIGN_OR_RETURN(const bool read, DecodeFile(o, name, path, &text, summary));
      if (!read) continue;
      if (o.format == "jsonl" || (o.format == "auto" && !is_brown && IsJsonlName(name))) {
        SATDAR_RETURN_IF_ERROR(ReadJsonl(o, name, text, docs));
        continue;
      }
      Document doc;
      if (is_brown) {
        doc = BrownDocument(name, text);
        *brown = true;
      } else {
        doc.name = name;
        doc.text = std::move(text);
      }
      if (!doc.text.empty()) docs->push_back(std::move(doc));
    }
  }
  if (docs->empty()) {
    return absl::InvalidArgumentError("--input: the inputs hold no text (empty corpus)");
  }
  if (*brown) {
    for (const Document& d : *docs) {
      if (d.words.empty() && !d.text.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--input: ", d.name, " mixes plain text with the Brown corpus; prepare them apart"));
      }
    }
  }
  return absl::OkStatus();
}

// The group of the word holding a piece's first byte that is not whitespace: "▁the" starts on
// the space before "the" and belongs to "the". Pieces of whitespace only, or of bytes between
// words, are "none". *w is the first word that may still hold a later piece (pieces come in
// text order).
PosGroup PieceGroup(const Document& d, int begin, int end, size_t* w) {
  int at = begin;
  while (at < end && (d.text[at] == ' ' || d.text[at] == '\n' || d.text[at] == '\t')) ++at;
  if (at >= end) return kPosNone;
  while (*w < d.words.size() && d.words[*w].end <= at) ++*w;
  const bool inside = *w < d.words.size() && d.words[*w].begin <= at;
  return inside ? d.words[*w].group : kPosNone;
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

absl::StatusOr<PrepSummary> PrepInto(const PrepOptions& o, const std::string& tmp) {
  PrepSummary summary;
  std::vector<Document> docs;
  bool brown = false;
  SATDAR_RETURN_IF_ERROR(ReadInputs(o, &docs, &brown, &summary));
  int64_t text_bytes = 0;
  for (const Document& d : docs) text_bytes += static_cast<int64_t>(d.text.size());
  Progress progress(o.progress, text_bytes);
  // Held-out documents: a keyed hash of the name, at least one when asked for.
  int val = 0;
  for (Document& d : docs) {
    d.val = core::RandomUniform(o.seed, core::HashString(d.name), 0) < o.val_fraction;
    val += d.val;
  }
  if (o.val_fraction > 0 && val == 0 && docs.size() > 1) {
    docs.back().val = true;
    val = 1;
  }
  if (val == static_cast<int>(docs.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--val-fraction ", o.val_fraction, " leaves no training document among ", docs.size()));
  }
  summary.documents = static_cast<int64_t>(docs.size());
  summary.val_documents = val;

  // Tokenizer: train on the training split, or take the given model.
  const std::string model_path = tmp + "/tokenizer.model";
  if (!o.tokenizer.empty()) {
    auto bytes = core::ReadFileToString(o.tokenizer, kMaxTokenizerBytes);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tokenizer: ", bytes.status().message()));
    }
    SATDAR_RETURN_IF_ERROR(core::WriteFileAtomically(model_path, *bytes));
  } else {
    const std::string text_path = tmp + "/train_text.txt";
    std::string all;
    for (const Document& d : docs) {
      if (!d.val) all += d.text + "\n";
    }
    SATDAR_RETURN_IF_ERROR(core::WriteFileAtomically(text_path, all));
    if (o.progress) std::fprintf(stderr, "prep: training a %d-piece BPE tokenizer\n", o.vocab_size);
    std::string error;
    if (!Tokenizer::Train(text_path, tmp + "/tokenizer", o.vocab_size, o.threads, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--vocab-size ", o.vocab_size, ": ", error));
    }
    ::unlink(text_path.c_str());
    ::unlink((tmp + "/tokenizer.vocab").c_str());
  }
  std::string load_error;
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::Load(model_path, &load_error);
  if (tokenizer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.tokenizer.empty() ? "tokenizer training: " : "--tokenizer: ", o.tokenizer, ": ",
        load_error));
  }
  summary.vocab_size = tokenizer->vocab_size();
  if (o.vocab_size > 0 && o.vocab_size != summary.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer: ", o.tokenizer, " has ", summary.vocab_size, " pieces but --vocab-size is ",
        o.vocab_size));
  }
  const int width = summary.vocab_size <= 65536 ? 2 : 4;
  core::ThreadPool pool(o.threads);
  const int eos = tokenizer->eos_id();

  // Encode and shard each split.
  nlohmann::json shards = nlohmann::json::array();
  int64_t done = 0;
  for (const bool val_split : {false, true}) {
    const char* split = val_split ? "val" : "train";
    std::vector<uint32_t> tokens;
    std::vector<uint32_t> groups;
    std::vector<uint64_t> starts;
    int index = 0;
    auto flush = [&]() -> absl::Status {
      if (tokens.empty()) return absl::OkStatus();
      char name[64];
      std::snprintf(name, sizeof(name), "%s_%05d.bin", split, index);
      SATDAR_RETURN_IF_ERROR(WriteShard(tmp + "/" + name, tokens, starts, width, summary.vocab_size));
      nlohmann::json entry = {{"file", name}, {"split", split}, {"tokens", tokens.size()},
                              {"documents", starts.size()}};
      if (brown) {
        char pos_name[64];
        std::snprintf(pos_name, sizeof(pos_name), "%s_%05d.pos", split, index);
        SATDAR_RETURN_IF_ERROR(WriteShard(tmp + "/" + pos_name, groups, starts, 1, 0));
        entry["pos"] = pos_name;
      }
      shards.push_back(entry);
      (val_split ? summary.val_tokens : summary.train_tokens) += static_cast<int64_t>(tokens.size());
      ++summary.shards;
      ++index;
      tokens.clear();
      groups.clear();
      starts.clear();
      return absl::OkStatus();
    };
    // Documents are encoded in parallel, a chunk at a time, and appended in order.
    std::vector<const Document*> split_docs;
    for (const Document& d : docs) {
      if (d.val == val_split) split_docs.push_back(&d);
    }
    constexpr size_t kChunk = 64;
    std::vector<std::vector<int>> ids(kChunk), begins(kChunk), ends(kChunk);
    for (size_t c0 = 0; c0 < split_docs.size(); c0 += kChunk) {
      const size_t c1 = std::min(split_docs.size(), c0 + kChunk);
      pool.ParallelFor(static_cast<int64_t>(c1 - c0), [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          tokenizer->Encode(split_docs[c0 + k]->text, &ids[k], &begins[k], &ends[k]);
        }
      });
      for (size_t k = 0; k < c1 - c0; ++k) {
        const Document& d = *split_docs[c0 + k];
        starts.push_back(tokens.size());
        size_t w = 0;
        for (size_t i = 0; i < ids[k].size(); ++i) {
          tokens.push_back(static_cast<uint32_t>(ids[k][i]));
          if (brown) groups.push_back(PieceGroup(d, begins[k][i], ends[k][i], &w));
        }
        tokens.push_back(static_cast<uint32_t>(eos));  // end of document
        if (brown) groups.push_back(kPosNone);
        done += static_cast<int64_t>(d.text.size());
        if (static_cast<int64_t>(tokens.size()) >= o.shard_tokens) SATDAR_RETURN_IF_ERROR(flush());
      }
      progress.Update("tokenize", std::min(done, text_bytes));
    }
    SATDAR_RETURN_IF_ERROR(flush());
  }
  progress.Update("tokenize", text_bytes);
  nlohmann::json manifest = {
      {"version", kManifestVersion},
      {"tokenizer", "tokenizer.model"},
      {"vocab_size", summary.vocab_size},
      {"token_bytes", width},
      {"eos_id", eos},
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
  summary.seconds = progress.Seconds();
  return summary;
}

}  // namespace

absl::StatusOr<PrepSummary> Prep(const PrepOptions& o) {
  if (o.inputs.empty()) return absl::InvalidArgumentError("satdar prep: give at least one --input");
  if (o.tokenizer.empty() && o.vocab_size < 260) {
    return absl::InvalidArgumentError(
        "satdar prep: give --vocab-size N (>= 260: byte fallback needs 256 pieces plus the "
        "special ones) or an existing model with --tokenizer");
  }
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    return absl::InvalidArgumentError("satdar prep: --val-fraction must be in [0, 1)");
  }
  if (o.format != "auto" && o.format != "text" && o.format != "brown" && o.format != "jsonl") {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar prep: --format must be auto, text, brown or jsonl, got '", o.format, "'"));
  }
  if (o.jsonl_key.empty()) return absl::InvalidArgumentError("satdar prep: --jsonl-key is empty");
  struct stat st;
  if (::stat(o.out.c_str(), &st) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out: ", o.out, " already exists; choose a new folder (prep never overwrites)"));
  }
  // Missing parent folders are created, as mkdir -p does (out/ on a fresh clone).
  std::string parent = o.out;
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  const size_t slash = parent.rfind('/');
  parent = slash == std::string::npos ? "." : slash == 0 ? "/" : parent.substr(0, slash);
  if (absl::Status made = core::MakeDirs(parent); !made.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--out: ", made.message()));
  }
  TmpDir tmp(absl::StrCat(o.out, ".tmp.", ::getpid()));
  if (::mkdir(tmp.path().c_str(), 0755) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--out: cannot create ", tmp.path()));
  }
  SATDAR_ASSIGN_OR_RETURN(PrepSummary summary, PrepInto(o, tmp.path()));
  if (::rename(tmp.path().c_str(), o.out.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("--out: cannot rename ", tmp.path(), " to ", o.out));
  }
  tmp.Commit();
  return summary;
}

}  // namespace satdar::data
