// The satdar command-line program (see worker/cli.h).
#include "worker/cli.h"

int main(int argc, char** argv) { return satdar::worker::Main(argc, argv); }
