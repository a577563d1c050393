// satdar-prep: `satdar prep` (worker/cmd_prep.cc) as a program of its own, which `satdar prep`
// runs (worker/cli.cc says why: SentencePiece and gRPC each bring a protobuf).
#include <cstdio>
#include <string>
#include <vector>

#include "worker/cli.h"
#include "worker/commands.h"
#include "worker/terminate_handler.h"

int main(int argc, char** argv) {
  satdar::worker::InstallTerminateHandler();
  std::vector<std::string> args(argv + 1, argv + argc);
  const absl::Status status = satdar::worker::RunPrep(args);
  if (!status.ok()) {
    std::fprintf(stderr, "satdar prep: error: %s\n", std::string(status.message()).c_str());
    return satdar::worker::ExitCodeFor(status);
  }
  return 0;
}
