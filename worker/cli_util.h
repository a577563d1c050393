// worker/cli_util.h: what the satdar commands share: help, the bounds of their numeric flags,
// the MQAR task flags, and the up-front checks of the files a command reads and writes.
//
// Every command checks its paths before any work: inputs must exist and be regular files (or
// folders where folders are meant), so a FIFO or device never blocks a run; outputs must be
// writable and must not be any of the inputs (grad --out may not overwrite --weights).
#ifndef SATDAR_WORKER_CLI_UTIL_H_
#define SATDAR_WORKER_CLI_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/mqar.h"
#include "model/layout_check.h"
#include "worker/flags.h"

namespace satdar::worker {

// Upper bounds of counts given on the command line (far above any real run; the memory
// estimate refuses what does not fit long before).
inline constexpr int64_t kMaxThreads = 1024;
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 22;  // model::kMaxPositions
inline constexpr int64_t kMaxRanks = int64_t{1} << 16;   // per mesh axis and world size
inline constexpr int64_t kMaxSeed = INT64_MAX;
inline constexpr int64_t kMaxCount = int64_t{1} << 40;   // cadences, batches, shard sizes

bool WantsHelp(const std::vector<std::string>& args);
// The flag's value, else the environment variable's, else "".
std::string FlagOrEnv(const FlagSet& flags, const std::string& flag, const char* env);
// Prints the flags of a command (its --help); always OK.
absl::Status PrintHelp(const FlagSet& flags);

// The batch sizes as the commands' flags call them (for the memory check's advice).
inline const model::BatchNames kCliBatchNames = {"--batch-size", "--seq-len", "--microbatches"};

// --task and the MQAR flags, shared by train and eval.
void DefineTaskFlags(FlagSet* flags);
absl::StatusOr<std::optional<data::MqarOptions>> TaskFromFlags(const FlagSet& flags);

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

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_CLI_UTIL_H_
