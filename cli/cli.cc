#include "cli/cli.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "core/device.h"
#include "cli/commands.h"

namespace satdar::cli {

namespace {

constexpr char kVersion[] = "satdar 0.1.0";

// "satdar <command>: error: <message>", once: library messages that already begin with
// "satdar <command>: " (the flag parser's, the commands' own) are not prefixed twice.
void PrintError(const std::string& command, const absl::Status& status) {
  std::string message(status.message());
  const std::string own = "satdar " + command + ": ";
  if (message.rfind(own, 0) == 0) message.erase(0, own.size());
  std::fprintf(stderr, "satdar %s: error: %s\n", command.c_str(), message.c_str());
}

void PrintUsage() {
  std::fprintf(stderr,
               "%s: distributed training for SATFormer, DAR and their baselines\n"
               "usage: satdar <command> [flags]\n"
               "commands:\n"
               "  grad    one forward and backward pass; writes the loss and every gradient\n"
               "  prep    text -> tokenizer + token shards + validation split (a dataset)\n"
               "  train   train a model (a prepared dataset, raw text, MQAR or random tokens)\n"
               "  init    write a model's initial weights (safetensors, MODELS.md names)\n"
               "  eval    loss of given weights, or scored tasks (--task); SATFormer gate ablation\n"
               "  generate text from given weights (greedy or sampled), over a KV cache\n"
               "  analyze cka | rescue: the residual streams' CKA and rescue gain (DAR, HC, mHC)\n"
               "  export  a checkpoint of any parallel layout -> one weights file\n"
               "  info    parameter count (and list) of a config\n"
               "  plan    bytes per group and boundary, and memory, of a step on a layout\n"
               "control plane:\n"
               "  coordinator  serve the job API (gRPC) with its state in a folder\n"
               "  worker       register rank slots with a coordinator and run what it assigns\n"
               "  submit       submit a job spec (JOB.json); --follow streams its progress\n"
               "  status       one job (--json for scripts)\n"
               "  jobs         every job\n"
               "  cancel       cancel a job\n"
               "  logs         a job's output (--rank, --follow)\n"
               "  workers      the registered workers\n"
               "  version print the version\n"
               "run 'satdar <command> --help' for the flags of a command\n",
               kVersion);
}

// `satdar prep` runs in its own program beside this one (satdar-prep): SentencePiece's library
// carries its own copy of protobuf, which clashes with the one gRPC uses, so the two never
// share a process.
absl::Status ExecPrep(char** argv) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return absl::InternalError("satdar prep: cannot find this program's folder");
  std::string path(self, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/') + 1) + "satdar-prep";
  argv[1] = argv[0];  // satdar-prep takes the flags after "prep"
  ::execv(path.c_str(), argv + 1);
  return absl::InternalError(absl::StrCat("satdar prep: cannot run ", path, ": ",
                                          std::strerror(errno), " (build //:satdar)"));
}

}  // namespace

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
  } else if (command == "generate") {
    status = RunGenerate(args);
  } else if (command == "analyze") {
    status = RunAnalyze(args);
  } else if (command == "export") {
    status = RunExport(args);
  } else if (command == "info") {
    status = RunInfo(args);
  } else if (command == "plan") {
    status = RunPlan(args);
  } else if (command == "prep") {
    status = ExecPrep(argv);
  } else if (command == "coordinator") {
    status = RunCoordinatorCommand(args);
  } else if (command == "worker") {
    status = RunWorkerCommand(args);
    if (!status.ok()) {
      PrintError(command, status);
      return WorkerExitCodeFor(status);
    }
  } else if (command == "submit" || command == "status" || command == "jobs" ||
             command == "cancel" || command == "logs" || command == "workers") {
    const absl::Status s = command == "submit"   ? RunSubmit(args)
                           : command == "status" ? RunStatus(args)
                           : command == "jobs"   ? RunJobs(args)
                           : command == "cancel" ? RunCancel(args)
                           : command == "logs"   ? RunLogs(args)
                                                 : RunWorkers(args);
    if (s.ok()) return 0;
    PrintError(command, s);
    return ClientExitCodeFor(s);
  } else if (command == "version" || command == "--version") {
    std::printf("%s (%s)\n", kVersion,
                core::BuiltWithSimulator() ? "CUDA simulator build"
                : core::BuiltWithCuda()    ? "CUDA build"
                                           : "CPU-only build");
    return 0;
  } else {
    std::fprintf(stderr, "satdar: unknown command '%s'\n", command.c_str());
    PrintUsage();
    return 2;
  }
  if (!status.ok()) {
    PrintError(command, status);
    return ExitCodeFor(status);
  }
  return 0;
}

}  // namespace satdar::cli
