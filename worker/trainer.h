// worker/trainer.h: the training loop of `satdar train` on one process.
//
// Each optimizer step splits the batch into micro-batches, accumulates gradients over them,
// clips by global norm, applies AdamW under a linear-warmup + cosine schedule (to
// min_lr_ratio of peak), logs, and checkpoints. Everything a step computes is a pure function
// of (config, seed, step, flags, thread count), which is what makes --resume exact.
#ifndef SATDAR_WORKER_TRAINER_H_
#define SATDAR_WORKER_TRAINER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/ops/adamw.h"
#include "data/batches.h"
#include "data/mqar.h"
#include "parallel/communicator.h"
#include "parallel/mesh.h"
#include "model/config.h"
#include "worker/rank_agreement.h"

namespace satdar::worker {

struct TrainOptions {
  model::ModelConfig config;
  int64_t steps = 0;
  int batch_size = 0;  // sequences per optimizer step
  int seq_len = 0;
  int microbatches = 1;
  int threads = 1;
  uint64_t seed = 0;
  bool f64 = false;  // train in double precision (tests)
  // Data: synthetic tokens, a prepared dataset (satdar prep), a folder of raw text (byte-level
  // tokens), or the MQAR task.
  bool synthetic_data = false;
  std::string data_dir;
  std::string data_format = "auto";
  std::optional<data::MqarOptions> mqar;
  int64_t eval_every = 0;  // validation loss on the held-out split every N steps (datasets)
  int eval_batches = 4;
  // Optimizer and schedule.
  double lr = 1e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
  // Output.
  std::string log_jsonl;
  std::string summary_json;
  int64_t log_every = 1;  // console lines
  // Every N steps the --log-jsonl line carries "stats": what the papers analyse (SATFormer
  // gates, AttnRes/DAR depth weights and gates, MoE expert load) gathered since the last one.
  int64_t stats_every = 0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep_checkpoints = 3;
  bool resume = false;
  bool quiet = false;
  // Parallel runs: this process is one rank of `world` (null: a single rank), arranged as
  // mesh (dp x tp x pp x ep, parallel/mesh.h). Each data-parallel replica (dp x ep of them;
  // without experts the EP ranks are replicas too) trains on its slice of the global batch
  // (batch_size sequences each); TP, PP and EP ranks of a replica hold pieces of one model
  // (model/sharding.h). Gradients and the loss are averaged over replicas; only rank 0 logs.
  parallel::Communicator* world = nullptr;
  parallel::MeshShape mesh;
  // ZeRO stage 1 (data parallel, ep 1): gradients are reduce-scattered, each replica keeps the
  // AdamW moments of its 1/dp slice of the flat buffer and updates only that slice, and the
  // parameters are all-gathered. Checkpoints still hold the full state (gathered on write).
  int zero_stage = 0;
  // A peer that does not answer within this time fails the run (exit 1), never a hang.
  int comm_timeout_seconds = 300;
};

struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;
  double tokens_per_second = 0;
  int64_t peak_rss_bytes = 0;
  // GPU runs: the caching allocator's peak and the model FLOPs utilisation.
  int64_t peak_device_bytes = 0;
  double mfu = 0;
  // --resume found the run finished: no step ran, final_loss is the last checkpoint's.
  bool already_complete = false;
};

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

}  // namespace satdar::worker

#endif  // SATDAR_WORKER_TRAINER_H_
