// data/prep_input.h: the documents of `satdar prep`'s inputs, read as a stream in bounded
// memory (data/prep.h says what a document is).
//
//   SATDAR_ASSIGN_OR_RETURN(std::vector<Source> sources, ListSources(options));
//   SATDAR_RETURN_IF_ERROR(ScanSources(options, &sources, &summary));   // decode, validate
//   SATDAR_RETURN_IF_ERROR(ForEachPiece(options, sources, [&](TextPiece& p) { ... }));
//
// A file is read in chunks of about kPieceBytes that end at a line end (a line longer than
// that is cut at a space, or at an ASCII byte), each decoded on its own (corpus.h DecodeText).
// A piece is such a chunk of a text or Brown document, or one JSONL line. Memory is bounded by
// a few pieces whatever the size of a file, except for one JSONL line, at most kMaxJsonlLine.
#ifndef SATDAR_DATA_PREP_INPUT_H_
#define SATDAR_DATA_PREP_INPUT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/pos.h"
#include "data/prep.h"

namespace satdar::data {

inline constexpr size_t kPieceBytes = size_t{1} << 20;
inline constexpr size_t kMaxJsonlLine = size_t{256} << 20;

enum class SourceKind { kText, kBrown, kJsonl };

// One input file.
struct Source {
  std::string name;  // as given: FILE, or FOLDER/NAME
  SourceKind kind = SourceKind::kText;
  int64_t bytes = 0;
  bool skipped = false;  // binary or empty (ScanSources)
};

struct Word {
  int begin, end;  // byte range in the piece's text
  PosGroup group;
};

// A piece of one document.
struct TextPiece {
  const Source* source = nullptr;
  int64_t doc = 0;       // the document's ordinal over all inputs
  int64_t line = 0;      // JSONL: the document's line (1-based); 0 otherwise
  std::string text;      // decoded UTF-8
  std::vector<Word> words;  // Brown: the words of `text` with their groups
  bool last = false;     // the document's last piece
};

// The document's name: the split is a keyed hash of it ("FILE", or "FILE:LINE" for JSONL).
std::string DocumentName(const TextPiece& piece);

// The input files in order: folders listed (sorted, not recursive; the Brown corpus folder by
// its cats.txt keeps only its text files), a prepared dataset refused, the same file given
// twice refused.
absl::StatusOr<std::vector<Source>> ListSources(const PrepOptions& options);

// Reads every source once: decode statistics into the summary (per file), binary and empty
// files marked skipped (with a warning), JSONL lines validated (errors name file and line),
// --strict-utf8 enforced, and summary->documents counted.
// on_document gets each document's name (DocumentName), in order.
absl::Status ScanSources(const PrepOptions& options, std::vector<Source>* sources,
                         PrepSummary* summary,
                         const std::function<void(const std::string&)>& on_document);

// Every piece of every document of the sources not skipped, in order. Pieces without text are
// not passed, but a document's last piece always is (possibly empty) when it had text.
absl::Status ForEachPiece(const PrepOptions& options, const std::vector<Source>& sources,
                          const std::function<absl::Status(TextPiece&)>& fn);

}  // namespace satdar::data

#endif  // SATDAR_DATA_PREP_INPUT_H_
