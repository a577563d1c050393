// satdar train: one process, one rank of an mpirun or Gloo launch, threads as ranks, or a GPU.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

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
#include "comm/gloo_communicator.h"
#include "comm/local_communicator.h"
#include "comm/mesh.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/staged_communicator.h"
#include "settings/train_settings.h"
#include "cli/cli.h"
#include "runtime/cpu_engine.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "runtime/cuda_engine.h"
#include "agent/grpc_kv_store.h"
#include "agent/rank_lease.h"
#include "runtime/rank_agreement.h"
#include "cli/train_flags.h"
#include "cli/tokenizer_process.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "runtime/decode_session.h"
#include "runtime/generate.h"
#include "runtime/trainer.h"

namespace satdar::cli {

namespace {

// --rank, --world-size and --rendezvous, when given, override what *id holds (the environment's).
absl::Status ApplyRankFlags(const FlagSet& flags, comm::GlooOptions* id) {
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

// --launcher slurm: the task's rank and the step's world size from srun's environment, and a
// rendezvous folder of its own under --rendezvous for this job, step and restart (a requeued
// job's new run never meets the ranks of the old one).
absl::Status ApplySlurm(const FlagSet& flags, comm::GlooOptions* g) {
  const int rank = EnvInt("SLURM_PROCID", -1), tasks = EnvInt("SLURM_NTASKS", -1);
  if (rank < 0 || tasks < 1) {
    return absl::InvalidArgumentError(
        "satdar train: --launcher slurm needs SLURM_PROCID and SLURM_NTASKS: run it under srun");
  }
  g->rank = rank;
  g->world_size = tasks;
  if (flags.Has("--coordinator")) return absl::OkStatus();
  if (!flags.Has("--rendezvous")) {
    return absl::InvalidArgumentError(
        "satdar train: --launcher slurm needs --rendezvous DIR (a folder every node reaches) or "
        "--coordinator");
  }
  const char* job = std::getenv("SLURM_JOB_ID");
  const char* step = std::getenv("SLURM_STEP_ID");
  g->store_dir = absl::StrCat(flags.Get("--rendezvous"), "/slurm-", job ? job : "job", ".",
                              step ? step : "0", "-restart", EnvInt("SLURM_RESTART_COUNT", 0));
  return absl::OkStatus();
}

// --coordinator, --job-id, --attempt, the token and TLS roots: how a rank a worker started
// reaches its coordinator.
absl::StatusOr<agent::CoordinatorStoreOptions> CoordinatorOptions(const FlagSet& flags) {
  agent::CoordinatorStoreOptions c;
  c.address = flags.Get("--coordinator");
  c.job_id = flags.Get("--job-id");
  SATDAR_ASSIGN_OR_RETURN(int64_t attempt, flags.GetInt("--attempt", 1, 1 << 20));
  c.attempt = static_cast<int>(attempt);
  if (c.job_id.empty() || !flags.Has("--attempt")) {
    return absl::InvalidArgumentError("satdar train: --coordinator needs --job-id and --attempt");
  }
  const std::string token_file = flags.Has("--token-file") ? flags.Get("--token-file")
                                 : std::getenv("SATDAR_TOKEN_FILE") ? std::getenv("SATDAR_TOKEN_FILE")
                                                                    : "";
  if (!token_file.empty()) {
    SATDAR_ASSIGN_OR_RETURN(c.token, rpc::ReadTokenFile(token_file));
  }
  // The session of the worker that started this rank: the coordinator lets it touch only
  // that worker's ranks (a secret, so passed in the environment, not on the command line).
  if (const char* session = std::getenv("SATDAR_WORKER_SESSION")) c.session = session;
  c.channel.ca_file = flags.Has("--tls-ca") ? flags.Get("--tls-ca")
                      : std::getenv("SATDAR_TLS_CA") ? std::getenv("SATDAR_TLS_CA")
                                                     : "";
  c.channel.ca_name = "--tls-ca";
  return c;
}

// A rank of a job's attempt (--coordinator with --attempt) keeps a lease of its own
// (agent/rank_lease.h): it stops once the coordinator fences the attempt, and writes nothing
// after.
absl::StatusOr<std::unique_ptr<agent::RankLease>> StartRankLease(const FlagSet& flags,
                                                                  runtime::TrainOptions* o) {
  if (!flags.Has("--coordinator") || !flags.Has("--attempt")) return nullptr;
  agent::RankLeaseOptions l;
  SATDAR_ASSIGN_OR_RETURN(l.coordinator, CoordinatorOptions(flags));
  if (flags.Has("--rank")) {
    SATDAR_ASSIGN_OR_RETURN(int64_t rank, flags.GetInt("--rank", 0, kMaxRanks));
    l.rank = static_cast<int>(rank);
  }
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<agent::RankLease> lease, agent::RankLease::Start(l));
  o->may_write = [raw = lease.get()] { return raw->MayWrite(); };
  return lease;
}

// The rendezvous of a launch with one process per rank: this rank, the world size and the store
// the ranks meet in (the coordinator's for a job run by workers, else a shared folder's).
// mpirun's environment gives the rank when `mpi_env` (GPU ranks under mpirun meet over Gloo
// and NCCL, not MPI).
absl::StatusOr<comm::GlooOptions> Rendezvous(const FlagSet& flags,
                                             const runtime::TrainOptions& o, bool mpi_env) {
  comm::GlooOptions g;
  const absl::StatusOr<comm::GlooOptions> env = comm::GlooOptionsFromEnv();
  if (env.ok()) g = *env;
  if (mpi_env) {
    g.rank = EnvInt("OMPI_COMM_WORLD_RANK", g.rank);
    g.world_size = EnvInt("OMPI_COMM_WORLD_SIZE", g.world_size);
  }
  SATDAR_RETURN_IF_ERROR(ApplyRankFlags(flags, &g));
  if (flags.Get("--launcher") == "slurm") SATDAR_RETURN_IF_ERROR(ApplySlurm(flags, &g));
  if (flags.Has("--gloo-iface")) g.interface = flags.Get("--gloo-iface");
  if (flags.Has("--coordinator")) {
    // Meet through the coordinator's store of this job's attempt (a job run by workers).
    SATDAR_ASSIGN_OR_RETURN(const agent::CoordinatorStoreOptions c, CoordinatorOptions(flags));
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<comm::KvStore> store, agent::OpenCoordinatorStore(c));
    g.store = std::shared_ptr<comm::KvStore>(std::move(store));
    g.store_dir = "coordinator";
  }
  if (g.rank < 0 || g.world_size < 1 || g.store_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train: ", mpi_env ? "--device cuda with --dp > 1" : "--launcher gloo",
        " needs --rank, --world-size and --rendezvous (or $SATDAR_RANK, $SATDAR_WORLD_SIZE and "
        "$SATDAR_RENDEZVOUS_DIR)"));
  }
  if (g.world_size != o.mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the world has ", g.world_size, " ranks but --dp x --tp x --pp x --ep = ",
        o.mesh.ToString(), " = ", o.mesh.size()));
  }
  g.timeout = absl::Seconds(o.comm_timeout_seconds);
  return g;
}

