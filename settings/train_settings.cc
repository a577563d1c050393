#include "settings/train_settings.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/parse_number.h"

namespace satdar::settings {

namespace {

SettingDef Value(std::string name, std::string help, bool required = false,
                 std::string default_value = "") {
  return {std::move(name), SettingKind::kValue, std::move(help), required,
          std::move(default_value), {}};
}
SettingDef Bool(std::string name, std::string help) {
  return {std::move(name), SettingKind::kBool, std::move(help), false, "", {}};
}
SettingDef Enum(std::string name, std::string help, std::vector<std::string> choices,
                std::string default_value) {
  return {std::move(name), SettingKind::kEnum, std::move(help), false, std::move(default_value),
          std::move(choices)};
}

std::vector<SettingDef> MakeTrainSettingDefs() {
  return {
      Value("config", "model config JSON", true),
      Value("steps", "optimizer steps", true),
      Value("batch_size", "sequences per optimizer step", true),
      Value("seq_len", "tokens per sequence", true),
      Value("data", "a prepared dataset, or a folder of text files (byte-level tokens)"),
      Enum("data_format", "how to read a folder of text", {"auto", "text", "brown"}, "auto"),
      Bool("synthetic_data", "train on uniformly random tokens"),
      Value("microbatches", "micro-batches per step (gradient accumulation)", false, "1"),
      Value("threads", "CPU threads", false, "1"),
      Value("seed", "initial weights and data order", false, "0"),
      Enum("dtype", "f32 or f64 (cpu); bf16 or f32 compute (cuda, default bf16)",
           {"f32", "f64", "bf16"}, "f32"),
      Value("device", "cpu, cuda or cuda:N", false, "cpu"),
      Enum("recompute",
           "activations recomputed in backward instead of kept: none, selective (attention's "
           "probabilities) or full (everything inside each sublayer; on --device cuda the only "
           "kind)",
           {"none", "selective", "full"}, "none"),
      Enum("gpu_comm",
           "with --device cuda --dp > 1: how the GPUs exchange gradients: nccl (a GPU per rank) "
           "or host (through host memory over Gloo; ranks may share a GPU)",
           {"nccl", "host"}, "nccl"),
      Value("peak_tflops",
            "the peak TFLOP/s per rank MFU divides by (0: a GPU's from its name, a CPU's "
            "measured with a GEMM at start)",
            false, "0"),
      Value("lr", "peak learning rate", false, "1e-3"),
      Value("min_lr_ratio", "final learning rate as a fraction of peak", false, "0.1"),
      Value("warmup_steps", "linear warmup steps [default: steps/10]"),
      Value("weight_decay", "AdamW weight decay (all parameters)", false, "0.1"),
      Value("beta1", "AdamW beta1", false, "0.9"),
      Value("beta2", "AdamW beta2", false, "0.95"),
      Value("eps", "AdamW epsilon", false, "1e-8"),
      Value("grad_clip", "global gradient-norm clip (0 = off)", false, "1.0"),
      Value("log_jsonl", "append one JSON object per step"),
      Value("summary_json", "write a summary at the end"),
      Value("log_every", "console line every N steps", false, "1"),
      Value("eval_every", "validation loss on the held-out split every N steps (0 = never)",
            false, "0"),
      Value("eval_batches", "batches of the validation split per evaluation", false, "4"),
      Value("sample_every",
            "print a greedy continuation of --sample-prompt every N steps and at the end, from "
            "rank 0's weights (0 = never; not with --tp or --pp > 1, nor --ep > 1 with experts)",
            false, "0"),
      Value("sample_prompt",
            "with --sample-every: the text the samples continue, encoded by the --data dataset's "
            "tokenizer (a folder of raw text: its bytes)"),
      Value("sample_tokens", "with --sample-every: new tokens per sample", false, "32"),
      Enum("task",
           "the training task: the data's language modelling, or multi-query associative recall",
           {"lm", "mqar"}, "lm"),
      Value("mqar_keys", "MQAR: distinct key ids", false, "64"),
      Value("mqar_values", "MQAR: distinct value ids", false, "64"),
      Value("mqar_pairs", "MQAR: key-value pairs per sequence", false, "8"),
      Value("mqar_queries", "MQAR: queries per sequence", false, "8"),
      Value("stats_every",
            "add the analysis statistics to the --log-jsonl line every N steps (0 = never)",
            false, "50"),
      Value("checkpoint_dir", "folder for checkpoints (locked by the run)"),
      Value("checkpoint_every", "checkpoint every N steps (and at the end)", false, "0"),
      Value("keep_checkpoints", "newest checkpoints kept", false, "3"),
      Bool("resume",
           "continue from the newest checkpoint in --checkpoint-dir (a larger --steps extends "
           "the run: the schedule is recomputed for the new total)"),
      Value("init_from",
            "start from this checkpoint's weights (a file, a ckpt_<step>/ folder or a checkpoint "
            "folder's newest; any layout) with a fresh optimizer at step 0"),
      Value("dp", "data-parallel replicas", false, "1"),
      Value("tp", "tensor-parallel ranks per model (heads, KV groups, MLP, vocabulary)", false,
            "1"),
      Value("pp", "pipeline stages (layers split evenly; 1F1B over --microbatches)", false, "1"),
      Value("ep", "expert-parallel ranks (MoE experts split; otherwise more replicas)", false,
            "1"),
      Value("virtual_stages",
            "with --pp: model chunks per pipeline rank (interleaved 1F1B: bubble (pp-1)/(V M) "
            "instead of (pp-1)/M, at V times the stage boundaries); --microbatches a multiple "
            "of --pp",
            false, "1"),
      Bool("sequence_parallel",
           "with --tp > 1: split the norms, residual stream and depth histories along the "
           "tokens (Megatron-LM's sequence parallelism)"),
      Value("vocab_multiple",
            "pad the vocabulary inside the model to a multiple of --tp x N (Megatron's "
            "make-vocab-size-divisible-by): equal TP slices whose width is a multiple of N; "
            "padded rows get no probability and are never saved",
            false, "1"),
      Value("comm_timeout", "seconds a rank waits for a peer before the run fails", false,
            "300"),
      Enum("zero", "ZeRO stage with --dp: 0 (replicated optimizer) or 1 (sharded)", {"0", "1"},
           "0"),
      Enum("launcher",
           "how the dp x tp x pp x ep ranks run: mpi (one process each, under mpirun), gloo "
           "(one process each, started any way, meeting in --rendezvous), slurm (one process "
           "per task under srun: rank, world size and local GPU from SLURM_PROCID, SLURM_NTASKS "
           "and SLURM_LOCALID, meeting in a folder of --rendezvous per job step) or threads "
           "(one process)",
           {"mpi", "gloo", "slurm", "threads"}, "mpi"),
      Value("rank", "with --launcher gloo or --device cuda: this process's rank (or "
                    "$SATDAR_RANK)"),
      Value("world_size", "with --launcher gloo or --device cuda: the number of processes (or "
                          "$SATDAR_WORLD_SIZE)"),
      Value("rendezvous",
            "with --launcher gloo or --device cuda --dp > 1: a folder every rank can reach "
            "(shared file system), fresh per launch (or $SATDAR_RENDEZVOUS_DIR)"),
      Value("gloo_iface", "with --launcher gloo: network interface (default: loopback)"),
      Value("coordinator",
            "with --launcher gloo: meet through this coordinator's store (HOST:PORT) instead of "
            "--rendezvous; with --job-id and --attempt (the worker sets them)"),
      Value("job_id",
            "the job this run belongs to: the metrics' job_id label (default local) and, with "
            "--coordinator, the job whose store the ranks meet in"),
      Value("attempt", "with --coordinator: the job's attempt (fences older ones)"),
      Value("token_file", "with --coordinator: the worker token (or $SATDAR_TOKEN_FILE)"),
      Value("tls_ca", "with --coordinator: PEM roots for TLS (or $SATDAR_TLS_CA)"),
      Value("lock_wait",
            "seconds to wait for --checkpoint-dir's lock when another run holds it", false, "0"),
      Bool("quiet", "no console output"),
      Value("metrics_listen",
            "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: a free one, printed "
            "at start); every rank serves its own"),
      Enum("progress",
           "console progress: bar (one updating line), line (a line per --log-every steps) or "
           "auto (bar on a terminal)",
           {"auto", "bar", "line"}, "auto"),
  };
}

absl::Status Bad(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

}  // namespace

std::string NameOf(const std::string& setting, Spelling spelling) {
  switch (spelling) {
    case Spelling::kFlags: {
      std::string flag = "--" + setting;
      std::replace(flag.begin(), flag.end(), '_', '-');
      return flag;
    }
    case Spelling::kSpec:
      if (setting == "dp" || setting == "tp" || setting == "pp" || setting == "ep" ||
          setting == "microbatches") {
        return "layout." + setting;
      }
      if (setting == "device") return "resources.device";
      if (setting == "threads") return "resources.threads_per_rank";
      return "train." + setting;
    case Spelling::kFields:
      return setting;
  }
  return setting;
}

const std::vector<SettingDef>& TrainSettingDefs() {
  static const auto* defs = new std::vector<SettingDef>(MakeTrainSettingDefs());
  return *defs;
}

const SettingDef* FindTrainSetting(const std::string& name) {
  for (const SettingDef& d : TrainSettingDefs()) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

bool IsTaskSetting(const std::string& name) {
  return name == "task" || absl::StartsWith(name, "mqar_");
}

std::string SettingValues::Subject(const std::string& name) const {
  return spelling_ == Spelling::kFlags ? "flag " + Name(name) : Name(name);
}

absl::Status SettingValues::CheckGiven() const {
  for (const auto& [name, value] : given_) {
    if (FindTrainSetting(name) == nullptr) return Bad(absl::StrCat("unknown setting ", Name(name)));
  }
  for (const SettingDef& d : TrainSettingDefs()) {
    auto it = given_.find(d.name);
    if (d.kind == SettingKind::kBool && it != given_.end() && it->second != "true" &&
        it->second != "false") {
      return Bad(absl::StrCat(Subject(d.name), " must be true or false, got '", it->second, "'"));
    }
    if (!d.choices.empty() && it != given_.end() &&
        std::find(d.choices.begin(), d.choices.end(), it->second) == d.choices.end()) {
      return Bad(absl::StrCat(Subject(d.name), " must be ", core::JoinChoices(d.choices), ", got '",
                              it->second, "'"));
    }
    if (d.required && it == given_.end()) {
      return Bad(absl::StrCat("missing required ", Subject(d.name), " (", d.help, ")"));
    }
  }
  return absl::OkStatus();
}

std::string SettingValues::Get(const std::string& name) const {
  auto it = given_.find(name);
  if (it != given_.end()) return it->second;
  const SettingDef* d = FindTrainSetting(name);
  return d == nullptr ? "" : d->default_value;
}

absl::StatusOr<int64_t> SettingValues::GetInt(const std::string& name, int64_t min_value,
                                              int64_t max_value) const {
  return core::ParseBoundedInt(Subject(name), Get(name), min_value, max_value);
}

absl::StatusOr<double> SettingValues::GetDouble(const std::string& name, double min_value,
                                                bool min_inclusive, double max_value) const {
  return core::ParseBoundedDouble(Subject(name), Get(name), min_value, min_inclusive, max_value);
}

absl::StatusOr<std::optional<data::MqarOptions>> TaskFromSettings(const SettingValues& values) {
  if (values.Get("task") == "lm") {
    for (const char* s : {"mqar_keys", "mqar_values", "mqar_pairs", "mqar_queries"}) {
      if (values.Has(s)) {
        return Bad(absl::StrCat(values.Subject(s), " needs ", values.Name("task"), " mqar"));
      }
    }
    return std::optional<data::MqarOptions>();
  }
  data::MqarOptions m;
  SATDAR_ASSIGN_OR_RETURN(int64_t keys, values.GetInt("mqar_keys", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t vals, values.GetInt("mqar_values", 1, kMaxBatch));
  SATDAR_ASSIGN_OR_RETURN(int64_t pairs, values.GetInt("mqar_pairs", 1, kMaxSeqLen));
  SATDAR_ASSIGN_OR_RETURN(int64_t queries, values.GetInt("mqar_queries", 1, kMaxSeqLen));
  m.keys = static_cast<int>(keys);
  m.values = static_cast<int>(vals);
  m.pairs = static_cast<int>(pairs);
  m.queries = static_cast<int>(queries);
  return std::optional<data::MqarOptions>(m);
}

model::LayoutNames LayoutNamesOf(Spelling spelling) {
  return {NameOf("tp", spelling), NameOf("pp", spelling), NameOf("ep", spelling),
          NameOf("vocab_multiple", spelling)};
}

absl::Status CheckGpuPathOptions(const TrainOptions& o, Spelling spelling) {
  auto n = [spelling](const std::string& s) { return NameOf(s, spelling); };
  const std::string cuda = n("device") + " cuda: ";
  if (o.f64) return Bad(absl::StrCat(cuda, n("dtype"), " must be bf16 or f32"));
  return absl::OkStatus();
}

absl::Status ValidateVirtualStages(const model::ModelConfig& c, const TrainOptions& o,
                                   Spelling spelling) {
  if (o.virtual_stages == 1) return absl::OkStatus();
  const std::string virtual_stages = NameOf("virtual_stages", spelling);
  const int stages = o.mesh.pp * o.virtual_stages;
  if (c.num_hidden_layers % stages != 0) {
    return Bad(absl::StrCat(NameOf("pp", spelling), " ", o.mesh.pp, " x ", virtual_stages, " ",
                            o.virtual_stages, " = ", stages,
                            " virtual stages do not divide config field \"num_hidden_layers\" (",
                            c.num_hidden_layers, ")"));
  }
  if (c.value_residual == model::ValueResidualKind::kResFormer &&
      c.resformer_mode == model::ResformerMode::kLearnablePlus) {
    return Bad(absl::StrCat(
        "config field \"resformer_mode\" \"learnable_plus\" shares its lambdas across every "
        "stage, which a rank's several chunks cannot hold yet; use ",
        virtual_stages, " 1"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSampleLayout(const model::ModelConfig& c, const TrainOptions& o,
                                  Spelling spelling) {
  if (o.sample_every == 0) return absl::OkStatus();
  auto n = [spelling](const std::string& s) { return NameOf(s, spelling); };
  // Which axis leaves rank 0 with a piece: TP slices, PP stages, EP's share of the experts
  // (without experts the EP ranks are whole replicas).
  std::string axis;
  if (o.mesh.tp > 1) {
    axis = absl::StrCat(n("tp"), " ", o.mesh.tp);
  } else if (o.mesh.pp > 1) {
    axis = absl::StrCat(n("pp"), " ", o.mesh.pp);
  } else if (o.mesh.ep > 1 && c.moe.has_value()) {
    axis = absl::StrCat(n("ep"), " ", o.mesh.ep, " (the config has experts)");
  }
  if (axis.empty()) return absl::OkStatus();
  return Bad(absl::StrCat(n("sample_every"), " decodes the whole model from rank 0's weights, "
                          "but with ", axis, " rank 0 holds only a piece of it; generate from "
                          "a checkpoint instead (satdar generate)"));
}

}  // namespace satdar::settings
