// cli/tokenizer_process.h: a SentencePiece tokenizer for the `satdar` program, served by
// `satdar-prep tokenize --tokenizer M` in a child process (cli/prep_main.cc speaks the protocol:
// one JSON line per request and per reply).
//
//   SATDAR_ASSIGN_OR_RETURN(std::string model, ResolveTokenizerPath(tokenizer_flag, data_dir));
//   SATDAR_ASSIGN_OR_RETURN(auto tok, TokenizerProcess::Start(model));
//   SATDAR_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode("The jury"));
#ifndef SATDAR_CLI_TOKENIZER_PROCESS_H_
#define SATDAR_CLI_TOKENIZER_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace satdar::cli {

// A SentencePiece model served by `satdar-prep tokenize` in a child process (SentencePiece cannot
// be linked into `satdar`, cli/cli.cc says why). One request is in flight at a time (calls from
// several threads take turns). When the child has died, every call fails with Internal naming
// the model, never hangs.
class TokenizerProcess {
 public:
  // Starts the child on the .model at `model_path`; InvalidArgument naming the file if it is not one.
  // satdar-prep is looked up beside this program (/proc/self/exe), as `satdar prep` does.
  static absl::StatusOr<std::unique_ptr<TokenizerProcess>> Start(const std::string& model_path);
  // The same with an explicit satdar-prep binary (tests).
  static absl::StatusOr<std::unique_ptr<TokenizerProcess>> Start(const std::string& model_path,
                                                                 const std::string& prep_binary);
  ~TokenizerProcess();  // closes the pipes and reaps the child
  TokenizerProcess(const TokenizerProcess&) = delete;
  TokenizerProcess& operator=(const TokenizerProcess&) = delete;

  // No BOS/EOS added. Text that is not valid UTF-8 is read with each invalid sequence replaced
  // by U+FFFD (JSON carries only UTF-8), as `satdar prep` reads its inputs.
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text);
  // InvalidArgument for an id outside [0, vocab_size()). Control ids (EOS) decode to nothing.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids);
  int vocab_size() const { return vocab_size_; }
  int eos_id() const { return eos_id_; }
  const std::string& model_path() const { return model_path_; }
  pid_t pid() const { return pid_; }  // the child's process id

  // Streaming output of generated tokens. Decoding one token alone loses its leading space
  // ("▁the" -> "the" at the start of a text), so this decodes the whole sequence `ids` (the
  // prompt's ids too, if the prompt was printed as *printed) and returns what it adds after
  // *printed, then sets *printed to everything printed so far:
  //
  //   std::string printed;
  //   on each new token: ids.push_back(id); std::cout << *tok->NewText(ids, &printed);
  //   at the end:        std::cout << *tok->NewText(ids, &printed, /*final=*/true);
  //
  // Trailing U+FFFD characters are held back until a later call (they may be the first bytes
  // of a character whose remaining bytes are still to come, which SentencePiece decodes as one
  // U+FFFD per byte); `final` prints them. When the decoding does not extend *printed, the
  // result is "" and *printed is unchanged (wait for more tokens).
  absl::StatusOr<std::string> NewText(const std::vector<int32_t>& ids, std::string* printed,
                                      bool final = false);

 private:
  TokenizerProcess() = default;
  // One request line out, one reply line back; Internal naming the model if the child is gone.
  absl::StatusOr<std::string> Call(const std::string& request);
  absl::Status WriteAll(const std::string& bytes);
  absl::StatusOr<std::string> ReadLine();
  // Marks the child dead and says why (its exit status when it has ended).
  absl::Status Died(const std::string& what);

  std::string model_path_;
  pid_t pid_ = -1;
  int to_child_ = -1;    // the child's stdin
  int from_child_ = -1;  // the child's stdout
  bool reaped_ = false;
  bool dead_ = false;
  std::string buffer_;   // bytes read past the last reply line
  int vocab_size_ = 0;
  int eos_id_ = 2;
  std::mutex mu_;        // one request at a time
};

// The tokenizer of --tokenizer M, or of --data DIR (its manifest's tokenizer file): exactly one
// of the two non-empty, else InvalidArgument naming the flags.
absl::StatusOr<std::string> ResolveTokenizerPath(const std::string& tokenizer_flag,
                                                 const std::string& data_dir);
// InvalidArgument "tokenizer M has V pieces but the config's vocab_size is N" when the tokenizer
// has more pieces than the model's vocab_size (fewer is fine: prep pads).
absl::Status CheckTokenizerFits(const std::string& model_path, int tokenizer_vocab, int model_vocab);

}  // namespace satdar::cli

#endif  // SATDAR_CLI_TOKENIZER_PROCESS_H_
