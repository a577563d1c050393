#include "worker/cli.h"

#include <cstdio>
#include <string>
#include <vector>

#include "core/device.h"
#include "worker/commands.h"

namespace satdar::worker {

namespace {

constexpr char kVersion[] = "satdar 0.1.0";

void PrintUsage() {
  std::fprintf(stderr,
               "%s: distributed training for SATFormer, DAR and their baselines\n"
               "usage: satdar <command> [flags]\n"
               "commands:\n"
               "  grad    one forward and backward pass; writes the loss and every gradient\n"
               "  prep    text -> tokenizer + token shards + validation split (a dataset)\n"
               "  train   train a model (a prepared dataset, raw text, MQAR or random tokens)\n"
               "  init    write a model's initial weights (safetensors, MODELS.md names)\n"
               "  eval    loss of given weights; SATFormer gate ablation (--gate-ablation)\n"
               "  export  a checkpoint of any parallel layout -> one weights file\n"
               "  info    parameter count (and list) of a config\n"
               "  version print the version\n"
               "run 'satdar <command> --help' for the flags of a command\n",
               kVersion);
}

}  // namespace

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kAlreadyExists: return 2;
    default: return 1;
  }
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    PrintUsage();
    return args.empty() ? 2 : 0;
  }
  std::string command = args[0];
  args.erase(args.begin());
  absl::Status status;
  if (command == "grad") {
    status = RunGrad(args);
  } else if (command == "train") {
    status = RunTrain(args);
  } else if (command == "init") {
    status = RunInit(args);
  } else if (command == "eval") {
    status = RunEval(args);
  } else if (command == "export") {
    status = RunExport(args);
  } else if (command == "info") {
    status = RunInfo(args);
  } else if (command == "prep") {
    status = RunPrep(args);
  } else if (command == "version" || command == "--version") {
    std::printf("%s (%s)\n", kVersion, core::BuiltWithCuda() ? "CUDA build" : "CPU-only build");
    return 0;
  } else {
    std::fprintf(stderr, "satdar: unknown command '%s'\n", command.c_str());
    PrintUsage();
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "satdar %s: error: %s\n", command.c_str(),
                 std::string(status.message()).c_str());
    return ExitCodeFor(status);
  }
  return 0;
}

}  // namespace satdar::worker
