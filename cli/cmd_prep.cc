// satdar prep: text -> tokenizer, token shards, a validation split and a manifest.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <thread>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "data/prep.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/terminate_handler.h"

namespace satdar::cli {

namespace {

std::string* g_tmp = nullptr;  // the unfinished output folder

void RemoveUnfinishedOutput() {
  if (g_tmp != nullptr) (void)core::RemoveTree(*g_tmp);
}

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &b, 1);  // async-signal-safe; the watcher does the rest
}

// Ctrl-C, kill and a hang-up remove the unfinished output, then end the process (128 + the
// signal, as a shell reports it); so does an allocation that fails (the terminate handler).
// A handler rather than sigwait: libraries (OpenBLAS) start threads before main that do not
// block signals, and a process-directed signal may go to any of them.
void RemoveOutputOnSignals(const std::string& out) {
  g_tmp = new std::string(data::PrepTmpPath(out));
  SetTerminateCleanup(RemoveUnfinishedOutput);
  if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) return;
  std::thread([] {
    unsigned char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) != 1) {
    }
    RemoveUnfinishedOutput();
    std::fprintf(stderr, "satdar prep: stopped by signal %d; removed %s\n", sig, g_tmp->c_str());
    ::_exit(128 + sig);
  }).detach();
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

}  // namespace

absl::Status RunPrep(const std::vector<std::string>& args) {
  FlagSet flags("prep");
  flags.DefineList("--input", "text files or folders (the Brown corpus folder is detected)", true);
  flags.Define("--out", "the dataset folder to create", true);
  flags.Define("--vocab-size", "train a SentencePiece BPE tokenizer of this size");
  flags.Define("--tokenizer", "use this SentencePiece .model instead of training one");
  flags.Define("--val-fraction", "documents held out for validation", false, "0.01");
  flags.DefineEnum("--format",
                   "how to read the inputs: auto (the Brown corpus folder by its cats.txt, "
                   "*.jsonl files as JSONL, the rest as text), text, brown or jsonl (one JSON "
                   "object per line, the document under --jsonl-key)",
                   {"auto", "text", "brown", "jsonl"}, "auto");
  flags.Define("--jsonl-key", "the field of a JSONL line that holds its document", false, "text");
  flags.DefineBool("--strict-utf8",
                   "refuse a file with invalid UTF-8 (by default each invalid sequence becomes "
                   "U+FFFD and is counted, and binary files are skipped with a warning)");
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
  if (o.tokenizer.empty() && o.vocab_size < 260) {  // data::Prep's check, in flags
    return absl::InvalidArgumentError(
        "give --vocab-size N (>= 260: byte fallback needs 256 pieces plus the special ones) or "
        "an existing model as --tokenizer");
  }
  SATDAR_ASSIGN_OR_RETURN(o.val_fraction, flags.GetDouble("--val-fraction", 0.0, true, 1.0));
  o.format = flags.Get("--format");
  o.jsonl_key = flags.Get("--jsonl-key");
  o.strict_utf8 = flags.GetBool("--strict-utf8");
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
  // Like mkdir -p, prep creates missing parent folders of --out.
  if (core::PathKind(o.out) != "missing") {
    SATDAR_RETURN_IF_ERROR(CheckOutput("--out", o.out, true, inputs));
  } else if (absl::Status s = core::CheckCreatableFolder(o.out); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--out: ", s.message()));
  }
  RemoveOutputOnSignals(o.out);
  SATDAR_ASSIGN_OR_RETURN(data::PrepSummary s, data::Prep(o));
  std::printf("prep: %lld documents (%lld held out) from %lld file(s), %.1f MB of text -> %lld "
              "training and %lld validation tokens in %d shard(s), vocabulary %d, %.1f s "
              "(%.2f MB/s)\n",
              static_cast<long long>(s.documents), static_cast<long long>(s.val_documents),
              static_cast<long long>(s.files), s.bytes / 1e6,
              static_cast<long long>(s.train_tokens), static_cast<long long>(s.val_tokens),
              s.shards, s.vocab_size, s.seconds, s.seconds > 0 ? s.bytes / 1e6 / s.seconds : 0.0);
  if (s.tokenizer_sample_bytes > 0) {
    std::printf("prep: the tokenizer was trained on %.1f MB of text sampled from the training "
                "documents\n", s.tokenizer_sample_bytes / 1e6);
  }
  if (s.cut_documents > 0) {
    std::printf("prep: %lld document(s) longer than a shard (--shard-tokens) were cut where "
                "their shard ended, each part a document of its own\n",
                static_cast<long long>(s.cut_documents));
  }
  int64_t replaced_files = 0, skipped = 0;
  for (const data::DecodedFile& f : s.decoded) (f.skipped.empty() ? replaced_files : skipped)++;
  if (s.replaced > 0 || skipped > 0 || s.bom_files > 0 || s.crlf_files > 0) {
    std::printf("prep: decoding: %lld invalid UTF-8 sequence(s) replaced by U+FFFD in %lld "
                "file(s), %lld file(s) skipped (binary or empty), %lld with a byte-order mark, "
                "%lld with CRLF line ends (per file: manifest.json \"decoding\")\n",
                static_cast<long long>(s.replaced), static_cast<long long>(replaced_files),
                static_cast<long long>(skipped), static_cast<long long>(s.bom_files),
                static_cast<long long>(s.crlf_files));
    int listed = 0;
    for (const data::DecodedFile& f : s.decoded) {
      if (!f.skipped.empty()) continue;
      if (++listed > 10) {
        std::printf("  ... and %lld more file(s)\n", static_cast<long long>(replaced_files - 10));
        break;
      }
      std::printf("  %s: %lld replaced\n", f.name.c_str(), static_cast<long long>(f.replaced));
    }
  }
  return absl::OkStatus();
}

}  // namespace satdar::cli
