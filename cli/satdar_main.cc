// The satdar command-line program (see cli/cli.h).
#include "cli/cli.h"
#include "cli/terminate_handler.h"

int main(int argc, char** argv) {
  satdar::cli::InstallTerminateHandler();
  return satdar::cli::Main(argc, argv);
}
