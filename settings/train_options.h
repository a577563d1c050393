// settings/train_options.h: what `satdar train` is asked to do (TrainOptions), filled from the
// settings by ParseTrainSettings (train_settings.h) and completed by the command (the config,
// the communicators, the GPU's choices). Header-only.
#ifndef SATDAR_SETTINGS_TRAIN_OPTIONS_H_
#define SATDAR_SETTINGS_TRAIN_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "data/mqar.h"
#include "model/config.h"
#include "model/layout_check.h"
#include "comm/communicator.h"
#include "comm/mesh.h"

namespace satdar::settings {

// `satdar train --device cuda`: one GPU per rank (or several ranks sharing one through host
// staging), bf16 or f32 compute, fp32 master weights (runtime/cuda_engine.h).
struct GpuOptions {
  bool enabled = false;                      // false: the CPU
  int device = -1;                           // CUDA device; -1: rank % visible devices
  core::DType compute = core::DType::kBF16;  // kBF16 or kF32
  bool recompute = false;                    // activation recomputation per sublayer
  // The ranks' communicator for device buffers (NCCL, or comm/staged_communicator.h);
  // null for a single rank. `world` below stays the host communicator (rank agreement, the
  // checkpoint folder's status, the mesh).
  comm::Communicator* world = nullptr;
  std::string world_kind = "nccl";  // what `world` is, for the console: "nccl" or "host staging"
};

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
  // Samples (llm.c's): every sample_every steps and at the last, rank 0 hands `sample` the whole
  // model's weights (fp32 copies, laid out by the unsharded CPU model's table:
  // model::BuildParamTable(config, {})) and prints the UTF-8 text it returns as "step S sample:
  // ...", also the --log-jsonl line's "sample". Only `satdar train` sets `sample` (the prompt is
  // encoded by its tokenizer child process); without it nothing is sampled. Training is
  // unchanged: the weights are copied, no random number is drawn.
  int64_t sample_every = 0;
  std::string sample_prompt;
  int sample_tokens = 32;
  std::function<absl::StatusOr<std::string>(int64_t step, std::vector<float> weights)> sample;
  // Optimizer and schedule.
  double lr = 1e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 0;
  bool warmup_given = false;  // --warmup-steps given (not steps/10): kept over a resume
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
  // How long to wait for the checkpoint folder's lock (the worker sets it: a rank of an
  // attempt that is being stopped may still hold it).
  int64_t lock_wait_seconds = 0;
  bool resume = false;
  // A checkpoint (file, ckpt_<step>/ folder, or a checkpoint folder: its newest) whose weights
  // start this run, with fresh optimizer moments at step 0 (fine-tuning). With --resume, a
  // checkpoint of this run's own --checkpoint-dir wins.
  std::string init_from;
  // When set (a rank a worker started: agent/rank_lease.h), asked before every checkpoint and
  // log line; an error ends the run without writing.
  std::function<absl::Status()> may_write;
  bool quiet = false;
  // Observability (metrics/train_metrics.h): with metrics_listen (HOST:PORT, port 0: a free
  // one) every rank serves Prometheus /metrics, labelled job_id and rank. MFU divides by
  // peak_tflops per rank; 0: a GPU's from its name, a CPU's measured with a GEMM at start.
  std::string metrics_listen;
  std::string job_id = "local";
  double peak_tflops = 0;
  // The console: "line" prints a line per logged step; "bar" redraws one progress line (a
  // terminal); "auto" picks "bar" when stdout is a terminal.
  std::string progress = "auto";
  // Parallel runs: this process is one rank of `world` (null: a single rank), arranged as
  // mesh (dp x tp x pp x ep, comm/mesh.h). Each data-parallel replica (dp x ep of them;
  // without experts the EP ranks are replicas too) trains on its slice of the global batch
  // (batch_size sequences each); TP, PP and EP ranks of a replica hold pieces of one model
  // (model/sharding.h). Gradients and the loss are averaged over replicas; only rank 0 logs.
  comm::Communicator* world = nullptr;
  comm::MeshShape mesh;
  // ZeRO stage 1 (data parallel, ep 1): gradients are reduce-scattered, each replica keeps the
  // AdamW moments of its 1/dp slice of the flat buffer and updates only that slice, and the
  // parameters are all-gathered. Checkpoints still hold the full state (gathered on write).
  int zero_stage = 0;
  // The embedding and head padded to a multiple of tp x vocab_multiple rows
  // (model::Sharding::vocab_multiple): the same model (padded rows get no probability), up to
  // the last bits the wider GEMMs sum in another order (2e-13 relative after 4 f64 steps).
  int vocab_multiple = 1;
  // Model chunks per pipeline rank (the interleaved 1F1B schedule, parallel/pipeline.h).
  int virtual_stages = 1;
  // Megatron-LM's sequence parallelism over the TP group (model::Sharding::sequence_parallel).
  bool sequence_parallel = false;
  // Which activations the backward pass recomputes instead of keeping (model/sharding.h); on
  // the GPU, kFull sets gpu.recompute.
  model::Recompute recompute = model::Recompute::kNone;
  // A peer that does not answer within this time fails the run (exit 1), never a hang.
  int comm_timeout_seconds = 300;
  GpuOptions gpu;
};

}  // namespace satdar::settings

#endif  // SATDAR_SETTINGS_TRAIN_OPTIONS_H_
