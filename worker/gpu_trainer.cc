#include "worker/gpu_trainer.h"

#include "absl/strings/str_cat.h"
#include "model/gpu/gpu_model.h"

#ifdef SATDAR_WITH_CUDA
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/cuda/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/file_util.h"
#include "core/ops/adamw.h"
#include "data/batches.h"
#include "data/stream.h"
#include "model/gpu/train_kernels.h"
#include "nlohmann/json.hpp"
#include "parallel/nccl_communicator.h"
#include "worker/checkpoint.h"
#include "worker/checkpoint_dir.h"
#include "worker/jsonl_writer.h"
#endif

namespace satdar::worker {

double FlopsPerToken(int64_t parameters, const model::ModelConfig& c, int seq_len) {
  double active = static_cast<double>(parameters);
  if (c.moe.has_value()) {  // a token runs top_k of the num_experts routed experts
    active -= static_cast<double>(c.num_hidden_layers) * (c.moe->num_experts - c.moe->top_k) * 3.0 *
              c.moe->expert_intermediate_size * c.hidden_size;
  }
  return 6.0 * active +
         6.0 * c.num_hidden_layers * static_cast<double>(seq_len) * c.hidden_size;
}

#ifndef SATDAR_WITH_CUDA

absl::StatusOr<TrainSummary> TrainGpu(const TrainOptions& options, const GpuTrainOptions& gpu) {
  (void)options, (void)gpu;
  return absl::FailedPreconditionError(
      "--device cuda: this satdar was built without CUDA (no nvcc at build time)");
}

#else  // SATDAR_WITH_CUDA

namespace {

using Json = nlohmann::json;
namespace kc = ::satdar::core::cuda;

// Device buffers owned by the trainer (returned to the allocator on destruction).
class DeviceBuffers {
 public:
  explicit DeviceBuffers(kc::CachingAllocator* alloc) : alloc_(alloc) {}
  ~DeviceBuffers() {
    cudaDeviceSynchronize();
    for (void* p : blocks_) (void)alloc_->Free(p);
  }
  template <typename U>
  absl::StatusOr<U*> Zeros(size_t count) {
    SATDAR_ASSIGN_OR_RETURN(void* p, alloc_->Allocate(std::max<size_t>(count, 1) * sizeof(U)));
    blocks_.push_back(p);
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemset(p, 0, std::max<size_t>(count, 1) * sizeof(U)));
    return static_cast<U*>(p);
  }

 private:
  kc::CachingAllocator* alloc_;
  std::vector<void*> blocks_;
};

absl::Status Unsupported(const TrainOptions& o) {
  if (o.mesh.tp != 1 || o.mesh.pp != 1 || o.mesh.ep != 1) {
    return absl::InvalidArgumentError(
        "--device cuda: tensor, pipeline and expert parallelism are not on the GPU path yet "
        "(data parallelism over NCCL is: --dp N); use --device cpu for --tp/--pp/--ep");
  }
  if (o.zero_stage != 0) {
    return absl::InvalidArgumentError("--device cuda: --zero 1 is not on the GPU path yet");
  }
  if (o.stats_every > 0) {
    return absl::InvalidArgumentError("--device cuda: --stats-every is not on the GPU path yet");
  }
  if (o.f64) return absl::InvalidArgumentError("--device cuda: --dtype must be bf16 or f32");
  return model::gpu::CheckGpuSupport(o.config);
}

}  // namespace