// `satdar train --device cuda`: one process per rank, each on a GPU of its own (NCCL) or
// sharing GPUs (--gpu-comm host: device buffers staged through Gloo). The ranks' host world
// (Gloo) carries what every rank must agree on; the device world carries the gradients.
absl::StatusOr<runtime::TrainSummary> TrainOnGpu(const FlagSet& flags, runtime::TrainOptions o,
                                                 bool* print_done) {
  runtime::GpuOptions& gpu = o.gpu;
  gpu.enabled = true;
  const std::string dtype = flags.Has("--dtype") ? flags.Get("--dtype") : "bf16";
  if (dtype != "bf16" && dtype != "f32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train --device cuda: flag --dtype must be bf16 or f32, got '", dtype, "'"));
  }
  gpu.compute = dtype == "bf16" ? core::DType::kBF16 : core::DType::kF32;
  // The GPU's attention never stores the probabilities (core/ops/attention_cuda.h: its
  // backward recomputes them from the saved log-sum-exp), so selective is what it always does.
  gpu.recompute = o.recompute == model::Recompute::kFull;
  SATDAR_ASSIGN_OR_RETURN(core::Device device, core::ParseDevice(flags.Get("--device")));
  gpu.device = flags.Get("--device").find(':') != std::string::npos ? device.index : -1;
  // Under srun each task takes the GPU of its local rank on the node.
  if (gpu.device < 0 && flags.Get("--launcher") == "slurm") gpu.device = EnvInt("SLURM_LOCALID", -1);
  SATDAR_RETURN_IF_ERROR(core::CheckDeviceAvailable(device));
  if (!flags.Has("--stats-every")) o.stats_every = 0;
  // What the GPU engine cannot run is refused before any rank connects: the flags, then the
  // design.
  SATDAR_RETURN_IF_ERROR(settings::CheckGpuPathOptions(o, settings::Spelling::kFlags));
  SATDAR_RETURN_IF_ERROR(runtime::CheckCudaEngine(o));
  const bool staged = flags.Get("--gpu-comm") == "host";
  std::unique_ptr<comm::Communicator> host, device_world;
  int rank = 0;
  if (o.mesh.size() > 1) {
    SATDAR_ASSIGN_OR_RETURN(comm::GlooOptions g, Rendezvous(flags, o, /*mpi_env=*/true));
    rank = g.rank;
    if (g.store == nullptr) {
      SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<comm::FileKvStore> files,
                              comm::FileKvStore::Open(g.store_dir));
      g.store = std::shared_ptr<comm::KvStore>(std::move(files));
    }
    SATDAR_ASSIGN_OR_RETURN(host, comm::GlooWorld(g));
    comm::CollectiveOptions copts;
    copts.timeout = g.timeout;
    // Every rank must be building the same device world: compare the runs first.
    gpu.world_kind = staged ? "host staging (Gloo)" : "NCCL";
    SATDAR_RETURN_IF_ERROR(
        runtime::CheckSameOnEveryRank(host.get(), runtime::RunFingerprint(o), copts));
    if (staged) {
      SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> part,
                              host->Split(0, g.rank, copts));
      device_world = comm::StageThroughHost(std::move(part), comm::CudaCopier());
    } else {
      comm::NcclOptions n;
      n.rank = g.rank;
      n.world_size = g.world_size;
      n.device = gpu.device;
      n.store = g.store;
      n.prefix = g.prefix + "nccl/";
      n.timeout = g.timeout;
      SATDAR_ASSIGN_OR_RETURN(device_world, comm::NcclWorld(n));
    }
    o.world = host.get();
    gpu.world = device_world.get();
  }
  absl::StatusOr<runtime::TrainSummary> summary = runtime::Train(o);
  *print_done = rank == 0;
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
absl::StatusOr<runtime::TrainSummary> TrainGlooRank(const FlagSet& flags,
                                                    runtime::TrainOptions o) {
  SATDAR_ASSIGN_OR_RETURN(comm::GlooOptions g, Rendezvous(flags, o, /*mpi_env=*/false));
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> world, comm::GlooWorld(g));
  o.world = world->size() > 1 ? world.get() : nullptr;
  return runtime::Train(o);
}

