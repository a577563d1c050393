#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "data/tokenizer.h"


namespace satdar::data {

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
Tokenizer::~Tokenizer() = default;

bool Tokenizer::Train(const std::string& text_file, const std::string& model_prefix,
                      int vocab_size, int threads, std::string* error) {
  // BPE as the SATFormer and DAR setups use; byte fallback keeps every input encodable; the
  // special ids follow Llama (unk 0, bos 1, eos 2, no pad).
  const std::string args =
      "--input=" + text_file + " --model_prefix=" + model_prefix +
      " --vocab_size=" + std::to_string(vocab_size) +
      " --model_type=bpe --character_coverage=1.0 --byte_fallback=true"
      " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --num_threads=" + std::to_string(threads) +
      " --input_sentence_size=2000000 --shuffle_input_sentence=true"
      " --max_sentence_length=16384 --minloglevel=2";
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) {
    *error = "tokenizer training failed: " + status.ToString();
    return false;
  }
  return true;
}

std::unique_ptr<Tokenizer> Tokenizer::Load(const std::string& model_path, std::string* error) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const auto status = t->sp_->Load(model_path);
  if (!status.ok()) {
    *error = model_path + " is not a SentencePiece model: " + status.ToString();
    return nullptr;
  }
  return t;
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

int Tokenizer::eos_id() const { return sp_->eos_id(); }

void Tokenizer::Encode(const std::string& text, std::vector<int>* ids, std::vector<int>* begins,
                       std::vector<int>* ends) const {
  const auto spt = sp_->EncodeAsImmutableProto(text);
  ids->clear();
  begins->clear();
  ends->clear();
  for (const auto& piece : spt.pieces()) {
    ids->push_back(static_cast<int>(piece.id()));
    begins->push_back(static_cast<int>(piece.begin()));
    ends->push_back(static_cast<int>(piece.end()));
  }
}

std::string Tokenizer::Piece(int id) const { return sp_->IdToPiece(id); }

std::string Tokenizer::Decode(const std::vector<int>& ids) const {
  std::string text;
  sp_->Decode(ids, &text).IgnoreError();
  return text;
}

}  // namespace satdar::data
