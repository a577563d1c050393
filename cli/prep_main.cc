// satdar-prep: `satdar prep` (cli/cmd_prep.cc) as a program of its own, which `satdar prep`
// runs (cli/cli.cc says why: SentencePiece and gRPC each bring a protobuf).
//
// Its hidden mode `satdar-prep tokenize --tokenizer M` serves a SentencePiece model to the
// `satdar` program (cli/tokenizer_process.h) over stdin and stdout, one JSON line each way:
//   first line out:  {"vocab_size":V,"eos_id":E}, or {"error":"..."} and exit code 2
//   {"encode":"text"} -> {"ids":[...]}      (no BOS/EOS added)
//   {"decode":[ids]}  -> {"text":"..."}
//   anything else     -> {"error":"..."}    (and it keeps serving)
// It ends with code 0 at the end of its input.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/terminate_handler.h"
#include "data/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

// One reply line, flushed at once (the parent waits for it). Invalid UTF-8 becomes U+FFFD
// rather than an exception, which would abort (the build has none).
void Reply(const nlohmann::json& j) {
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

nlohmann::json Error(const std::string& message) { return {{"error", message}}; }

nlohmann::json Answer(const satdar::data::Tokenizer& tokenizer, const std::string& line) {
  const nlohmann::json request = nlohmann::json::parse(line, nullptr, false);
  if (request.is_discarded()) return Error("a request must be one line of JSON");
  if (!request.is_object() || request.size() != 1) {
    return Error("a request is {\"encode\":\"text\"} or {\"decode\":[ids]}");
  }
  if (request.contains("encode")) {
    if (!request["encode"].is_string()) return Error("encode takes a string");
    std::vector<int> ids, begins, ends;
    tokenizer.Encode(request["encode"].get<std::string>(), &ids, &begins, &ends);
    return {{"ids", ids}};
  }
  if (request.contains("decode")) {
    if (!request["decode"].is_array()) return Error("decode takes a list of ids");
    std::vector<int> ids;
    ids.reserve(request["decode"].size());
    const int64_t vocab = tokenizer.vocab_size();
    for (const nlohmann::json& id : request["decode"]) {
      // SentencePiece does not check ids: one past the end would read past its table.
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
        return Error("decode: " + id.dump() + " is not an id in [0, " + std::to_string(vocab) +
                     ")");
      }
      ids.push_back(static_cast<int>(id.get<int64_t>()));
    }
    return {{"text", tokenizer.Decode(ids)}};
  }
  return Error("a request is {\"encode\":\"text\"} or {\"decode\":[ids]}");
}

int ServeTokenizer(const std::vector<std::string>& args) {
  std::string model;
  if (args.size() == 3 && args[1] == "--tokenizer") {
    model = args[2];
  } else if (args.size() == 2 && args[1].rfind("--tokenizer=", 0) == 0) {
    model = args[1].substr(12);
  } else {
    Reply(Error("usage: satdar-prep tokenize --tokenizer MODEL"));
    return 2;
  }
  std::string error;
  std::unique_ptr<satdar::data::Tokenizer> tokenizer = satdar::data::Tokenizer::Load(model, &error);
  if (tokenizer == nullptr) {
    Reply(Error(error));
    return 2;
  }
  Reply({{"vocab_size", tokenizer->vocab_size()}, {"eos_id", tokenizer->eos_id()}});
  std::string line;
  while (std::getline(std::cin, line)) Reply(Answer(*tokenizer, line));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  satdar::cli::InstallTerminateHandler();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "tokenize") return ServeTokenizer(args);
  const absl::Status status = satdar::cli::RunPrep(args);
  if (!status.ok()) {
    std::fprintf(stderr, "satdar prep: error: %s\n", std::string(status.message()).c_str());
    return satdar::cli::ExitCodeFor(status);
  }
  return 0;
}
