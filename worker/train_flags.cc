#include "worker/train_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/address.h"
#include "core/check.h"
#include "worker/cli_util.h"

namespace satdar::worker {

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
  flags->DefineEnum("--recompute",
                    "activations recomputed in backward instead of kept: none, selective "
                    "(attention's probabilities) or full (everything inside each sublayer; "
                    "on --device cuda the only kind)",
                    {"none", "selective", "full"}, "none");
  flags->DefineEnum("--gpu-comm",
                    "with --device cuda --dp > 1: how the GPUs exchange gradients: nccl (a GPU "
                    "per rank) or host (through host memory over Gloo; ranks may share a GPU)",
                    {"nccl", "host"}, "nccl");
  flags->Define("--peak-tflops",
                "the peak TFLOP/s per rank MFU divides by (0: a GPU's from its name, a CPU's "
                "measured with a GEMM at start)",
                false, "0");
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
  flags->DefineBool("--resume",
                    "continue from the newest checkpoint in --checkpoint-dir (a larger --steps "
                    "extends the run: the schedule is recomputed for the new total)");
  flags->Define("--init-from",
                "start from this checkpoint's weights (a file, a ckpt_<step>/ folder or a "
                "checkpoint folder's newest; any layout) with a fresh optimizer at step 0");
  flags->Define("--dp", "data-parallel replicas", false, "1");
  flags->Define("--tp", "tensor-parallel ranks per model (heads, KV groups, MLP, vocabulary)",
                false, "1");
  flags->Define("--pp", "pipeline stages (layers split evenly; 1F1B over --microbatches)", false,
                "1");
  flags->Define("--ep", "expert-parallel ranks (MoE experts split; otherwise more replicas)",
                false, "1");
  flags->Define("--virtual-stages",
                "with --pp: model chunks per pipeline rank (interleaved 1F1B: bubble (pp-1)/(V M) "
                "instead of (pp-1)/M, at V times the stage boundaries); --microbatches a "
                "multiple of --pp",
                false, "1");
  flags->DefineBool("--sequence-parallel",
                    "with --tp > 1: split the norms, residual stream and depth histories along "
                    "the tokens (Megatron-LM's sequence parallelism)");
  flags->Define("--vocab-multiple",
                "pad the vocabulary inside the model to a multiple of --tp x N (Megatron's "
                "make-vocab-size-divisible-by): equal TP slices whose width is a multiple of N; "
                "padded rows get no probability and are never saved",
                false, "1");
  flags->Define("--comm-timeout", "seconds a rank waits for a peer before the run fails", false,
                "300");
  flags->DefineEnum("--zero", "ZeRO stage with --dp: 0 (replicated optimizer) or 1 (sharded)",
                    {"0", "1"}, "0");
  flags->DefineEnum("--launcher",
                    "how the dp x tp x pp x ep ranks run: mpi (one process each, under mpirun), "
                    "gloo (one process each, started any way, meeting in --rendezvous), slurm "
                    "(one process per task under srun: rank, world size and local GPU from "
                    "SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, meeting in a folder of "
                    "--rendezvous per job step) or threads (one process)",
                    {"mpi", "gloo", "slurm", "threads"}, "mpi");
  flags->Define("--rank",
                "with --launcher gloo or --device cuda: this process's rank (or $SATDAR_RANK)");
  flags->Define("--world-size",
                "with --launcher gloo or --device cuda: the number of processes (or "
                "$SATDAR_WORLD_SIZE)");
  flags->Define("--rendezvous",
                "with --launcher gloo or --device cuda --dp > 1: a folder every rank can reach "
                "(shared file system), fresh per launch (or $SATDAR_RENDEZVOUS_DIR)");
  flags->Define("--gloo-iface", "with --launcher gloo: network interface (default: loopback)");
  flags->Define("--coordinator",
                "with --launcher gloo: meet through this coordinator's store (HOST:PORT) "
                "instead of --rendezvous; with --job-id and --attempt (the worker sets them)");
  flags->Define("--job-id",
                "the job this run belongs to: the metrics' job_id label (default local) and, with "
                "--coordinator, the job whose store the ranks meet in");
  flags->Define("--attempt", "with --coordinator: the job's attempt (fences older ones)");
  flags->Define("--token-file", "with --coordinator: the worker token (or $SATDAR_TOKEN_FILE)");
  flags->Define("--tls-ca", "with --coordinator: PEM roots for TLS (or $SATDAR_TLS_CA)");
  flags->Define("--lock-wait",
                "seconds to wait for --checkpoint-dir's lock when another run holds it", false,
                "0");
  flags->DefineBool("--quiet", "no console output");
  flags->Define("--metrics-listen",
                "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: a free one, "
                "printed at start); every rank serves its own");
  flags->DefineEnum("--progress",
                    "console progress: bar (one updating line), line (a line per --log-every "
                    "steps) or auto (bar on a terminal)",
                    {"auto", "bar", "line"}, "auto");
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
    SATDAR_ASSIGN_OR_RETURN(o->warmup_steps, flags.GetInt("--warmup-steps", 0, kMaxSteps));
    o->warmup_given = true;
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
  // Validation reads a prepared dataset's held-out split (checked again when the data opens:
  // a --data folder of raw text has none either).
  if (o->eval_every > 0 && (o->synthetic_data || o->mqar.has_value())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar train: --eval-every: validation needs a prepared dataset (--data DIR written by "
        "satdar prep), whose held-out split it reads; ",
        o->mqar.has_value() ? "--task mqar" : "--synthetic-data", " has none"));
  }
  // The dtypes and GPU flags of each device (the device itself is parsed by the command).
  const bool cuda = absl::StartsWith(flags.Get("--device"), "cuda");
  if (!cuda && flags.Get("--dtype") == "bf16") {
    return absl::InvalidArgumentError(
        "satdar train: flag --dtype must be f32 or f64, got 'bf16' (bf16 is for --device cuda)");
  }
  if (!cuda && flags.Has("--gpu-comm")) {
    return absl::InvalidArgumentError("satdar train: flag --gpu-comm is for --device cuda");
  }
  if (cuda && flags.Get("--dtype") == "f64") {
    return absl::InvalidArgumentError(
        "satdar train: flag --dtype must be bf16 or f32, got 'f64' (f64 is for --device cpu)");
  }
  o->log_jsonl = flags.Get("--log-jsonl");
  o->summary_json = flags.Get("--summary-json");
  o->checkpoint_dir = flags.Get("--checkpoint-dir");
  o->resume = flags.GetBool("--resume");
  o->init_from = flags.Get("--init-from");
  o->quiet = flags.GetBool("--quiet");
  o->progress = flags.Get("--progress");
  o->metrics_listen = flags.Get("--metrics-listen");
  if (!o->metrics_listen.empty()) {
    SATDAR_RETURN_IF_ERROR(
        core::SplitHostPort(o->metrics_listen, "satdar train: --metrics-listen", nullptr, nullptr));
  }
  if (flags.Has("--job-id")) {
    o->job_id = flags.Get("--job-id");
    // It labels every metric: printable ASCII keeps the exposition valid for any scraper.
    const bool printable = !o->job_id.empty() &&
                           std::all_of(o->job_id.begin(), o->job_id.end(),
                                       [](char ch) { return absl::ascii_isprint(ch); });
    if (!printable || o->job_id.size() > 256) {
      return absl::InvalidArgumentError(
          "satdar train: --job-id must be 1 to 256 printable ASCII characters");
    }
  }
  SATDAR_ASSIGN_OR_RETURN(o->peak_tflops, flags.GetDouble("--peak-tflops", 0.0, true, 1e6));
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
  o->recompute = model::RecomputeNamed(flags.Get("--recompute"));
  SATDAR_ASSIGN_OR_RETURN(int64_t virtual_stages, flags.GetInt("--virtual-stages", 1, 64));
  o->virtual_stages = static_cast<int>(virtual_stages);
  if (o->virtual_stages > 1) {
    if (o->mesh.pp < 2) {
      return absl::InvalidArgumentError(
          "satdar train: --virtual-stages needs --pp 2 or more (the chunks interleave over the "
          "pipeline ranks)");
    }
    if (o->microbatches % o->mesh.pp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "satdar train: --virtual-stages ", o->virtual_stages, " needs --microbatches a multiple "
          "of --pp ", o->mesh.pp, " (the interleaved schedule moves them in groups of --pp), got ",
          o->microbatches));
    }
  }
  o->sequence_parallel = flags.GetBool("--sequence-parallel");
  if (o->sequence_parallel) {
    if (o->mesh.tp < 2) {
      return absl::InvalidArgumentError(
          "satdar train: --sequence-parallel needs --tp 2 or more (it splits the token rows "
          "over the tensor-parallel ranks)");
    }
    const int64_t rows = static_cast<int64_t>(o->batch_size / o->microbatches) * o->seq_len;
    if (rows % o->mesh.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "satdar train: --sequence-parallel: a micro-batch's ", rows,
          " tokens (--batch-size / --microbatches x --seq-len) are not divisible by --tp ",
          o->mesh.tp));
    }
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t multiple, flags.GetInt("--vocab-multiple", 1, 65536));
  o->vocab_multiple = static_cast<int>(multiple);
  SATDAR_ASSIGN_OR_RETURN(o->lock_wait_seconds, flags.GetInt("--lock-wait", 0, 86400));
  return absl::OkStatus();
}

