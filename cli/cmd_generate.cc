// satdar generate: text from given weights, greedy or sampled, over the KV cache
// (runtime/generate.h; shared spec INTERFACES.md, "Generation and evaluation (v3)").
//
// Output. Without --json, one prompt is printed as it is decoded, then its completion as each
// token is chosen; several (--prompts) are printed as blocks "--- line L ---" followed by the
// prompt and its completion, each as soon as it is complete (prompts of equal length decode
// together, so blocks may come out of file order). With --json, one object per prompt per
// line, in input order, once all are done: {"prompt_ids", "ids", "text"}; "ids" are the new
// tokens and end with </s> when generation stopped there; "text" (only with a tokenizer) is the
// completion's text without the </s> and without ids the tokenizer lacks (the vocabulary's
// padding). Without a tokenizer only --prompt-ids can be given, and the text form prints ids:
// the prompt's, " |", then the new ones. stderr gets "N tokens in S s (X tokens/s)" at the end.
// Every input is checked, and every prompt encoded and measured, before anything is printed.
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/file_util.h"
#include "core/parse_number.h"
#include "model/memory_estimate.h"
#include "nlohmann/json.hpp"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/tokenizer_process.h"
#include "runtime/decode_session.h"
#include "runtime/generate.h"

namespace satdar::cli {

namespace {

constexpr char kDefaultMaxNewTokens[] = "64";
// A --prompts file is read whole; prompts beyond this are better split into several runs.
constexpr size_t kMaxPromptsFileBytes = size_t{64} << 20;

struct Prompt {
  std::vector<int32_t> ids;
  std::string text;   // as given (--prompt, a line of --prompts); empty for --prompt-ids
  std::string where;  // "--prompt", "--prompt-ids", "--prompts: line L of FILE"
  int line = 0;       // its line in --prompts (1-based), else 0
};

void Print(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

absl::StatusOr<std::vector<int32_t>> ParsePromptIds(const std::string& text, int vocab) {
  std::vector<int32_t> ids;
  int item = 0;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    ++item;
    auto id = core::ParseBoundedInt(absl::StrCat("--prompt-ids: item ", item),
                                    absl::StripAsciiWhitespace(part), 0, vocab - 1);
    if (!id.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          id.status().message(), " (ids are in [0, ", vocab, "), the config's vocab_size)"));
    }
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

// One prompt per line ("\r\n" endings too); an empty line is an error naming it.
absl::StatusOr<std::vector<Prompt>> ReadPromptsFile(const std::string& path) {
  auto content = core::ReadFileToString(path, kMaxPromptsFileBytes);
  if (!content.ok()) {
    return absl::Status(content.status().code(),
                        absl::StrCat("--prompts: ", content.status().message()));
  }
  std::vector<std::string> lines = absl::StrSplit(*content, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // the last line's newline
  std::vector<Prompt> prompts;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string line = lines[i];
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string where = absl::StrCat("--prompts: line ", i + 1, " of ", path);
    if (line.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is empty (one prompt per line, none empty)"));
    }
    prompts.push_back({{}, line, where, static_cast<int>(i + 1)});
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--prompts: ", path, " holds no prompt"));
  }
  return prompts;
}

// The ids the tokenizer has (padding ids of a larger vocab_size have no text), without a
// final </s>.
std::vector<int32_t> TextIds(const std::vector<int32_t>& prompt, const std::vector<int32_t>& out,
                             int eos, int tokenizer_vocab) {
  std::vector<int32_t> ids;
  for (int32_t id : prompt) {
    if (id < tokenizer_vocab) ids.push_back(id);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (i + 1 == out.size() && out[i] == eos) break;
    if (out[i] < tokenizer_vocab) ids.push_back(out[i]);
  }
  return ids;
}

// The completion's text: the decoding of prompt + completion after the prompt's own (so the
// completion keeps its leading space), or the completion decoded alone when the prompt's text
// is not a prefix of the whole.
absl::StatusOr<std::string> CompletionText(TokenizerProcess* tok,
                                           const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& out, int eos) {
  SATDAR_ASSIGN_OR_RETURN(std::string head,
                          tok->Decode(TextIds(prompt, {}, eos, tok->vocab_size())));
  SATDAR_ASSIGN_OR_RETURN(std::string whole,
                          tok->Decode(TextIds(prompt, out, eos, tok->vocab_size())));
  if (whole.compare(0, head.size(), head) == 0) return whole.substr(head.size());
  return tok->Decode(TextIds({}, out, eos, tok->vocab_size()));
}

std::string IdsText(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) absl::StrAppend(&s, s.empty() ? "" : " ", id);
  return s;
}

void DefineGenerateFlags(FlagSet* f) {
  FlagSet& flags = *f;
  flags.Define("--config", "model config JSON", true);
  flags.Define("--weights", "weights (safetensors: init, export, PyTorch, or a checkpoint file)");
  flags.Define("--checkpoint", "or: a checkpoint file or folder of any training layout");
  flags.Define("--tokenizer", "SentencePiece model (.model) for text prompts and output");
  flags.Define("--data", "or: a prepared dataset, whose tokenizer is used");
  flags.Define("--prompt", "one prompt (text; needs a tokenizer)");
  flags.Define("--prompts", "a file of prompts, one per line (needs a tokenizer)");
  flags.Define("--prompt-ids", "one prompt as token ids: I,J,K");
  flags.Define("--max-new-tokens", "new tokens per prompt, at most (stops earlier at </s>)",
               false, kDefaultMaxNewTokens);
  flags.Define("--temperature", "sampling temperature; 0 is greedy (the argmax)", false, "0");
  flags.Define("--top-k", "sample from the K most likely tokens only (0: all)", false, "0");
  flags.Define("--top-p", "sample from the smallest set of most likely tokens with mass >= P",
               false, "1");
  flags.Define("--seed", "sampling seed (prompt i samples from its own stream)", false, "0");
  flags.Define("--device", "cpu, cuda or cuda:N", false, "cpu");
  flags.Define("--dtype",
               "f32 or f64 on the cpu (default f32); bf16 or f32 on cuda (default bf16)");
  flags.Define("--threads", "CPU threads", false, "1");
  flags.DefineBool("--json", "one JSON object per prompt per line: prompt_ids, ids, text");
}

// The flags on their own, then the files, the config and the device.
absl::Status ReadGenerateFlags(const FlagSet& flags, runtime::SamplingOptions* sampling,
                               runtime::DecodeOptions* decode) {
  runtime::SamplingOptions& so = *sampling;
  runtime::DecodeOptions& o = *decode;

  // The flags on their own.
  if (flags.Has("--weights") == flags.Has("--checkpoint")) {
    return absl::InvalidArgumentError(
        "satdar generate: give exactly one of --weights W or --checkpoint CKPT");
  }
  const int prompt_flags =
      flags.Has("--prompt") + flags.Has("--prompts") + flags.Has("--prompt-ids");
  if (prompt_flags != 1) {
    return absl::InvalidArgumentError(
        "satdar generate: give exactly one of --prompt TEXT, --prompts FILE or --prompt-ids I,J,K");
  }
  if (!flags.Has("--tokenizer") && !flags.Has("--data") && !flags.Has("--prompt-ids")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar generate: ", flags.Has("--prompt") ? "--prompt" : "--prompts",
        " needs a tokenizer (--tokenizer M or --data DIR); without one give --prompt-ids"));
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t max_new, flags.GetInt("--max-new-tokens", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(so.temperature, flags.GetDouble("--temperature", 0));
  SATDAR_ASSIGN_OR_RETURN(int64_t top_k,
                          flags.GetInt("--top-k", 0, std::numeric_limits<int>::max()));
  SATDAR_ASSIGN_OR_RETURN(so.top_p, flags.GetDouble("--top-p", 0, false, 1));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0, kMaxSeed));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1, kMaxThreads));
  so.max_new_tokens = static_cast<int>(max_new);
  so.top_k = static_cast<int>(top_k);
  so.seed = static_cast<uint64_t>(seed);
  o.device = flags.Get("--device");
  auto device = core::ParseDevice(o.device);
  if (!device.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: expected cpu, cuda or cuda:N, got '", o.device, "'"));
  }
  const bool cuda = device->type == core::DeviceType::kCuda;
  const std::string dtype = flags.Has("--dtype") ? flags.Get("--dtype") : cuda ? "bf16" : "f32";
  if (cuda ? dtype != "bf16" && dtype != "f32" : dtype != "f32" && dtype != "f64") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: must be ", cuda ? "bf16 or f32 with --device cuda"
                                               : "f32 or f64 with --device cpu",
                     ", got '", dtype, "'"));
  }
  o.dtype = dtype == "bf16" ? core::DType::kBF16 : dtype == "f64" ? core::DType::kF64
                                                                 : core::DType::kF32;
  o.threads = static_cast<int>(threads);
  o.weights = flags.Get("--weights");
  o.checkpoint = flags.Get("--checkpoint");

  // The files, the config, the device.
  const std::vector<InputPath> inputs = {
      {"--config", flags.Get("--config")},
      {"--weights", o.weights},
      {"--checkpoint", o.checkpoint, InputPath::kFileOrFolder},
      {"--tokenizer", flags.Get("--tokenizer")},
      {"--data", flags.Get("--data"), InputPath::kFolder},
      {"--prompts", flags.Get("--prompts")}};
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  SATDAR_ASSIGN_OR_RETURN(o.config, model::LoadModelConfig(flags.Get("--config")));
  const int window = o.config.max_position_embeddings;
  if (so.max_new_tokens >= window) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-new-tokens ", so.max_new_tokens, " leaves no room for a prompt: the config's "
        "max_position_embeddings is ", window));
  }
  SATDAR_RETURN_IF_ERROR(core::CheckDeviceAvailable(*device));
  model::MemoryShape shape;
  shape.use = model::MemoryUse::kWeights;
  shape.dtype_bytes = dtype == "f64" ? 8 : 4;  // the host copy of the weights
  SATDAR_RETURN_IF_ERROR(
      model::CheckFitsInMemory(o.config, shape, 1, "satdar generate", kCliBatchNames));

  return absl::OkStatus();
}