// Every rank a thread of this process, talking through the in-process communicator.
absl::StatusOr<runtime::TrainSummary> TrainThreads(const runtime::TrainOptions& o) {
  SATDAR_RETURN_IF_ERROR(comm::ValidateMesh(o.mesh, o.mesh.size()));
  auto comms = comm::MakeLocalCommunicators(o.mesh.size());
  std::vector<absl::StatusOr<runtime::TrainSummary>> results(o.mesh.size());
  std::vector<std::thread> ranks;
  for (int r = 0; r < o.mesh.size(); ++r) {
    ranks.emplace_back([&, r] {
      runtime::TrainOptions ro = o;
      ro.world = comms[r].get();
      results[r] = runtime::Train(ro);
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
absl::StatusOr<runtime::TrainSummary> TrainMpiRank(runtime::TrainOptions o) {
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> world,
                          comm::MpiWorld(nullptr, nullptr));
  absl::Status layout = comm::ValidateMesh(o.mesh, world->size());
  absl::StatusOr<runtime::TrainSummary> summary;
  if (layout.ok()) {
    o.world = world->size() > 1 ? world.get() : nullptr;
    summary = runtime::Train(o);
  } else {
    summary = layout;
  }
  if (!summary.ok()) {
    std::fprintf(stderr, "satdar train: error: %s\n",
                 std::string(summary.status().message()).c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    comm::MpiAbort(ExitCodeFor(summary.status()));
  }
  world.reset();
  comm::MpiFinalize();
  return summary;
}

// The global rank this process will have, when the launcher tells (-1: unknown yet).
int ExpectedRank(const FlagSet& flags, const std::string& launcher, int world_size) {
  if (launcher == "threads" || world_size == 1) return 0;
  if (launcher == "slurm") return EnvInt("SLURM_PROCID", -1);
  if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) return EnvInt("OMPI_COMM_WORLD_RANK", -1);
  comm::GlooOptions g;
  if (auto env = comm::GlooOptionsFromEnv(); env.ok()) g = *env;
  if (!ApplyRankFlags(flags, &g).ok()) return -1;
  return g.rank;
}

// --sample-every: the prompt encoded once at the start, and each sample a greedy continuation
// decoded from a copy of the weights (runtime::TrainOptions::sample) on this process's CPU.
// The tokenizer is the --data dataset's (a `satdar-prep tokenize` child process); a folder of
// raw text trains on its bytes, which are their own tokenizer.
class TrainSampler {
 public:
  static absl::StatusOr<std::unique_ptr<TrainSampler>> Start(const runtime::TrainOptions& o) {
    auto s = std::unique_ptr<TrainSampler>(new TrainSampler(o));
    if (data::Dataset::IsDataset(o.data_dir)) {
      SATDAR_ASSIGN_OR_RETURN(const std::string model, ResolveTokenizerPath("", o.data_dir));
      SATDAR_ASSIGN_OR_RETURN(s->tokenizer_, TokenizerProcess::Start(model));
      SATDAR_RETURN_IF_ERROR(
          CheckTokenizerFits(model, s->tokenizer_->vocab_size(), o.config.vocab_size));
      SATDAR_ASSIGN_OR_RETURN(s->prompt_, s->tokenizer_->Encode(o.sample_prompt));
      s->sampling_.eos_id = s->tokenizer_->eos_id();
    } else {
      for (unsigned char c : o.sample_prompt) s->prompt_.push_back(c);
      s->sampling_.eos_id = -1;  // a byte stream has no end-of-document token
    }
    if (s->prompt_.empty()) {
      return absl::InvalidArgumentError("satdar train: --sample-prompt encodes to no tokens");
    }
    const int window = o.config.max_position_embeddings;
    if (static_cast<int64_t>(s->prompt_.size()) + o.sample_tokens > window) {
      return absl::InvalidArgumentError(absl::StrCat(
          "satdar train: --sample-prompt (", s->prompt_.size(), " tokens) + --sample-tokens ",
          o.sample_tokens, " exceed max_position_embeddings ", window, " of --config"));
    }
    for (const int32_t id : s->prompt_) {
      if (id >= o.config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "satdar train: --sample-prompt holds token ", id, ", outside the config's vocab_size ",
            o.config.vocab_size));
      }
    }
    return s;
  }

  // The prompt and its continuation as UTF-8 text (what the log's JSON can hold).
  absl::StatusOr<std::string> Sample(std::vector<float> weights) {
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<runtime::DecodeSession> session,
                            runtime::DecodeSession::FromParams(config_, std::move(weights),
                                                               threads_));
    SATDAR_ASSIGN_OR_RETURN(const runtime::GenerateResult r,
                            runtime::Generate(session.get(), {prompt_}, sampling_, nullptr));
    std::vector<int32_t> ids = prompt_;
    ids.insert(ids.end(), r.ids[0].begin(), r.ids[0].end());
    SATDAR_ASSIGN_OR_RETURN(const std::string text, Text(ids));
    data::DecodeStats stats;
    return data::DecodeText(text, &stats, /*at_start=*/false);
  }

 private:
  explicit TrainSampler(const runtime::TrainOptions& o)
      : config_(o.config), threads_(o.threads) {
    sampling_.max_new_tokens = o.sample_tokens;  // greedy: temperature 0, no random draws
  }

  // Ids the tokenizer has no piece for (the model's vocabulary past the tokenizer's, padded by
  // prep; past 255 for bytes) print as U+FFFD.
  absl::StatusOr<std::string> Text(const std::vector<int32_t>& ids) {
    static constexpr char kReplacement[] = "\xEF\xBF\xBD";
    const int known = tokenizer_ != nullptr ? tokenizer_->vocab_size() : 256;
    std::string text;
    std::vector<int32_t> run;
    for (size_t i = 0; i <= ids.size(); ++i) {
      const bool end = i == ids.size();
      if (!end && ids[i] >= 0 && ids[i] < known) {
        run.push_back(ids[i]);
        continue;
      }
      if (tokenizer_ != nullptr && !run.empty()) {
        SATDAR_ASSIGN_OR_RETURN(const std::string piece, tokenizer_->Decode(run));
        text += piece;
      } else {
        for (const int32_t b : run) text.push_back(static_cast<char>(b));
      }
      run.clear();
      if (!end) text += kReplacement;
    }
    return text;
  }

  model::ModelConfig config_;
  int threads_;
  runtime::SamplingOptions sampling_;
  std::unique_ptr<TokenizerProcess> tokenizer_;  // null: bytes
  std::vector<int32_t> prompt_;
};

}  // namespace

