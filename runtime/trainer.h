// runtime/trainer.h: the training loop of `satdar train` on one process.
//
// Each optimizer step splits the batch into micro-batches, accumulates gradients over them,
// clips by global norm, applies AdamW under a linear-warmup + cosine schedule (to
// min_lr_ratio of peak), logs, and checkpoints. Everything a step computes is a pure function
// of (config, seed, step, flags, thread count), which is what makes --resume exact.
#ifndef SATDAR_RUNTIME_TRAINER_H_
#define SATDAR_RUNTIME_TRAINER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/ops/adamw.h"
#include "data/batches.h"
#include "data/mqar.h"
#include "comm/communicator.h"
#include "comm/mesh.h"
#include "model/config.h"
#include "runtime/rank_agreement.h"
#include "runtime/train_options.h"

namespace satdar::runtime {

// The hyperparameters that must match for a checkpoint to resume (JSON, in every checkpoint).
std::string TrainerJson(const TrainOptions& options);

// What every rank of a run must have been started with (rank_agreement.h): the config and
// every flag that shapes the run, by flag name.
Fingerprint RunFingerprint(const TrainOptions& options);

// Learning rate at 1-based step s.
double LearningRate(const TrainOptions& options, int64_t step);

// The AdamW hyperparameters of 1-based step s: the scheduled learning rate and, when the
// global gradient norm exceeds grad_clip, the gradient scale that clips it.
core::AdamWParams AdamWStep(const TrainOptions& options, int64_t step, double grad_norm);

// The training batches --task mqar / --synthetic-data / --data describe; *description says
// what they are (printed at the start of a run).
absl::StatusOr<std::unique_ptr<data::BatchSource>> OpenTrainingData(const TrainOptions& options,
                                                                     std::string* description);

// The validation split --eval-every reads (the first eval_batches batches of it):
// InvalidArgument unless the training data is a prepared dataset (satdar prep).
absl::StatusOr<std::unique_ptr<data::BatchSource>> OpenEvalData(const TrainOptions& options);

absl::StatusOr<TrainSummary> Train(const TrainOptions& options);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_TRAINER_H_