// The tokenizer (none for --prompt-ids alone) and the prompts, each encoded and measured
// against the window; so->eos_id is the tokenizer's.
absl::Status ReadPrompts(const FlagSet& flags, const runtime::DecodeOptions& o,
                         runtime::SamplingOptions* sampling,
                         std::unique_ptr<TokenizerProcess>* tokenizer, std::vector<Prompt>* list) {
  runtime::SamplingOptions& so = *sampling;
  std::unique_ptr<TokenizerProcess>& tok = *tokenizer;
  std::vector<Prompt>& prompts = *list;
  const int window = o.config.max_position_embeddings;
  if (flags.Has("--tokenizer") || flags.Has("--data")) {
    SATDAR_ASSIGN_OR_RETURN(const std::string model_path,
                            ResolveTokenizerPath(flags.Get("--tokenizer"), flags.Get("--data")));
    SATDAR_ASSIGN_OR_RETURN(tok, TokenizerProcess::Start(model_path));
    SATDAR_RETURN_IF_ERROR(
        CheckTokenizerFits(model_path, tok->vocab_size(), o.config.vocab_size));
    so.eos_id = tok->eos_id();
  }
  if (flags.Has("--prompts")) {
    SATDAR_ASSIGN_OR_RETURN(prompts, ReadPromptsFile(flags.Get("--prompts")));
  } else if (flags.Has("--prompt")) {
    prompts.push_back({{}, flags.Get("--prompt"), "--prompt", 0});
  } else {
    SATDAR_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                            ParsePromptIds(flags.Get("--prompt-ids"), o.config.vocab_size));
    prompts.push_back({std::move(ids), "", "--prompt-ids", 0});
  }
  const int max_prompt = window - so.max_new_tokens;
  for (Prompt& p : prompts) {
    if (p.ids.empty()) {
      if (p.text.empty()) return absl::InvalidArgumentError(p.where + ": empty");
      SATDAR_ASSIGN_OR_RETURN(p.ids, tok->Encode(p.text));
      if (p.ids.empty()) {
        return absl::InvalidArgumentError(p.where + ": the text encodes to no tokens");
      }
    }
    if (static_cast<int64_t>(p.ids.size()) > max_prompt) {
      return absl::InvalidArgumentError(absl::StrCat(
          p.where, ": ", p.ids.size(), " tokens; with --max-new-tokens ", so.max_new_tokens,
          " a prompt may have ", max_prompt, " (the config's max_position_embeddings is ",
          window, ")"));
    }
  }

  return absl::OkStatus();
}