absl::StatusOr<TrainSummary> TrainGpu(const TrainOptions& options, const GpuTrainOptions& gpu) {
  TrainOptions o = options;
  SATDAR_RETURN_IF_ERROR(Unsupported(o));
  const int devices = kc::DeviceCount();
  if (devices == 0) {
    return absl::FailedPreconditionError("--device cuda: no CUDA GPU on this machine");
  }
  const int rank = gpu.rank, world_size = gpu.world_size;
  if (world_size != o.mesh.dp) {
    return absl::InvalidArgumentError(absl::StrCat("--device cuda: the world has ", world_size,
                                                   " ranks but --dp is ", o.mesh.dp));
  }
  const int device = gpu.device >= 0 ? gpu.device : rank % devices;
  if (device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("--device cuda:", device, ": this machine has ",
                                                   devices, " GPU(s)"));
  }
  SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  kc::SetErrorRank(world_size > 1 ? rank : -1);
  if (rank != 0) {
    o.quiet = true;
    o.log_jsonl.clear();
    o.summary_json.clear();
  }
  parallel::CollectiveOptions copts;
  copts.timeout = absl::Seconds(o.comm_timeout_seconds);
  std::unique_ptr<parallel::Communicator> world;
  if (world_size > 1) {
    if (gpu.rendezvous_dir.empty()) {
      return absl::InvalidArgumentError(
          "--device cuda with --dp > 1 needs --rendezvous DIR (a folder all ranks share)");
    }
    parallel::NcclOptions no;
    no.rank = rank;
    no.world_size = world_size;
    no.device = device;
    no.store_dir = gpu.rendezvous_dir;
    no.timeout = copts.timeout;
    SATDAR_ASSIGN_OR_RETURN(world, parallel::NcclWorld(no));
  }

  kc::CachingAllocator alloc;
  SATDAR_ASSIGN_OR_RETURN(kc::Stream compute, kc::Stream::Create());
  cudaStream_t stream = compute.get();
  SATDAR_ASSIGN_OR_RETURN(
      std::unique_ptr<model::gpu::GpuModel> model,
      model::gpu::GpuModel::Create(o.config, {gpu.compute, gpu.recompute}, stream, &alloc));
  const model::ParamTable& table = model->params();
  const int64_t n = table.size();
  const model::gpu::DeviceLayout& layout = model->layout();
  const int64_t nd = layout.size;  // elements of each device buffer (aligned tensors)
  auto device_offset = [&](const std::string& name) {
    return layout.offsets[table.Find(name) - table.specs().data()];
  };

  std::string data_description;
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<data::BatchSource> source,
                          OpenTrainingData(o, &data_description));
  if (!o.quiet) std::printf("data: %s\n", data_description.c_str());
  std::unique_ptr<data::BatchSource> eval_source;
  if (o.eval_every > 0) {
    SATDAR_ASSIGN_OR_RETURN(eval_source, OpenEvalData(o));
  }

  // Host copies for initialisation, resume and checkpoints; the device holds the truth.
  std::vector<float> params(n), exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
  table.Initialize(params.data(), o.seed);
  OptimizerBuffers<float> buffers{&params, &exp_avg, &exp_avg_sq};
  int64_t start_step = 0, first_sample = 0;
  const std::string config_json = model::ModelConfigToJson(o.config);
  const std::string trainer_json = TrainerJson(o);
  // Rank 0 writes every checkpoint and holds the folder for the run. (The other ranks learn of
  // a refusal when rank 0 leaves: the NCCL communicator's collectives take device buffers, so
  // the CPU trainer's ShareStatus is not used here.)
  std::unique_ptr<CheckpointDirLock> hold;
  if (!o.checkpoint_dir.empty() && rank == 0) {
    std::string note;
    SATDAR_ASSIGN_OR_RETURN(hold, CheckpointDirLock::Acquire(o.checkpoint_dir, o.resume, &note));
    if (!note.empty() && !o.quiet) std::printf("checkpoints: %s\n", note.c_str());
  }
  double resumed_loss = 0;
  if (o.resume) {
    SATDAR_ASSIGN_OR_RETURN(std::string latest, FindLatestCheckpoint(o.checkpoint_dir));
    if (!latest.empty()) {
      SATDAR_ASSIGN_OR_RETURN(CheckpointInfo info,
                              LoadCheckpoint<float>(latest, config_json, table, buffers));
      SATDAR_RETURN_IF_ERROR(CheckSameRun(info, latest, trainer_json, o.seed));
      start_step = info.step;
      resumed_loss = info.loss;
      first_sample = info.data_position;
      if (!o.quiet) {
        std::printf("resume: %s (step %lld)\n", latest.c_str(), static_cast<long long>(start_step));
      }
    }
  }
  DeviceBuffers dev(&alloc);
  SATDAR_ASSIGN_OR_RETURN(float* master, dev.Zeros<float>(nd));
  SATDAR_ASSIGN_OR_RETURN(float* grads, dev.Zeros<float>(nd));
  SATDAR_ASSIGN_OR_RETURN(float* m, dev.Zeros<float>(nd));
  SATDAR_ASSIGN_OR_RETURN(float* v, dev.Zeros<float>(nd));
  SATDAR_ASSIGN_OR_RETURN(double* scalars, dev.Zeros<double>(2));  // loss, squared norm
  SATDAR_ASSIGN_OR_RETURN(double* norm_scratch, dev.Zeros<double>(model::gpu::kReduceBlocks));
  SATDAR_ASSIGN_OR_RETURN(double* eval_sum, dev.Zeros<double>(1));
  std::vector<float> staging(nd);
  auto upload = [&](float* dst, const std::vector<float>& src) {
    model::gpu::PackToDevice(table, layout, src.data(), staging.data());
    return kc::CopyToDevice(dst, staging.data(), nd * sizeof(float));
  };
  auto download = [&](std::vector<float>* dst, const float* src) -> absl::Status {
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    SATDAR_RETURN_IF_ERROR(kc::CopyToHost(staging.data(), src, nd * sizeof(float)));
    model::gpu::UnpackFromDevice(table, layout, staging.data(), dst->data());
    return absl::OkStatus();
  };
  SATDAR_RETURN_IF_ERROR(upload(master, params));
  SATDAR_RETURN_IF_ERROR(upload(m, exp_avg));
  SATDAR_RETURN_IF_ERROR(upload(v, exp_avg_sq));
  // The zeroing and uploads ran on the legacy stream, which the compute stream (non-blocking)
  // does not wait for.
  SATDAR_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  SATDAR_RETURN_IF_ERROR(model->SetWeights(master));

  // Data parallelism: layer i's gradient slice [layer_start[i], layer_start[i+1]) is
  // all-reduced from the backward hook, after an event on the compute stream.
  std::vector<int64_t> layer_start;
  for (int i = 0; i < o.config.num_hidden_layers; ++i) {
    layer_start.push_back(
        device_offset(absl::StrCat("model.layers.", i, ".input_layernorm.weight")));
  }
  layer_start.push_back(device_offset("model.norm.weight"));
  std::vector<kc::Event> ready(o.config.num_hidden_layers + 1);
  for (auto& e : ready) {
    SATDAR_ASSIGN_OR_RETURN(e, kc::Event::Create());
  }
  std::vector<std::unique_ptr<parallel::Work>> pending;
  absl::Status hook_status;
  auto reduce_range = [&](int event, int64_t begin, int64_t end) {
    absl::Status s = ready[event].Record(stream);
    if (!s.ok()) {
      if (hook_status.ok()) hook_status = s;
      return;
    }
    parallel::CollectiveOptions c = copts;
    c.ready_event = ready[event].get();
    pending.push_back(world->AllReduce(grads + begin, end - begin, core::DType::kF32,
                                       parallel::ReduceOp::kAvg, c));
  };

  JsonlWriter log;
  if (!o.log_jsonl.empty()) SATDAR_RETURN_IF_ERROR(log.Open(o.log_jsonl));
  const double flops_per_token = FlopsPerToken(n, o.config, o.seq_len);
  if (!o.quiet) {
    std::printf("model: %s residual, %s gate, %lld parameters on %s (cuda:%d), %s compute, fp32 "
                "master weights%s; batch %d x %d tokens x %d replica(s), %d micro-batch(es)\n",
                model::Name(o.config.residual), model::Name(o.config.value_residual),
                static_cast<long long>(n), kc::DeviceName(device).c_str(), device,
                gpu.compute == core::DType::kBF16 ? "bf16" : "f32",
                gpu.recompute ? ", activation recomputation" : "", o.batch_size, o.seq_len,
                world_size, o.microbatches);
    std::fflush(stdout);
  }

  std::vector<std::vector<int32_t>> micro(o.microbatches);
  // Validation (as the CPU trainer's): the mean cross-entropy of the first eval_batches
  // batches of the held-out split, micro-batch sized, the same on every replica.
  auto validation_loss = [&]() -> absl::StatusOr<double> {
    const int b = o.batch_size / o.microbatches;
    std::vector<int32_t> tokens(static_cast<size_t>(b) * (o.seq_len + 1));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(eval_sum, 0, sizeof(double), stream));
    for (int i = 0; i < o.eval_batches; ++i) {
      eval_source->Batch(0, 0, static_cast<int64_t>(i) * b, b, o.seq_len, tokens.data());
      SATDAR_RETURN_IF_ERROR(model->Evaluate(tokens.data(), b, o.seq_len, eval_sum));
    }
    double sum = 0;
    SATDAR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&sum, eval_sum, sizeof(double), cudaMemcpyDeviceToHost, stream));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return sum / o.eval_batches;
  };
  data::BatchStream batches(source.get(), {o.seq_len, o.batch_size, o.microbatches, rank,
                                           world_size, start_step + 1, first_sample});
  const int mb_size = o.batch_size / o.microbatches;
  const int64_t tokens_per_step = static_cast<int64_t>(o.batch_size) * world_size * o.seq_len;
  TrainSummary summary;
  double timed_seconds = 0;
  int64_t timed_tokens = 0;
  // Every error inside a step goes through here: collectives already issued are waited for
  // first (each ends by completing or by its timeout aborting the communicator), so no device
  // work is left waiting on a peer when the buffers are freed.
  auto fail = [&](const absl::Status& s, int64_t step) {
    for (auto& w : pending) (void)w->Wait();
    pending.clear();
    return absl::Status(s.code(), absl::StrCat("rank ", rank, " (cuda:", device, "), step ", step,
                                               ": ", s.message()));
  };
  for (int64_t step = start_step + 1; step <= o.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(grads, 0, nd * sizeof(float), stream));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scalars, 0, 2 * sizeof(double), stream));
    for (int mb = 0; mb < o.microbatches; ++mb) {
      batches.Next(&micro[mb]);
      absl::Status s = model->Forward(micro[mb].data(), mb_size, o.seq_len,
                                      1.0 / o.microbatches, scalars);
      if (!s.ok()) return fail(s, step);
      const bool hooked = world != nullptr && mb + 1 == o.microbatches;
      if (hooked) {
        model->SetLayerGradientsReadyHook([&](int layer) {
          reduce_range(layer, layer_start[layer], layer_start[layer + 1]);
        });
      }
      s = model->Backward(grads);
      if (!s.ok()) return fail(s, step);
      if (hooked) {
        model->SetLayerGradientsReadyHook(nullptr);
        // What the hook did not cover: embedding and layer 0, then final norm and head.
        reduce_range(0, 0, layer_start.size() > 2 ? layer_start[1] : layer_start.back());
        reduce_range(o.config.num_hidden_layers, layer_start.back(), nd);
      }
    }
    if (!hook_status.ok()) return fail(hook_status, step);
    double loss = 0;
    if (world != nullptr) {
      // The loss, averaged over the replicas on the NCCL stream after the compute stream.
      absl::Status recorded = ready[0].Record(stream);
      if (!recorded.ok()) return fail(recorded, step);
      parallel::CollectiveOptions c = copts;
      c.ready_event = ready[0].get();
      pending.push_back(world->AllReduce(scalars, 1, core::DType::kF64, parallel::ReduceOp::kAvg, c));
      absl::Status first;
      for (auto& w : pending) {
        absl::Status s = w->Wait();
        if (first.ok() && !s.ok()) first = s;
      }
      pending.clear();
      if (!first.ok()) return fail(first, step);
    }
    // Global gradient norm; the device holds the averaged gradients now.
    SATDAR_CUDA_RETURN_IF_ERROR(model::gpu::SumSquares(scalars + 1, grads, nd, norm_scratch, stream));
    double host[2];
    SATDAR_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, scalars, sizeof(host), cudaMemcpyDeviceToHost, stream));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    loss = host[0];
    const double grad_norm = std::sqrt(host[1]);
    if (!std::isfinite(loss)) {
      return fail(absl::InternalError(absl::StrCat("loss is ", loss, "; lower --lr or check the data")),
                  step);
    }
    const core::AdamWParams hp = AdamWStep(o, step, grad_norm);
    SATDAR_CUDA_RETURN_IF_ERROR(
        static_cast<cudaError_t>(core::cuda::AdamWUpdate(master, grads, m, v, nd, hp, stream)));
    SATDAR_RETURN_IF_ERROR(model->SetWeights(master));  // the bf16 compute copy
    // Step time includes the update (the next step's first kernels queue behind it).
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = tokens_per_step / seconds;
    if (step > start_step + 1 || o.steps == start_step + 1) {
      timed_seconds += seconds;
      timed_tokens += tokens_per_step;
    }
    summary.final_loss = loss;
    const kc::AllocatorStats mem = alloc.Stats();
    const double mfu = tps / world_size * flops_per_token / (gpu.peak_tflops * 1e12);
    Json line{{"step", step},
              {"loss", loss},
              {"lr", hp.lr},
              {"grad_norm", grad_norm},
              {"tokens", step * tokens_per_step},
              {"tokens_per_second", tps},
              {"step_seconds", seconds},
              {"mfu", mfu},
              {"peak_device_bytes", mem.peak_bytes}};
    if (eval_source != nullptr && step % o.eval_every == 0) {
      absl::StatusOr<double> val = validation_loss();
      if (!val.ok()) return fail(val.status(), step);
      line["val_loss"] = *val;
      if (!o.quiet) {
        std::printf("step %5lld/%lld | validation loss %.4f\n", static_cast<long long>(step),
                    static_cast<long long>(o.steps), *val);
      }
    }
    if (absl::Status s = log.Write(line); !s.ok()) return fail(s, step);
    if (!o.quiet && (step % o.log_every == 0 || step == o.steps || step == start_step + 1)) {
      std::printf("step %5lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | MFU "
                  "%.1f%% | peak %.2f GiB\n",
                  static_cast<long long>(step), static_cast<long long>(o.steps), loss, hp.lr,
                  grad_norm, tps, 100 * mfu, mem.peak_bytes / 1073741824.0);
      std::fflush(stdout);
    }
    const bool checkpoint =
        !o.checkpoint_dir.empty() &&
        ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || step == o.steps);
    if (checkpoint && rank == 0) {
      SATDAR_RETURN_IF_ERROR(download(&params, master));
      SATDAR_RETURN_IF_ERROR(download(&exp_avg, m));
      SATDAR_RETURN_IF_ERROR(download(&exp_avg_sq, v));
      const int64_t consumed = first_sample + (step - start_step) * o.batch_size * world_size;
      CheckpointInfo info{step, o.seed, consumed, config_json, trainer_json, loss};
      SATDAR_RETURN_IF_ERROR(SaveCheckpoint<float>(o.checkpoint_dir, info, table, buffers));
      SATDAR_RETURN_IF_ERROR(PruneCheckpoints(o.checkpoint_dir, o.keep_checkpoints));
    }
  }
  if (world != nullptr) {
    absl::Status s = world->Barrier(copts)->Wait();
    if (!s.ok()) return fail(s, o.steps);
  }
  summary.steps = o.steps;
  if (start_step >= o.steps) {  // --resume of a finished run: nothing to train
    summary.final_loss = resumed_loss;
    summary.already_complete = true;
    if (!o.quiet) {
      std::printf("resume: the run already finished all %lld steps; nothing to train\n",
                  static_cast<long long>(o.steps));
    }
  }
  summary.tokens_per_second = timed_seconds > 0 ? timed_tokens / timed_seconds : 0;
  summary.peak_device_bytes = alloc.Stats().peak_bytes;
  summary.mfu = summary.tokens_per_second / world_size * flops_per_token /
                (gpu.peak_tflops * 1e12);
  if (!o.summary_json.empty()) {
    Json j = {{"steps", summary.steps},
              {"final_loss", summary.final_loss},
              {"tokens_per_second", summary.tokens_per_second},
              {"mfu", summary.mfu},
              {"peak_device_bytes", summary.peak_device_bytes},
              {"peak_memory_gib", summary.peak_device_bytes / 1073741824.0},
              {"activation_bytes", model->activation_bytes()},
              {"parameters", n},
              {"device", kc::DeviceName(device)},
              {"compute", gpu.compute == core::DType::kBF16 ? "bf16" : "f32"},
              {"recompute", gpu.recompute},
              {"data_parallel", world_size},
              {"batch", {o.batch_size, o.seq_len}},
              {"already_complete", summary.already_complete}};
    absl::Status s = core::WriteFileAtomically(o.summary_json, j.dump(2) + "\n");
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--summary-json: ", s.message()));
  }
  return summary;
}


#endif  // SATDAR_WITH_CUDA

}  // namespace satdar::worker
