// cli/cli.h: the `satdar` command line (shared spec INTERFACES.md).
//
//   satdar grad  --config C --weights W --tokens B --out G [--dtype f32|f64] [--threads N]
//   satdar train --config C --steps N --batch-size B --seq-len T
//                (--data DIR | --synthetic-data) [...]
//
// Exit codes: 0 success; 2 bad usage or bad input (the message names the flag, file or
// field); 1 any other failure.
#ifndef SATDAR_CLI_CLI_H_
#define SATDAR_CLI_CLI_H_

#include "absl/status/status.h"

namespace satdar::cli {

int Main(int argc, char** argv);
// 2 for errors caused by the user's input, 1 otherwise.
int ExitCodeFor(const absl::Status& status);

}  // namespace satdar::cli

#endif  // SATDAR_CLI_CLI_H_
