// satdar prep: text -> tokenizer, token shards, a validation split and a manifest.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "data/prep.h"
#include "worker/cli_util.h"
#include "worker/commands.h"

namespace satdar::worker {

absl::Status RunPrep(const std::vector<std::string>& args) {
  FlagSet flags("prep");
  flags.DefineList("--input", "text files or folders (the Brown corpus folder is detected)", true);
  flags.Define("--out", "the dataset folder to create", true);
  flags.Define("--vocab-size", "train a SentencePiece BPE tokenizer of this size");
  flags.Define("--tokenizer", "use this SentencePiece .model instead of training one");
  flags.Define("--val-fraction", "documents held out for validation", false, "0.01");
  flags.DefineEnum("--format", "how to read the inputs", {"auto", "text", "brown"}, "auto");
  flags.Define("--shard-tokens", "tokens per shard", false, "16777216");
  flags.Define("--threads", "threads for tokenizer training and encoding", false, "1");
  flags.Define("--seed", "which documents are held out", false, "0");
  flags.DefineBool("--quiet", "no progress output");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  data::PrepOptions o;
  o.inputs = flags.GetList("--input");
  o.out = flags.Get("--out");
  if (flags.Has("--vocab-size")) {
    SATDAR_ASSIGN_OR_RETURN(int64_t v, flags.GetInt("--vocab-size", 1, 1 << 24));
    o.vocab_size = static_cast<int>(v);
  }
  o.tokenizer = flags.Get("--tokenizer");
  SATDAR_ASSIGN_OR_RETURN(o.val_fraction, flags.GetDouble("--val-fraction", 0.0, true, 1.0));
  o.format = flags.Get("--format");
  SATDAR_ASSIGN_OR_RETURN(o.shard_tokens, flags.GetInt("--shard-tokens", 1, kMaxCount));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1, kMaxThreads));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0, kMaxSeed));
  o.threads = static_cast<int>(threads);
  o.seed = static_cast<uint64_t>(seed);
  o.progress = !flags.GetBool("--quiet");
  std::vector<InputPath> inputs = {{"--tokenizer", o.tokenizer}};
  for (const std::string& in : o.inputs) {
    inputs.push_back({"--input", in, InputPath::kFileOrFolder});
  }
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  SATDAR_RETURN_IF_ERROR(CheckOutput("--out", o.out, true, inputs));
  SATDAR_ASSIGN_OR_RETURN(data::PrepSummary s, data::Prep(o));
  std::printf("prep: %lld documents (%lld held out), %.1f MB of text -> %lld training and %lld "
              "validation tokens in %d shard(s), vocabulary %d, %.1f s (%.2f MB/s)\n",
              static_cast<long long>(s.documents), static_cast<long long>(s.val_documents),
              s.bytes / 1e6, static_cast<long long>(s.train_tokens),
              static_cast<long long>(s.val_tokens), s.shards, s.vocab_size, s.seconds,
              s.seconds > 0 ? s.bytes / 1e6 / s.seconds : 0.0);
  return absl::OkStatus();
}

}  // namespace satdar::worker