absl::Status CheckGpuPathOptions(const TrainOptions& o, OptionNames names) {
  // "stats_every" as the flag --stats-every or the field stats_every.
  auto n = [names](std::string field) {
    if (names == OptionNames::kFields) return field;
    for (char& c : field) c = c == '_' ? '-' : c;
    return "--" + field;
  };
  const std::string cuda = n("device") + " cuda: ";
  if (o.mesh.tp != 1 || o.mesh.pp != 1 || o.mesh.ep != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        cuda, "tensor, pipeline and expert parallelism are not on the GPU path yet (data "
        "parallelism is: ", n("dp"), " N); use ", n("device"), " cpu for ", n("tp"), "/",
        n("pp"), "/", n("ep")));
  }
  if (o.stats_every > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(cuda, n("stats_every"), " is not on the GPU path yet"));
  }
  if (o.f64) return absl::InvalidArgumentError(absl::StrCat(cuda, n("dtype"), " must be bf16 or f32"));
  if (o.virtual_stages > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        cuda, n("virtual_stages"), " is not on the GPU path yet (it needs ", n("pp"), ")"));
  }
  if (o.sequence_parallel) {
    return absl::InvalidArgumentError(absl::StrCat(
        cuda, n("sequence_parallel"), " is not on the GPU path yet (it needs ", n("tp"), ")"));
  }
  if (o.vocab_multiple != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        cuda, n("vocab_multiple"), " is not on the GPU path yet (the GPU model's head runs the "
        "true vocabulary); use ", n("vocab_multiple"), " 1"));
  }
  return absl::OkStatus();
}

absl::Status ValidateVirtualStages(const model::ModelConfig& c, const TrainOptions& o,
                                   const model::LayoutNames& names) {
  if (o.virtual_stages == 1) return absl::OkStatus();
  const int stages = o.mesh.pp * o.virtual_stages;
  if (c.num_hidden_layers % stages != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.pp, " ", o.mesh.pp, " x --virtual-stages ", o.virtual_stages, " = ", stages,
        " virtual stages do not divide config field \"num_hidden_layers\" (",
        c.num_hidden_layers, ")"));
  }
  if (c.value_residual == model::ValueResidualKind::kResFormer &&
      c.resformer_mode == model::ResformerMode::kLearnablePlus) {
    return absl::InvalidArgumentError(
        "config field \"resformer_mode\" \"learnable_plus\" shares its lambdas across every "
        "stage, which a rank's several chunks cannot hold yet; use --virtual-stages 1");
  }
  return absl::OkStatus();
}

}  // namespace satdar::worker
