#include "data/prep_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/json.h"
#include "data/corpus.h"
#include "nlohmann/json.hpp"

namespace satdar::data {

namespace {

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsJsonlName(const std::string& name) {
  return name.size() > 6 && name.compare(name.size() - 6, 6, ".jsonl") == 0;
}

// A file as chunks of about kPieceBytes ending at a line end.
class ChunkReader {
 public:
  ~ChunkReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  absl::Status Open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs: cannot open ", path, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  // The next chunk's raw bytes; false at the end. whole_lines: a line is never cut (JSONL).
  absl::StatusOr<bool> Next(std::string* out, bool whole_lines) {
    SATDAR_RETURN_IF_ERROR(Fill(kPieceBytes));
    if (buf_.empty()) return false;
    size_t cut;
    if (eof_ && buf_.size() <= kPieceBytes) {
      cut = buf_.size();
    } else if (size_t nl = buf_.rfind('\n', kPieceBytes - 1); nl != std::string::npos) {
      cut = nl + 1;
    } else if (whole_lines) {
      size_t from = kPieceBytes;
      while (true) {
        const size_t end = buf_.find('\n', from);
        if (end != std::string::npos) {
          cut = end + 1;
          break;
        }
        if (eof_) {
          cut = buf_.size();
          break;
        }
        if (buf_.size() > kMaxJsonlLine) {
          return absl::InvalidArgumentError(absl::StrCat(
              "inputs: ", path_, " line ", lines_ + 1, " is longer than ", kMaxJsonlLine >> 20,
              " MiB (one JSONL document per line)"));
        }
        from = buf_.size();
        SATDAR_RETURN_IF_ERROR(Fill(buf_.size() + kPieceBytes));
      }
    } else {
      // A line longer than a piece: cut after a space, else before a byte that starts a
      // character (never inside a UTF-8 sequence).
      cut = buf_.rfind(' ', kPieceBytes - 1);
      if (cut != std::string::npos && cut > 0) {
        ++cut;
      } else {
        cut = kPieceBytes;
        for (int k = 0; k < 3 && (static_cast<unsigned char>(buf_[cut]) & 0xc0) == 0x80; ++k) --cut;
      }
    }
    out->assign(buf_, 0, cut);
    buf_.erase(0, cut);
    lines_ += std::count(out->begin(), out->end(), '\n');
    return true;
  }

 private:
  absl::Status Fill(size_t want) {
    while (!eof_ && buf_.size() < want) {
      const size_t old = buf_.size();
      buf_.resize(old + kPieceBytes);
      const ssize_t n = ::read(fd_, &buf_[old], kPieceBytes);
      if (n < 0 && errno == EINTR) {
        buf_.resize(old);
        continue;
      }
      if (n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("inputs: cannot read ", path_, ": ", std::strerror(errno)));
      }
      buf_.resize(old + static_cast<size_t>(n));
      if (n == 0) eof_ = true;
    }
    return absl::OkStatus();
  }

  std::string path_;
  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
  int64_t lines_ = 0;
};

// The document of one JSONL line, or an error naming the file and line.
absl::Status JsonlDocument(const PrepOptions& o, const std::string& name, int64_t line_no,
                           absl::string_view line, std::string* doc) {
  const std::string where = absl::StrCat("inputs: ", name, " line ", line_no);
  SATDAR_ASSIGN_OR_RETURN(nlohmann::json j, core::ParseJson(line, where));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object (one document per line)"));
  }
  const auto it = j.find(o.jsonl_key);
  if (it == j.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the object has no \"", o.jsonl_key, "\" field (the text's key: jsonl_key)"));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field \"", o.jsonl_key, "\" is not a string"));
  }
  *doc = it->get<std::string>();
  if (doc->find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field \"", o.jsonl_key, "\" holds a NUL character"));
  }
  return absl::OkStatus();
}

// Calls fn(line_no, line) for each non-blank line of a decoded chunk; *line_no counts on.
template <typename Fn>
absl::Status ForEachLine(absl::string_view text, int64_t* line_no, Fn fn) {
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == absl::string_view::npos) eol = text.size();
    const absl::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++*line_no;
    if (line.find_first_not_of(" \t\r\f") == absl::string_view::npos) continue;
    SATDAR_RETURN_IF_ERROR(fn(*line_no, line));
  }
  return absl::OkStatus();
}

