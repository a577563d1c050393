// satdar-prep: `satdar prep` (cli/cmd_prep.cc) as a program of its own, which `satdar prep`
// runs (cli/cli.cc says why: SentencePiece and gRPC each bring a protobuf).
#include <cstdio>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/terminate_handler.h"

int main(int argc, char** argv) {
  satdar::cli::InstallTerminateHandler();
  std::vector<std::string> args(argv + 1, argv + argc);
  const absl::Status status = satdar::cli::RunPrep(args);
  if (!status.ok()) {
    std::fprintf(stderr, "satdar prep: error: %s\n", std::string(status.message()).c_str());
    return satdar::cli::ExitCodeFor(status);
  }
  return 0;
}
