// satdar train: one process, one rank of an mpirun or Gloo launch, threads as ranks, or a GPU.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/device.h"
#include "model/memory_estimate.h"
#include "model/model.h"
#include "parallel/gloo_communicator.h"
#include "parallel/local_communicator.h"
#include "parallel/mesh.h"
#include "parallel/mpi_communicator.h"
#include "worker/cli.h"
#include "worker/cli_util.h"
#include "worker/commands.h"
#include "worker/gpu_trainer.h"
#include "worker/trainer.h"

namespace satdar::worker {

namespace {

void DefineTrainFlags(FlagSet* flags) {
  flags->Define("--config", "model config JSON", true);
  flags->Define("--steps", "optimizer steps", true);
  flags->Define("--batch-size", "sequences per optimizer step", true);
  flags->Define("--seq-len", "tokens per sequence", true);
  flags->Define("--data", "a prepared dataset, or a folder of text files (byte-level tokens)");
  flags->DefineEnum("--data-format", "how to read a folder of text", {"auto", "text", "brown"},
                    "auto");
  flags->DefineBool("--synthetic-data", "train on uniformly random tokens");
  flags->Define("--microbatches", "micro-batches per step (gradient accumulation)", false, "1");
  flags->Define("--threads", "CPU threads", false, "1");
  flags->Define("--seed", "initial weights and data order", false, "0");
  flags->DefineEnum("--dtype", "f32 or f64 (cpu); bf16 or f32 compute (cuda, default bf16)",
                    {"f32", "f64", "bf16"}, "f32");
  flags->Define("--device", "cpu, cuda or cuda:N", false, "cpu");
  flags->DefineBool("--recompute",
                    "with --device cuda: recompute each sublayer's activations in backward");
  flags->Define("--peak-tflops", "with --device cuda: the GPU's dense bf16 peak, for MFU", false,
                "989");
  flags->Define("--lr", "peak learning rate", false, "1e-3");
  flags->Define("--min-lr-ratio", "final learning rate as a fraction of peak", false, "0.1");
  flags->Define("--warmup-steps", "linear warmup steps [default: steps/10]");
  flags->Define("--weight-decay", "AdamW weight decay (all parameters)", false, "0.1");
  flags->Define("--beta1", "AdamW beta1", false, "0.9");
  flags->Define("--beta2", "AdamW beta2", false, "0.95");
  flags->Define("--eps", "AdamW epsilon", false, "1e-8");
  flags->Define("--grad-clip", "global gradient-norm clip (0 = off)", false, "1.0");
  flags->Define("--log-jsonl", "append one JSON object per step");
  flags->Define("--summary-json", "write a summary at the end");
  flags->Define("--log-every", "console line every N steps", false, "1");
  flags->Define("--eval-every",
                "validation loss on the held-out split every N steps (0 = never)", false, "0");
  flags->Define("--eval-batches", "batches of the validation split per evaluation", false, "4");
  DefineTaskFlags(flags);
  flags->Define("--stats-every",
                "add the analysis statistics to the --log-jsonl line every N steps (0 = never)",
                false, "50");
  flags->Define("--checkpoint-dir", "folder for checkpoints (locked by the run)");
  flags->Define("--checkpoint-every", "checkpoint every N steps (and at the end)", false, "0");
  flags->Define("--keep-checkpoints", "newest checkpoints kept", false, "3");
  flags->DefineBool("--resume", "continue from the newest checkpoint in --checkpoint-dir");
  flags->Define("--dp", "data-parallel replicas", false, "1");
  flags->Define("--tp", "tensor-parallel ranks per model (heads, KV groups, MLP, vocabulary)",
                false, "1");
  flags->Define("--pp", "pipeline stages (layers split evenly; 1F1B over --microbatches)", false,
                "1");
  flags->Define("--ep", "expert-parallel ranks (MoE experts split; otherwise more replicas)",
                false, "1");
  flags->Define("--comm-timeout", "seconds a rank waits for a peer before the run fails", false,
                "300");
  flags->DefineEnum("--zero", "ZeRO stage with --dp: 0 (replicated optimizer) or 1 (sharded)",
                    {"0", "1"}, "0");
  flags->DefineEnum("--launcher",
                    "how the dp x tp x pp x ep ranks run: mpi (one process each, under mpirun), "
                    "gloo (one process each, started any way, meeting in --rendezvous) or "
                    "threads (one process)",
                    {"mpi", "gloo", "threads"}, "mpi");
  flags->Define("--rank",
                "with --launcher gloo or --device cuda: this process's rank (or $SATDAR_RANK)");
  flags->Define("--world-size",
                "with --launcher gloo or --device cuda: the number of processes (or "
                "$SATDAR_WORLD_SIZE)");
  flags->Define("--rendezvous",
                "with --launcher gloo or --device cuda --dp > 1: a folder every rank can reach "
                "(shared file system), fresh per launch (or $SATDAR_RENDEZVOUS_DIR)");
  flags->Define("--gloo-iface", "with --launcher gloo: network interface (default: loopback)");
  flags->DefineBool("--quiet", "no console output");
}

// The optimizer, schedule, data, output and layout flags into *o.
absl::Status ParseTrainOptions(const FlagSet& flags, TrainOptions* o) {
  SATDAR_ASSIGN_OR_RETURN(o->steps, flags.GetInt("--steps", 1, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(int64_t batch, flags.GetInt("--batch-size", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t seq, flags.GetInt("--seq-len", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(int64_t micro, flags.GetInt("--microbatches", 1, batch));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1, kMaxThreads));
  SATDAR_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("--seed", 0, kMaxSeed));
  SATDAR_ASSIGN_OR_RETURN(o->lr, flags.GetDouble("--lr", 0.0, false, 1e3));
  SATDAR_ASSIGN_OR_RETURN(o->min_lr_ratio, flags.GetDouble("--min-lr-ratio", 0.0, true, 1.0));
  SATDAR_ASSIGN_OR_RETURN(o->weight_decay, flags.GetDouble("--weight-decay", 0.0, true, 1e3));
  SATDAR_ASSIGN_OR_RETURN(o->beta1, flags.GetDouble("--beta1", 0.0, true, 0.999999));
  SATDAR_ASSIGN_OR_RETURN(o->beta2, flags.GetDouble("--beta2", 0.0, true, 0.999999));
  SATDAR_ASSIGN_OR_RETURN(o->eps, flags.GetDouble("--eps", 0.0, false, 1.0));
  SATDAR_ASSIGN_OR_RETURN(o->grad_clip, flags.GetDouble("--grad-clip", 0.0, true, 1e12));
  SATDAR_ASSIGN_OR_RETURN(o->log_every, flags.GetInt("--log-every", 1, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(o->stats_every, flags.GetInt("--stats-every", 0, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(o->eval_every, flags.GetInt("--eval-every", 0, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(int64_t eval_batches, flags.GetInt("--eval-batches", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(o->mqar, TaskFromFlags(flags));
  SATDAR_ASSIGN_OR_RETURN(o->checkpoint_every, flags.GetInt("--checkpoint-every", 0, kMaxSteps));
  SATDAR_ASSIGN_OR_RETURN(int64_t keep, flags.GetInt("--keep-checkpoints", 1, 1 << 20));
  o->eval_batches = static_cast<int>(eval_batches);
  o->batch_size = static_cast<int>(batch);
  o->seq_len = static_cast<int>(seq);
  o->microbatches = static_cast<int>(micro);
  o->threads = static_cast<int>(threads);
  o->seed = static_cast<uint64_t>(seed);
  o->keep_checkpoints = static_cast<int>(keep);
  if (flags.Has("--warmup-steps")) {
    SATDAR_ASSIGN_OR_RETURN(o->warmup_steps, flags.GetInt("--warmup-steps", 0, o->steps));
  } else {
    o->warmup_steps = o->steps / 10;
  }
  if (o->batch_size % o->microbatches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("satdar train: --batch-size ", o->batch_size,
                                                   " is not divisible by --microbatches ",
                                                   o->microbatches));
  }
  o->synthetic_data = flags.GetBool("--synthetic-data");
  o->data_dir = flags.Get("--data");
  o->data_format = flags.Get("--data-format");
  if (!o->mqar.has_value() && o->synthetic_data == flags.Has("--data")) {
    return absl::InvalidArgumentError(
        "satdar train: give exactly one of --data DIR or --synthetic-data (or --task mqar)");
  }
  o->log_jsonl = flags.Get("--log-jsonl");
  o->summary_json = flags.Get("--summary-json");
  o->checkpoint_dir = flags.Get("--checkpoint-dir");
  o->resume = flags.GetBool("--resume");
  o->quiet = flags.GetBool("--quiet");
  if ((o->resume || o->checkpoint_every > 0) && o->checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "satdar train: --resume and --checkpoint-every need --checkpoint-dir");
  }
  for (const char* f : {"--dp", "--tp", "--pp", "--ep"}) {
    SATDAR_ASSIGN_OR_RETURN(int64_t v, flags.GetInt(f, 1, kMaxRanks));
    (f[2] == 'd' ? o->mesh.dp : f[2] == 't' ? o->mesh.tp : f[2] == 'p' ? o->mesh.pp : o->mesh.ep) =
        static_cast<int>(v);
  }
  if (static_cast<int64_t>(o->mesh.dp) * o->mesh.tp * o->mesh.pp * o->mesh.ep > kMaxRanks) {
    return absl::InvalidArgumentError(absl::StrCat("satdar train: --dp x --tp x --pp x --ep is "
                                                   "more than ", kMaxRanks, " ranks"));
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t timeout, flags.GetInt("--comm-timeout", 1, 7 * 86400));
  o->comm_timeout_seconds = static_cast<int>(timeout);
  o->zero_stage = flags.Get("--zero") == "1" ? 1 : 0;
  return absl::OkStatus();
}

// --rank, --world-size and --rendezvous, when given, override what *id holds (the environment's).
absl::Status ApplyRankFlags(const FlagSet& flags, parallel::GlooOptions* id) {
  if (flags.Has("--rank")) {
    SATDAR_ASSIGN_OR_RETURN(int64_t r, flags.GetInt("--rank", 0, kMaxRanks - 1));
    id->rank = static_cast<int>(r);
  }
  if (flags.Has("--world-size")) {
    SATDAR_ASSIGN_OR_RETURN(int64_t w, flags.GetInt("--world-size", 1, kMaxRanks));
    id->world_size = static_cast<int>(w);
  }
  if (flags.Has("--rendezvous")) id->store_dir = flags.Get("--rendezvous");
  return absl::OkStatus();
}

// An integer environment variable set by a launcher (mpirun), or `fallback`.
int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int out;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

// `satdar train --device cuda`: one process per GPU.
absl::StatusOr<TrainSummary> TrainOnGpu(const FlagSet& flags, TrainOptions o, bool* print_done) {
  GpuTrainOptions gpu;
  const std::string dtype = flags.Has("--dtype") ? flags.Get("--dtype") : "bf16";
  if (dtype != "bf16" && dtype != "f32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train --device cuda: flag --dtype must be bf16 or f32, got '", dtype, "'"));
  }
  gpu.compute = dtype == "bf16" ? core::DType::kBF16 : core::DType::kF32;
  gpu.recompute = flags.GetBool("--recompute");
  SATDAR_ASSIGN_OR_RETURN(core::Device device, core::ParseDevice(flags.Get("--device")));
  gpu.device = flags.Get("--device").find(':') != std::string::npos ? device.index : -1;
  SATDAR_ASSIGN_OR_RETURN(gpu.peak_tflops, flags.GetDouble("--peak-tflops", 0.0, false, 1e6));
  SATDAR_RETURN_IF_ERROR(core::CheckDeviceAvailable(device));
  if (!flags.Has("--stats-every")) o.stats_every = 0;
  // The rank comes from mpirun or from --rank/--world-size (or $SATDAR_RANK /
  // $SATDAR_WORLD_SIZE); the ranks meet over NCCL through --rendezvous.
  parallel::GlooOptions id;  // rank, world size and rendezvous folder (not Gloo's transport)
  const absl::StatusOr<parallel::GlooOptions> env = parallel::GlooOptionsFromEnv();
  if (env.ok()) id = *env;
  id.rank = EnvInt("OMPI_COMM_WORLD_RANK", id.rank);
  id.world_size = EnvInt("OMPI_COMM_WORLD_SIZE", id.world_size);
  SATDAR_RETURN_IF_ERROR(ApplyRankFlags(flags, &id));
  if (id.world_size < 1) id.world_size = 1;  // alone
  if (id.rank < 0 && id.world_size == 1) id.rank = 0;
  if (id.rank < 0 || id.rank >= id.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("satdar train --device cuda: rank ", id.rank,
                                                   " is outside the world of ", id.world_size));
  }
  gpu.rank = id.rank;
  gpu.world_size = id.world_size;
  gpu.rendezvous_dir = id.store_dir;
  absl::StatusOr<TrainSummary> summary = TrainGpu(o, gpu);
  *print_done = gpu.rank == 0;
  if (summary.ok() && !o.quiet && *print_done) {
    std::printf("done: %lld steps, final loss %.4f, %.0f tokens/s, MFU %.1f%%, peak GPU memory "
                "%.2f GiB\n",
                static_cast<long long>(summary->steps), summary->final_loss,
                summary->tokens_per_second, 100 * summary->mfu,
                summary->peak_device_bytes / 1073741824.0);
    *print_done = false;
  }
  return summary;
}

// One rank of a launch without mpirun: the ranks meet through a key-value store.
absl::StatusOr<TrainSummary> TrainGlooRank(const FlagSet& flags, TrainOptions o) {
  parallel::GlooOptions g;
  const absl::StatusOr<parallel::GlooOptions> env = parallel::GlooOptionsFromEnv();
  if (env.ok()) g = *env;
  SATDAR_RETURN_IF_ERROR(ApplyRankFlags(flags, &g));
  if (flags.Has("--gloo-iface")) g.interface = flags.Get("--gloo-iface");
  if (g.rank < 0 || g.world_size < 1 || g.store_dir.empty()) {
    return absl::InvalidArgumentError(
        "satdar train: --launcher gloo needs --rank, --world-size and --rendezvous (or "
        "$SATDAR_RANK, $SATDAR_WORLD_SIZE and $SATDAR_RENDEZVOUS_DIR)");
  }
  if (g.world_size != o.mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the world has ", g.world_size, " ranks but --dp x --tp x --pp x --ep = ",
        o.mesh.ToString(), " = ", o.mesh.size()));
  }
  g.timeout = absl::Seconds(o.comm_timeout_seconds);
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> world, parallel::GlooWorld(g));
  o.world = world->size() > 1 ? world.get() : nullptr;
  return Train(o);
}

// Every rank a thread of this process, talking through the in-process communicator.
absl::StatusOr<TrainSummary> TrainThreads(const TrainOptions& o) {
  SATDAR_RETURN_IF_ERROR(parallel::ValidateMesh(o.mesh, o.mesh.size()));
  auto comms = parallel::MakeLocalCommunicators(o.mesh.size());
  std::vector<absl::StatusOr<TrainSummary>> results(o.mesh.size());
  std::vector<std::thread> ranks;
  for (int r = 0; r < o.mesh.size(); ++r) {
    ranks.emplace_back([&, r] {
      TrainOptions ro = o;
      ro.world = comms[r].get();
      results[r] = Train(ro);
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& res : results) {
    if (!res.ok()) return res.status();
  }
  return results[0];
}

// One rank of an mpirun launch. A failed rank ends the whole job at once (MPI_Abort with the
// exit code): MPI_Finalize would wait forever for a peer that is stopped or stuck.
absl::StatusOr<TrainSummary> TrainMpiRank(TrainOptions o) {
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> world,
                          parallel::MpiWorld(nullptr, nullptr));
  absl::Status layout = parallel::ValidateMesh(o.mesh, world->size());
  absl::StatusOr<TrainSummary> summary;
  if (layout.ok()) {
    o.world = world->size() > 1 ? world.get() : nullptr;
    summary = Train(o);
  } else {
    summary = layout;
  }
  if (!summary.ok()) {
    std::fprintf(stderr, "satdar train: error: %s\n",
                 std::string(summary.status().message()).c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    parallel::MpiAbort(ExitCodeFor(summary.status()));
  }
  world.reset();
  parallel::MpiFinalize();
  return summary;
}

// The global rank this process will have, when the launcher tells (-1: unknown yet).
int ExpectedRank(const FlagSet& flags, const std::string& launcher, int world_size) {
  if (launcher == "threads" || world_size == 1) return 0;
  if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) return EnvInt("OMPI_COMM_WORLD_RANK", -1);
  parallel::GlooOptions g;
  if (auto env = parallel::GlooOptionsFromEnv(); env.ok()) g = *env;
  if (!ApplyRankFlags(flags, &g).ok()) return -1;
  return g.rank;
}

}  // namespace

absl::Status RunTrain(const std::vector<std::string>& args) {
  FlagSet flags("train");
  DefineTrainFlags(&flags);
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  TrainOptions o;
  SATDAR_RETURN_IF_ERROR(ParseTrainOptions(flags, &o));
  SATDAR_ASSIGN_OR_RETURN(core::Device device, core::ParseDevice(flags.Get("--device")));
  const bool cuda = device.type == core::DeviceType::kCuda;
  if (!cuda) {
    if (flags.Get("--dtype") == "bf16") {
      return absl::InvalidArgumentError(
          "satdar train: flag --dtype must be f32 or f64, got 'bf16' (bf16 is for --device cuda)");
    }
    o.f64 = flags.Get("--dtype") == "f64";
    for (const char* f : {"--recompute", "--peak-tflops"}) {
      if (flags.Has(f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("satdar train: flag ", f, " is for --device cuda"));
      }
    }
  }
  const std::string launcher = flags.Get("--launcher");
  const int world_size = o.mesh.size();
  // Files: inputs exist and are what they should be; outputs are writable and no input. Only
  // rank 0 writes the log and summary, so only it checks them.
  const std::vector<InputPath> inputs = {{"--config", flags.Get("--config")},
                                         {"--data", o.data_dir, InputPath::kFolder}};
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  if (ExpectedRank(flags, launcher, world_size) <= 0) {
    SATDAR_RETURN_IF_ERROR(CheckOutput("--log-jsonl", o.log_jsonl, false, inputs));
    SATDAR_RETURN_IF_ERROR(CheckOutput("--summary-json", o.summary_json, false, inputs));
    if (!o.log_jsonl.empty() && o.log_jsonl == o.summary_json) {
      return absl::InvalidArgumentError("satdar train: --log-jsonl and --summary-json are the "
                                        "same file");
    }
  }
  SATDAR_RETURN_IF_ERROR(CheckOutput("--checkpoint-dir", o.checkpoint_dir, true, inputs));
  SATDAR_ASSIGN_OR_RETURN(o.config, model::LoadModelConfig(flags.Get("--config")));
  if (o.seq_len > o.config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train: --seq-len ", o.seq_len, " exceeds max_position_embeddings ",
        o.config.max_position_embeddings, " of ", flags.Get("--config")));
  }
  // Layout errors (divisibility, designs that cannot be split) before any rank starts.
  SATDAR_RETURN_IF_ERROR(model::ValidateSharding(o.config, o.mesh.tp, o.mesh.pp, o.mesh.ep));
  if (!cuda) {
    // What a rank will allocate, against what this machine has (all ranks it runs).
    model::MemoryShape shape;
    shape.batch = o.batch_size;
    shape.seq_len = o.seq_len;
    shape.microbatches = o.microbatches;
    shape.dtype_bytes = o.f64 ? 8 : 4;
    shape.tp = o.mesh.tp;
    shape.pp = o.mesh.pp;
    shape.ep = o.mesh.ep;
    shape.dp = o.mesh.dp;
    shape.zero_stage = o.zero_stage;
    const int here = launcher == "threads" ? world_size
                                           : EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    SATDAR_RETURN_IF_ERROR(model::CheckFitsInMemory(o.config, shape, here, "satdar train"));
  }
  absl::StatusOr<TrainSummary> summary;
  bool print_done = true;
  if (cuda) {
    summary = TrainOnGpu(flags, o, &print_done);
  } else if (launcher == "gloo") {
    summary = TrainGlooRank(flags, o);
    print_done = summary.ok() && ExpectedRank(flags, launcher, world_size) == 0;
  } else if (launcher == "threads" && world_size > 1) {
    summary = TrainThreads(o);
  } else if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    summary = TrainMpiRank(o);
    print_done = EnvInt("OMPI_COMM_WORLD_RANK", 0) == 0;
  } else if (world_size > 1) {
    std::string layout;
    for (const auto& [flag, v] : {std::pair<const char*, int>{"--dp", o.mesh.dp},
                                  {"--tp", o.mesh.tp}, {"--pp", o.mesh.pp}, {"--ep", o.mesh.ep}}) {
      if (v > 1) absl::StrAppend(&layout, layout.empty() ? "" : " ", flag, " ", v);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train: ", layout, " needs ", world_size, " ranks: run under mpirun -np ",
        world_size, " (or add --launcher threads)"));
  } else {
    summary = Train(o);
  }
  if (!summary.ok()) return summary.status();
  if (!o.quiet && print_done) {
    std::printf("done: %lld steps, final loss %.4f, %.0f tokens/s, peak RSS %.1f MiB\n",
                static_cast<long long>(summary->steps), summary->final_loss,
                summary->tokens_per_second, summary->peak_rss_bytes / 1048576.0);
  }
  return absl::OkStatus();
}

}  // namespace satdar::worker
