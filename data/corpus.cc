#include "data/corpus.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "data/pos.h"

namespace satdar::data {

absl::StatusOr<CorpusFormat> ParseCorpusFormat(const std::string& name) {
  if (name == "auto") return CorpusFormat::kAuto;
  if (name == "text") return CorpusFormat::kText;
  if (name == "brown") return CorpusFormat::kBrown;
  return absl::InvalidArgumentError(
      absl::StrCat("data_format: expected auto, text or brown, got '", name, "'"));
}

std::string StripBrownTags(const std::string& tagged) {
  std::string out;
  size_t pos = 0;
  while (pos < tagged.size()) {
    size_t eol = tagged.find('\n', pos);
    if (eol == std::string::npos) eol = tagged.size();
    std::vector<TaggedWord> words = ParseBrownLine(absl::string_view(tagged).substr(pos, eol - pos));
    for (size_t i = 0; i < words.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += words[i].word;
    }
    if (!words.empty()) out.push_back('\n');
    pos = eol + 1;
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& dir,
                                                   const std::string& flag) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot open folder ", dir));
  }
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.empty() || name[0] == '.') continue;
    struct stat st;
    if (::stat((dir + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status CheckIsText(const std::string& bytes, const std::string& path,
                         const std::string& flag, bool utf8) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  auto refuse = [&](size_t at, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", path, " is not text: ", what, " at offset ", at,
        " (binary files, or a prepared dataset without its manifest.json, cannot be read as "
        "text)"));
  };
  size_t controls = 0, first_control = 0;
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c == 0) return refuse(i, "a NUL byte");
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f') {
      if (controls++ == 0) first_control = i;
    }
    if (!utf8 || c < 0x80) {
      ++i;
      continue;
    }
    const size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    bool ok = len > 0 && i + len <= n && !(len == 2 && c < 0xc2);
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xc0) == 0x80;
    if (!ok) return refuse(i, "a byte sequence that is not UTF-8");
    i += len;
  }
  if (controls > n / 100) return refuse(first_control, "control characters");
  return absl::OkStatus();
}

namespace {

// The length of the well-formed UTF-8 sequence at p[0..n), or, when it is ill-formed, minus
// the length of its maximal subpart (at least 1): the bytes one U+FFFD replaces.
int Utf8Sequence(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;  // no UTF-16 surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
  } else {
    return -1;  // a continuation byte, an overlong lead (C0, C1) or F5..FF
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n) return -k;
    const unsigned char b = p[k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return -k;
  }
  return len;
}

}  // namespace

std::string DecodeText(absl::string_view bytes, DecodeStats* stats, bool at_start) {
  *stats = DecodeStats();
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), i = 0;
  if (at_start && n >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf) {
    stats->bom = true;
    i = 3;
  }
  std::string out;
  out.reserve(n);
  while (i < n) {
    const unsigned char c = p[i];
    if (c == '\r' && i + 1 < n && p[i + 1] == '\n') {
      stats->crlf = true;
      ++i;
      continue;
    }
    if (c == 0 && stats->first_nul < 0) stats->first_nul = static_cast<int64_t>(i);
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f') ++stats->controls;
    const int len = Utf8Sequence(p + i, n - i);
    if (len > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      if (stats->first_invalid < 0) stats->first_invalid = static_cast<int64_t>(i);
      ++stats->replaced;
      stats->invalid_bytes += -len;
      i += static_cast<size_t>(-len);
    }
  }
  return out;
}

std::string BinaryReason(const DecodeStats& stats, size_t size) {
  if (stats.first_nul >= 0) return absl::StrCat("a NUL byte at offset ", stats.first_nul);
  const int64_t bad = stats.invalid_bytes + stats.controls;
  if (size > 0 && bad * 4 > static_cast<int64_t>(size)) {
    return absl::StrCat(bad * 100 / static_cast<int64_t>(size),
                        "% of its bytes are not UTF-8 text");
  }
  return "";
}

absl::Status CheckNotPreparedDataset(const std::string& dir, const std::vector<std::string>& names,
                                     const std::string& flag) {
  const bool manifest = std::count(names.begin(), names.end(), "manifest.json") > 0;
  for (const std::string& name : names) {
    const bool shard = (name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0) &&
                       name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0;
    if (name != "tokenizer.model" && !shard) continue;
    if (manifest) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": ", dir, " is a dataset written by satdar prep (it holds manifest.json and ",
          name, "), not text"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", dir, " holds ", name, " like a dataset written by satdar prep, but its "
        "manifest.json is missing (it is written last: was prep interrupted?)"));
  }
  return absl::OkStatus();
}

bool IsBrownFile(const std::string& name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
         std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

absl::StatusOr<Corpus> LoadCorpus(const std::string& dir, CorpusFormat format) {
  auto listed = ListFiles(dir, "data_dir");
  if (!listed.ok()) return listed.status();
  const std::vector<std::string>& names = *listed;
  SATDAR_RETURN_IF_ERROR(CheckNotPreparedDataset(dir, names, "data_dir"));
  if (format == CorpusFormat::kAuto) {
    bool brown = std::find(names.begin(), names.end(), "cats.txt") != names.end();
    format = brown ? CorpusFormat::kBrown : CorpusFormat::kText;
  }
  Corpus corpus;
  corpus.format = format;
  for (const std::string& name : names) {
    if (format == CorpusFormat::kBrown && !IsBrownFile(name)) continue;  // index, README
    auto text = core::ReadFileToString(dir + "/" + name, core::kNoSizeLimit);
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("data_dir: ", text.status().message()));
    SATDAR_RETURN_IF_ERROR(CheckIsText(*text, dir + "/" + name, "data_dir", /*utf8=*/false));
    std::string clean = format == CorpusFormat::kBrown ? StripBrownTags(*text) : *text;
    corpus.bytes.insert(corpus.bytes.end(), clean.begin(), clean.end());
    ++corpus.num_files;
  }
  if (corpus.bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("data_dir: no text found in ", dir));
  }
  return corpus;
}

}  // namespace satdar::data