// Brown text: one sentence per line, words joined by spaces, each word's group recorded.
void BrownPiece(absl::string_view tagged, TextPiece* p) {
  p->text.clear();
  p->words.clear();
  size_t pos = 0;
  while (pos < tagged.size()) {
    size_t eol = tagged.find('\n', pos);
    if (eol == absl::string_view::npos) eol = tagged.size();
    std::vector<TaggedWord> words = ParseBrownLine(tagged.substr(pos, eol - pos));
    for (size_t i = 0; i < words.size(); ++i) {
      if (i > 0) p->text.push_back(' ');
      const int begin = static_cast<int>(p->text.size());
      p->text += words[i].word;
      p->words.push_back({begin, static_cast<int>(p->text.size()), words[i].group});
    }
    if (!words.empty()) p->text.push_back('\n');
    pos = eol + 1;
  }
}

// One file's decoding, summed over its chunks.
struct FileScan {
  DecodeStats stats;
  int64_t bytes = 0;
  int64_t first_invalid = -1;
  std::vector<std::string> documents;  // their names
  absl::Status error;  // the first bad JSONL line (reported unless the file is binary)
};

absl::Status Warn(const std::string& name, const std::string& why, PrepSummary* summary) {
  std::fprintf(stderr, "prep: warning: skipping %s: %s\n", name.c_str(), why.c_str());
  summary->decoded.push_back({name, 0, why});
  return absl::OkStatus();
}

absl::Status StrictRefusal(const Source& s, const FileScan& f) {
  auto refuse = [&](int64_t at, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs: ", s.name, " is not text: ", what, " at offset ", at,
        " (strict_utf8; binary files, or a prepared dataset without its manifest.json, "
        "cannot be read as text)"));
  };
  if (f.stats.first_nul >= 0) return refuse(f.stats.first_nul, "a NUL byte");
  if (f.first_invalid >= 0) return refuse(f.first_invalid, "a byte sequence that is not UTF-8");
  if (f.stats.controls > f.bytes / 100) return refuse(0, "control characters");
  return absl::OkStatus();
}

absl::StatusOr<FileScan> ScanFile(const PrepOptions& o, const Source& s) {
  FileScan f;
  ChunkReader reader;
  SATDAR_RETURN_IF_ERROR(reader.Open(s.name));
  std::string raw;
  int64_t line_no = 0;
  bool has_text = false;
  TextPiece brown;
  while (true) {
    SATDAR_ASSIGN_OR_RETURN(const bool more, reader.Next(&raw, s.kind == SourceKind::kJsonl));
    if (!more) break;
    DecodeStats st;
    const std::string text = DecodeText(raw, &st, /*at_start=*/f.bytes == 0);
    if (st.first_nul >= 0 && f.stats.first_nul < 0) f.stats.first_nul = f.bytes + st.first_nul;
    if (st.first_invalid >= 0 && f.first_invalid < 0) f.first_invalid = f.bytes + st.first_invalid;
    f.stats.replaced += st.replaced;
    f.stats.invalid_bytes += st.invalid_bytes;
    f.stats.controls += st.controls;
    f.stats.bom |= st.bom;
    f.stats.crlf |= st.crlf;
    f.bytes += static_cast<int64_t>(raw.size());
    if (s.kind == SourceKind::kJsonl) {
      if (!f.error.ok()) continue;
      f.error = ForEachLine(text, &line_no, [&](int64_t n, absl::string_view line) {
        std::string doc;
        SATDAR_RETURN_IF_ERROR(JsonlDocument(o, s.name, n, line, &doc));
        if (!doc.empty()) f.documents.push_back(absl::StrCat(s.name, ":", n));
        return absl::OkStatus();
      });
    } else if (s.kind == SourceKind::kBrown) {
      BrownPiece(text, &brown);
      has_text |= !brown.text.empty();
    } else {
      has_text |= !text.empty();
    }
  }
  if (s.kind != SourceKind::kJsonl && has_text) f.documents.push_back(s.name);
  return f;
}

}  // namespace

std::string DocumentName(const TextPiece& p) {
  return p.line > 0 ? absl::StrCat(p.source->name, ":", p.line) : p.source->name;
}

