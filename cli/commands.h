// cli/commands.h: the satdar subcommands, one file each (cmd_<name>.cc); cli/cli.cc
// dispatches to them. Each parses its flags (cli/flags.h), checks its inputs and outputs
// before any work (cli/cli_util.h) and returns a Status that Main turns into the exit code.
#ifndef SATDAR_CLI_COMMANDS_H_
#define SATDAR_CLI_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace satdar::cli {

absl::Status RunGrad(const std::vector<std::string>& args);
absl::Status RunInit(const std::vector<std::string>& args);
absl::Status RunExport(const std::vector<std::string>& args);
absl::Status RunInfo(const std::vector<std::string>& args);
absl::Status RunPlan(const std::vector<std::string>& args);
absl::Status RunEval(const std::vector<std::string>& args);
absl::Status RunAnalyze(const std::vector<std::string>& args);
absl::Status RunGenerate(const std::vector<std::string>& args);
absl::Status RunPrep(const std::vector<std::string>& args);
absl::Status RunTrain(const std::vector<std::string>& args);

// The control plane (cmd_control.cc, cmd_client.cc).
absl::Status RunCoordinatorCommand(const std::vector<std::string>& args);
absl::Status RunWorkerCommand(const std::vector<std::string>& args);
absl::Status RunSubmit(const std::vector<std::string>& args);
absl::Status RunStatus(const std::vector<std::string>& args);
absl::Status RunJobs(const std::vector<std::string>& args);
absl::Status RunCancel(const std::vector<std::string>& args);
absl::Status RunLogs(const std::vector<std::string>& args);
absl::Status RunWorkers(const std::vector<std::string>& args);
// Client commands' exit codes: 0 ok, 2 bad input, 3 unauthenticated or permission denied,
// 4 no such job, 1 anything else.
int ClientExitCodeFor(const absl::Status& status);
// `satdar worker`'s: a token the coordinator refuses is 3 as for clients (UNAUTHENTICATED or
// PERMISSION_DENIED from it); everything else as ExitCodeFor (2 bad input, 1 a fault).
int WorkerExitCodeFor(const absl::Status& status);

}  // namespace satdar::cli

#endif  // SATDAR_CLI_COMMANDS_H_
