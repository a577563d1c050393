// data/tokenizer.h: SentencePiece BPE models (libsentencepiece): train one on a text file, or
// load a .model, and encode text into ids with the byte offset where each piece starts (to
// carry word-level annotations such as POS tags over to the tokens).
// Ids follow the Llama convention: 0 <unk>, 1 <s>, 2 </s> (end of document); byte fallback
// keeps every input representable.
//
// This header and tokenizer.cc use no Abseil: libsentencepiece's headers declare their own
// absl::string_view, which clashes with Debian's Abseil, so errors come back as strings.
#ifndef SATDAR_DATA_TOKENIZER_H_
#define SATDAR_DATA_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace satdar::data {

class Tokenizer {
 public:
  // Trains a BPE model on the lines of text_file and writes <model_prefix>.model; returns
  // false and sets *error on failure.
  static bool Train(const std::string& text_file, const std::string& model_prefix,
                    int vocab_size, int threads, std::string* error);
  // Null (and *error set) when model_path is not a SentencePiece model.
  static std::unique_ptr<Tokenizer> Load(const std::string& model_path, std::string* error);

  ~Tokenizer();

  int vocab_size() const;
  int eos_id() const;
  // ids of text; piece i's surface is text[begins[i], ends[i]) (a word-initial piece such as
  // "▁the" starts on the space before its word).
  void Encode(const std::string& text, std::vector<int>* ids, std::vector<int>* begins,
              std::vector<int>* ends) const;
  std::string Decode(const std::vector<int>& ids) const;
  // The piece of an id as the model stores it ("▁the", "<0x0A>").
  std::string Piece(int id) const;

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace satdar::data

#endif  // SATDAR_DATA_TOKENIZER_H_