// A rank that a worker started (SATDAR_WORKER_PID) never outlives it: the kernel sends it
// SIGKILL when the worker's process ends, kill -9 included (the worker starts ranks from its
// main thread, which lives as long as the process), and a worker already gone by the time
// this runs is noticed here. Otherwise the orphan would train on, holding the job's
// checkpoint folder, while the coordinator retries the job elsewhere.
absl::Status DieWithWorker() {
  const char* env = std::getenv("SATDAR_WORKER_PID");
  if (env == nullptr) return absl::OkStatus();
  int worker = 0;
  if (!absl::SimpleAtoi(env, &worker) || worker <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("satdar train: SATDAR_WORKER_PID is '", env, "', not a process id"));
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != worker) {
    return absl::UnavailableError(absl::StrCat(
        "satdar train: the worker that started this rank (pid ", worker, ") is gone"));
  }
  return absl::OkStatus();
}

absl::Status RunTrain(const std::vector<std::string>& args) {
  SATDAR_RETURN_IF_ERROR(DieWithWorker());
  FlagSet flags("train");
  DefineTrainFlags(&flags);
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  runtime::TrainOptions o;
  SATDAR_RETURN_IF_ERROR(ParseTrainOptions(flags, &o));
  SATDAR_ASSIGN_OR_RETURN(const std::unique_ptr<agent::RankLease> lease, StartRankLease(flags, &o));
  SATDAR_ASSIGN_OR_RETURN(core::Device device, core::ParseDevice(flags.Get("--device")));
  const bool cuda = device.type == core::DeviceType::kCuda;
  // ParseTrainOptions checked the dtype against the device (bf16 and --gpu-comm only on cuda).
  if (!cuda) o.f64 = flags.Get("--dtype") == "f64";
  const std::string launcher = flags.Get("--launcher");
  const int world_size = o.mesh.size();
  // Files: inputs exist and are what they should be; outputs are writable and no input. Only
  // rank 0 writes the log and summary: a single process checks them here, a rank 0 among
  // other processes in Train, which ends every rank with its error.
  const std::vector<InputPath> inputs = {{"--config", flags.Get("--config")},
                                         {"--data", o.data_dir, InputPath::kFolder},
                                         {"--init-from", o.init_from, InputPath::kFileOrFolder}};
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  if (world_size == 1 || launcher == "threads") {
    SATDAR_RETURN_IF_ERROR(CheckOutput("--log-jsonl", o.log_jsonl, false, inputs));
    SATDAR_RETURN_IF_ERROR(CheckOutput("--summary-json", o.summary_json, false, inputs));
    if (!o.log_jsonl.empty() && o.log_jsonl == o.summary_json) {
      return absl::InvalidArgumentError("satdar train: --log-jsonl and --summary-json are the "
                                        "same file");
    }
    SATDAR_RETURN_IF_ERROR(CheckOutput("--checkpoint-dir", o.checkpoint_dir, true, inputs));
  }
  SATDAR_ASSIGN_OR_RETURN(o.config, model::LoadModelConfig(flags.Get("--config")));
  if (o.seq_len > o.config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train: --seq-len ", o.seq_len, " exceeds max_position_embeddings ",
        o.config.max_position_embeddings, " of ", flags.Get("--config")));
  }
  // Layout errors (divisibility, designs that cannot be split) before any rank starts.
  SATDAR_RETURN_IF_ERROR(model::ValidateSharding(o.config, o.mesh.tp, o.mesh.pp, o.mesh.ep,
                                                 settings::LayoutNamesOf(settings::Spelling::kFlags),
                                                 o.vocab_multiple));
  SATDAR_RETURN_IF_ERROR(settings::ValidateVirtualStages(o.config, o, settings::Spelling::kFlags));
  SATDAR_RETURN_IF_ERROR(settings::ValidateSampleLayout(o.config, o, settings::Spelling::kFlags));
  // Samples are rank 0's: its process (or any whose rank is not known yet) starts the
  // tokenizer and encodes the prompt now, so a bad prompt fails before any step.
  std::unique_ptr<TrainSampler> sampler;
  if (o.sample_every > 0 && ExpectedRank(flags, launcher, world_size) <= 0) {
    SATDAR_ASSIGN_OR_RETURN(sampler, TrainSampler::Start(o));
    o.sample = [raw = sampler.get()](int64_t, std::vector<float> weights) {
      return raw->Sample(std::move(weights));
    };
  }
  if (!cuda) {
    // What a rank will allocate, against what this machine has (all ranks it runs).
    const model::MemoryShape shape = runtime::TrainMemoryShape(o);
    const int here = launcher == "threads" ? world_size
                                           : EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    SATDAR_RETURN_IF_ERROR(model::CheckFitsInMemory(o.config, shape, here, "satdar train", kCliBatchNames));
  }
  absl::StatusOr<runtime::TrainSummary> summary;
  bool print_done = true;
  if (cuda) {
    summary = TrainOnGpu(flags, o, &print_done);
  } else if (launcher == "gloo" || launcher == "slurm") {
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
    summary = runtime::Train(o);
  }
  if (!summary.ok()) return summary.status();
  if (!o.quiet && print_done) {
    std::printf("done: %lld steps, final loss %.4f, %.0f tokens/s, peak RSS %.1f MiB\n",
                static_cast<long long>(summary->steps), summary->final_loss,
                summary->tokens_per_second, summary->peak_rss_bytes / 1048576.0);
  }
  return absl::OkStatus();
}

}  // namespace satdar::cli
