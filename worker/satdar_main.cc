// The satdar command-line program (see worker/cli.h).
#include "worker/cli.h"
#include "worker/terminate_handler.h"

int main(int argc, char** argv) {
  satdar::worker::InstallTerminateHandler();
  return satdar::worker::Main(argc, argv);
}
