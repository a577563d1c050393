// runtime/checkpoint.h: complete training checkpoints.
//
// One rank: DIR/ckpt_<step, 8 digits>.safetensors holds every parameter under its MODELS.md
// name (so the file loads into PyTorch as weights), the AdamW moments as
// optimizer.exp_avg.<name> and optimizer.exp_avg_sq.<name>, and metadata: format, step,
// seed, data position (sequences consumed), the step's loss, the model config, the training
// flags, the dtype and a checksum over all of it: every metadata entry and every tensor, so a
// flipped byte anywhere is reported as corruption, never used or blamed on the flags. The file is written to a temporary name, fsynced and renamed,
// so a name that exists is complete.
// Model-parallel runs (tp, pp or ep > 1): DIR/ckpt_<step>/ holds one such file per model
// piece, shard-tp<t>-pp<p>-ep<e>.safetensors, whose "shards" metadata says which slice of
// each global tensor it holds. The ranks of data-parallel replica 0 write them into a
// temporary folder that one rename makes visible. Optimizer moments are always gathered
// (ZeRO-1) before writing, so a checkpoint does not depend on the data-parallel size.
// Loading assembles each tensor this rank needs from whatever files hold it, so a checkpoint
// loads into any layout (any dp, tp, pp, ep) of the same model.
#ifndef SATDAR_RUNTIME_CHECKPOINT_H_
#define SATDAR_RUNTIME_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/safetensors.h"
#include "model/param_table.h"
#include "comm/communicator.h"

namespace satdar::runtime {

inline constexpr char kCheckpointFormat[] = "satdar-checkpoint-v2";
// Written by earlier builds: the checksum covers the tensors only (and there is no loss). Still
// read (resume, eval, export); its metadata cannot be verified.
inline constexpr char kCheckpointFormatV1[] = "satdar-checkpoint-v1";

struct CheckpointInfo {
  int64_t step = 0;
  uint64_t seed = 0;
  int64_t data_position = 0;  // sequences consumed by all data-parallel ranks
  std::string config_json;    // canonical model config
  std::string trainer_json;   // hyperparameters that must match on resume
  double loss = 0;            // the loss of step `step`
};

template <typename T>
struct OptimizerBuffers {
  std::vector<T>* params;
  std::vector<T>* exp_avg;
  std::vector<T>* exp_avg_sq;
};

std::string CheckpointPath(const std::string& dir, int64_t step);

template <typename T>
absl::Status SaveCheckpoint(const std::string& dir, const CheckpointInfo& info,
                            const model::ParamTable& table, const OptimizerBuffers<T>& buffers);

// Every rank of `group` (the model pieces of one data-parallel replica) calls this with its
// own piece; shard_name names its file ("tp0-pp1-ep0").
template <typename T>
absl::Status SaveShardedCheckpoint(const std::string& dir, const CheckpointInfo& info,
                                   const model::ParamTable& table,
                                   const OptimizerBuffers<T>& buffers,
                                   const std::string& shard_name, comm::Communicator* group,
                                   const comm::CollectiveOptions& options);

// Newest complete checkpoint in dir, or "" when there is none (or dir does not exist).
absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& dir);

// The first field where two canonical config JSONs differ ("field \"hidden_size\" is 64 there,
// 32 in this config"); empty when they are equal.
std::string ConfigDifference(const std::string& stored, const std::string& mine);

// OK when `file` is a complete, uncorrupted checkpoint file of this format (its checksum over
// metadata and tensors matches) written for config_json (canonical; empty: any config). The
// InvalidArgument error names the file and, for another config, the first field that differs.
absl::Status VerifyCheckpointFile(const core::SafetensorsFile& file,
                                  const std::string& config_json);

// Verifies every file (VerifyCheckpointFile), the dtype, that a file's or folder's name gives
// the step it holds, and every tensor's shape, then fills the buffers (this rank's slices).
// path: a checkpoint file or folder. exp_avg/exp_avg_sq may be null (weights only).
template <typename T>
absl::StatusOr<CheckpointInfo> LoadCheckpoint(const std::string& path,
                                              const std::string& config_json,
                                              const model::ParamTable& table,
                                              const OptimizerBuffers<T>& buffers);

// How a resumed run continues a checkpoint.
struct ResumePlan {
  int64_t warmup_steps = 0;  // the schedule's warmup (the stored one unless given again)
  std::string note;          // what changed, for the console ("" when nothing did)
};

// OK when checkpoint `path` (its loaded info) continues the run of these training flags
// (TrainerJson) and seed: every flag the same, except that "steps" may be any total not below
// the checkpoint's step (the run is extended, or cut short, as Megatron-LM does: the schedule
// is recomputed for the new total, keeping the stored warmup unless `warmup_given`).
// Otherwise InvalidArgument naming the first flag that differs and both values.
absl::StatusOr<ResumePlan> CheckResume(const CheckpointInfo& info, const std::string& path,
                                       const std::string& trainer_json, uint64_t seed,
                                       bool warmup_given);

// Removes all but the newest `keep` checkpoints in dir.
absl::Status PruneCheckpoints(const std::string& dir, int keep);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_CHECKPOINT_H_