absl::StatusOr<std::vector<Source>> ListSources(const PrepOptions& o) {
  std::vector<Source> sources;
  std::map<std::pair<dev_t, ino_t>, std::string> seen;
  for (const std::string& input : o.inputs) {
    std::vector<std::string> names;
    bool brown = o.format == "brown";
    if (IsDir(input)) {
      SATDAR_ASSIGN_OR_RETURN(std::vector<std::string> listed, ListFiles(input, "inputs"));
      SATDAR_RETURN_IF_ERROR(CheckNotPreparedDataset(input, listed, "inputs"));
      if (o.format == "auto") brown = std::count(listed.begin(), listed.end(), "cats.txt") > 0;
      for (const std::string& n : listed) {
        if (!brown || IsBrownFile(n)) names.push_back(input + "/" + n);
      }
    } else {
      names.push_back(input);
    }
    for (const std::string& name : names) {
      struct stat st;
      if (::stat(name.c_str(), &st) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("inputs: cannot read ", name, ": ", std::strerror(errno)));
      }
      auto [it, inserted] = seen.emplace(std::make_pair(st.st_dev, st.st_ino), name);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "inputs: ", name, " is the same file as ", it->second,
            " (given twice, it would be trained on twice)"));
      }
      Source s;
      s.name = name;
      s.bytes = static_cast<int64_t>(st.st_size);
      s.kind = brown                                                     ? SourceKind::kBrown
               : o.format == "jsonl" || (o.format == "auto" && IsJsonlName(name)) ? SourceKind::kJsonl
                                                                         : SourceKind::kText;
      sources.push_back(std::move(s));
    }
  }
  return sources;
}

absl::Status ScanSources(const PrepOptions& o, std::vector<Source>* sources,
                         PrepSummary* summary,
                         const std::function<void(const std::string&)>& on_document) {
  for (Source& s : *sources) {
    SATDAR_ASSIGN_OR_RETURN(const FileScan f, ScanFile(o, s));
    summary->bytes += f.bytes;
    if (o.strict_utf8) SATDAR_RETURN_IF_ERROR(StrictRefusal(s, f));
    if (f.bytes == 0) {
      s.skipped = true;
      SATDAR_RETURN_IF_ERROR(Warn(s.name, "empty", summary));
      continue;
    }
    const std::string binary = BinaryReason(f.stats, static_cast<size_t>(f.bytes));
    if (!binary.empty()) {
      s.skipped = true;
      SATDAR_RETURN_IF_ERROR(Warn(s.name, absl::StrCat("binary (", binary, ")"), summary));
      continue;
    }
    SATDAR_RETURN_IF_ERROR(f.error);
    ++summary->files;
    summary->bom_files += f.stats.bom;
    summary->crlf_files += f.stats.crlf;
    summary->documents += static_cast<int64_t>(f.documents.size());
    for (const std::string& name : f.documents) on_document(name);
    if (f.stats.replaced > 0) {
      summary->replaced += f.stats.replaced;
      summary->decoded.push_back({s.name, f.stats.replaced, ""});
    }
  }
  return absl::OkStatus();
}

absl::Status ForEachPiece(const PrepOptions& o, const std::vector<Source>& sources,
                          const std::function<absl::Status(TextPiece&)>& fn) {
  int64_t doc = 0;
  for (const Source& s : sources) {
    if (s.skipped) continue;
    ChunkReader reader;
    SATDAR_RETURN_IF_ERROR(reader.Open(s.name));
    std::string raw;
    int64_t line_no = 0, offset = 0;
    TextPiece piece, pending;  // a text document's pieces go out one behind, to mark the last
    bool has_pending = false;
    while (true) {
      SATDAR_ASSIGN_OR_RETURN(const bool more, reader.Next(&raw, s.kind == SourceKind::kJsonl));
      if (!more) break;
      DecodeStats st;
      std::string text = DecodeText(raw, &st, /*at_start=*/offset == 0);
      offset += static_cast<int64_t>(raw.size());
      if (s.kind == SourceKind::kJsonl) {
        SATDAR_RETURN_IF_ERROR(ForEachLine(text, &line_no, [&](int64_t n, absl::string_view line) {
          TextPiece p;
          SATDAR_RETURN_IF_ERROR(JsonlDocument(o, s.name, n, line, &p.text));
          if (p.text.empty()) return absl::OkStatus();
          p.source = &s;
          p.doc = doc++;
          p.line = n;
          p.last = true;
          return fn(p);
        }));
        continue;
      }
      piece = TextPiece();
      piece.source = &s;
      piece.doc = doc;
      if (s.kind == SourceKind::kBrown) {
        BrownPiece(text, &piece);
      } else {
        piece.text = std::move(text);
      }
      if (piece.text.empty()) continue;
      if (has_pending) SATDAR_RETURN_IF_ERROR(fn(pending));
      pending = std::move(piece);
      has_pending = true;
    }
    if (has_pending) {
      pending.last = true;
      SATDAR_RETURN_IF_ERROR(fn(pending));
      ++doc;
    }
  }
  return absl::OkStatus();
}

}  // namespace satdar::data
