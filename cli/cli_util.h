// cli/cli_util.h: what the satdar commands share: help, the bounds of their numeric flags,
// the MQAR task flags, and the up-front checks of the files a command reads and writes.
//
// Every command checks its paths before any work: inputs must exist and be regular files (or
// folders where folders are meant), so a FIFO or device never blocks a run; outputs must be
// writable and must not be any of the inputs (grad --out may not overwrite --weights).
#ifndef SATDAR_CLI_CLI_UTIL_H_
#define SATDAR_CLI_CLI_UTIL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/mqar.h"
#include "model/layout_check.h"
#include "settings/train_settings.h"
#include "cli/flags.h"

namespace satdar::cli {

// Upper bounds of counts given on the command line (settings/train_settings.h).
using settings::kMaxBatch;
using settings::kMaxCount;
using settings::kMaxRanks;
using settings::kMaxSeed;
using settings::kMaxSeqLen;
using settings::kMaxSteps;
using settings::kMaxThreads;

bool WantsHelp(const std::vector<std::string>& args);
// The flag's value, else the environment variable's, else "".
std::string FlagOrEnv(const FlagSet& flags, const std::string& flag, const char* env);
// Prints the flags of a command (its --help); always OK.
absl::Status PrintHelp(const FlagSet& flags);

// The batch sizes as the commands' flags call them (for the memory check's advice).
inline const model::BatchNames kCliBatchNames = {"--batch-size", "--seq-len", "--microbatches"};

// Defines a flag (--batch-size for "batch_size") for every training setting `pick` accepts,
// in the settings' order.
void DefineSettingFlags(FlagSet* flags, const std::function<bool(const settings::SettingDef&)>& pick);
// The training settings given as flags (those of `flags` that are settings), spelled as flags.
settings::SettingValues SettingsOf(const FlagSet& flags);

// A path a command reads, named by its flag.
struct InputPath {
  std::string flag;
  std::string path;
  enum Kind { kFile, kFolder, kFileOrFolder } kind = kFile;
};

// InvalidArgument/NotFound "<flag>: <why>" for the first input that is missing or of the
// wrong kind.
absl::Status CheckInputs(const std::vector<InputPath>& inputs);
// An output file (folder == false) or folder: writable, and none of the inputs.
absl::Status CheckOutput(const std::string& flag, const std::string& path, bool folder,
                         const std::vector<InputPath>& inputs);

}  // namespace satdar::cli

#endif  // SATDAR_CLI_CLI_UTIL_H_