// Generates and prints: one prompt in text streams token by token, several print as blocks
// once complete, --json one line per prompt at the end.
absl::Status GenerateAndPrint(runtime::DecodeSession* session, const std::vector<Prompt>& prompts,
                              TokenizerProcess* tok, const runtime::SamplingOptions& so,
                              bool json) {
  std::vector<std::vector<int32_t>> ids;
  for (const Prompt& p : prompts) ids.push_back(p.ids);
  // Text form: one prompt streams token by token, several print as blocks once complete.
  const bool stream = !json && prompts.size() == 1;
  std::vector<std::vector<int32_t>> so_far(prompts.size());
  std::string printed;
  absl::Status print_error;  // the first tokenizer failure while printing
  auto block = [&](int i) -> absl::Status {
    if (tok == nullptr) {
      Print(absl::StrCat("--- line ", prompts[i].line, " ---\n", IdsText(prompts[i].ids), " | ",
                         IdsText(so_far[i]), "\n"));
      return absl::OkStatus();
    }
    SATDAR_ASSIGN_OR_RETURN(std::string head,
                            tok->Decode(TextIds(prompts[i].ids, {}, so.eos_id, tok->vocab_size())));
    SATDAR_ASSIGN_OR_RETURN(std::string tail,
                            CompletionText(tok, prompts[i].ids, so_far[i], so.eos_id));
    Print(absl::StrCat("--- line ", prompts[i].line, " ---\n", head, tail, "\n"));
    return absl::OkStatus();
  };
  // What the stream has decoded: the prompt's ids that have text, then the new ones.
  std::vector<int32_t> streamed =
      tok == nullptr ? prompts[0].ids : TextIds(prompts[0].ids, {}, so.eos_id, tok->vocab_size());
  if (stream) {
    if (tok == nullptr) {
      Print(IdsText(prompts[0].ids) + " |");
    } else {
      SATDAR_ASSIGN_OR_RETURN(std::string head, tok->NewText(streamed, &printed));
      Print(head);
    }
  }
  auto on_token = [&](int i, int32_t id) {
    so_far[i].push_back(id);
    if (json || !print_error.ok()) return;
    if (!stream) {
      const bool last = id == so.eos_id || static_cast<int>(so_far[i].size()) == so.max_new_tokens;
      if (last) print_error = block(i);
      return;
    }
    if (tok == nullptr) {
      Print(absl::StrCat(" ", id));
      return;
    }
    if (id >= tok->vocab_size()) return;  // padding: no text
    streamed.push_back(id);
    auto text = tok->NewText(streamed, &printed);
    if (!text.ok()) {
      print_error = text.status();
      return;
    }
    Print(*text);
  };
  SATDAR_ASSIGN_OR_RETURN(runtime::GenerateResult result,
                          runtime::Generate(session, ids, so, on_token));
  SATDAR_RETURN_IF_ERROR(print_error);
  if (stream) {
    std::string rest;
    if (tok != nullptr) {
      SATDAR_ASSIGN_OR_RETURN(rest, tok->NewText(streamed, &printed, /*final=*/true));
    }
    Print(rest + "\n");
  }
  if (json) {
    std::string out;  // all lines, or nothing when a decoding fails
    for (size_t i = 0; i < prompts.size(); ++i) {
      // In the spec's order (nlohmann::json would sort the keys).
      nlohmann::ordered_json line = {{"prompt_ids", prompts[i].ids}, {"ids", result.ids[i]}};
      if (tok != nullptr) {
        SATDAR_ASSIGN_OR_RETURN(
            std::string text,
            CompletionText(tok, prompts[i].ids, result.ids[i], so.eos_id));
        line["text"] = text;
      }
      // Invalid UTF-8 (a character cut short by the token limit) is written as U+FFFD.
      absl::StrAppend(
          &out, line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), "\n");
    }
    Print(out);
  }
  std::fprintf(stderr, "%lld tokens in %.3f s (%.1f tokens/s)\n",
               static_cast<long long>(result.new_tokens), result.seconds,
               result.seconds > 0 ? result.new_tokens / result.seconds : 0.0);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGenerate(const std::vector<std::string>& args) {
  FlagSet flags("generate");
  DefineGenerateFlags(&flags);
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  runtime::SamplingOptions so;
  runtime::DecodeOptions o;
  SATDAR_RETURN_IF_ERROR(ReadGenerateFlags(flags, &so, &o));
  std::unique_ptr<TokenizerProcess> tok;
  std::vector<Prompt> prompts;
  SATDAR_RETURN_IF_ERROR(ReadPrompts(flags, o, &so, &tok, &prompts));
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<runtime::DecodeSession> session,
                          runtime::DecodeSession::Create(o));
  return GenerateAndPrint(session.get(), prompts, tok.get(), so, flags.GetBool("--json"));
}

}  // namespace satdar::cli
