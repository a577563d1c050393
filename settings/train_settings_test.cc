// The training settings (train_settings.h) in each spelling: every bound and rule names the
// setting as its caller's user wrote it, and a valid set of values becomes TrainOptions.
#include "settings/train_settings.h"

#include <algorithm>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace satdar::settings {
namespace {

using Given = std::map<std::string, std::string>;

Given Minimal() {
  return {{"config", "c.json"}, {"steps", "10"}, {"batch_size", "8"}, {"seq_len", "16"},
          {"synthetic_data", "true"}};
}

// The error of parsing `given` in `spelling` (CheckGiven, then ParseTrainSettings).
std::string Error(Given given, Spelling spelling) {
  SettingValues values(std::move(given), spelling);
  absl::Status s = values.CheckGiven();
  TrainOptions o;
  if (s.ok()) s = ParseTrainSettings(values, &o);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

Given With(std::map<std::string, std::string> extra, Given base = Minimal()) {
  for (auto& [k, v] : extra) base[k] = v;
  return base;
}

TEST(TrainSettings, NamesOfEachSpelling) {
  EXPECT_EQ(NameOf("batch_size", Spelling::kFlags), "--batch-size");
  EXPECT_EQ(NameOf("batch_size", Spelling::kSpec), "train.batch_size");
  EXPECT_EQ(NameOf("batch_size", Spelling::kFields), "batch_size");
  EXPECT_EQ(NameOf("tp", Spelling::kSpec), "layout.tp");
  EXPECT_EQ(NameOf("microbatches", Spelling::kSpec), "layout.microbatches");
  EXPECT_EQ(NameOf("device", Spelling::kSpec), "resources.device");
  EXPECT_EQ(NameOf("threads", Spelling::kSpec), "resources.threads_per_rank");
  EXPECT_EQ(NameOf("virtual_stages", Spelling::kFlags), "--virtual-stages");
}

TEST(TrainSettings, EveryDefinitionIsWellFormed) {
  std::map<std::string, int> seen;
  for (const SettingDef& d : TrainSettingDefs()) {
    EXPECT_EQ(seen[d.name]++, 0) << d.name << " defined twice";
    EXPECT_EQ(d.name.find('-'), std::string::npos) << d.name;
    EXPECT_FALSE(d.help.empty()) << d.name;
    EXPECT_EQ(d.kind == SettingKind::kEnum, !d.choices.empty()) << d.name;
    if (d.kind == SettingKind::kEnum) {
      EXPECT_NE(std::find(d.choices.begin(), d.choices.end(), d.default_value), d.choices.end())
          << d.name << " defaults to a value outside its choices";
    }
    EXPECT_EQ(FindTrainSetting(d.name), &d);
  }
  EXPECT_GE(seen.size(), 60u);
  EXPECT_EQ(FindTrainSetting("no_such"), nullptr);
  EXPECT_TRUE(IsTaskSetting("task"));
  EXPECT_TRUE(IsTaskSetting("mqar_keys"));
  EXPECT_FALSE(IsTaskSetting("steps"));
}

TEST(TrainSettings, AValidSetBecomesOptions) {
  SettingValues values(With({{"lr", "3e-4"}, {"microbatches", "2"}, {"dp", "2"}, {"tp", "2"},
                             {"sequence_parallel", "true"}, {"zero", "1"},
                             {"recompute", "selective"}, {"warmup_steps", "3"}}),
                       Spelling::kSpec);
  ASSERT_TRUE(values.CheckGiven().ok());
  TrainOptions o;
  ASSERT_TRUE(ParseTrainSettings(values, &o).ok());
  EXPECT_EQ(o.steps, 10);
  EXPECT_EQ(o.batch_size, 8);
  EXPECT_EQ(o.seq_len, 16);
  EXPECT_EQ(o.microbatches, 2);
  EXPECT_DOUBLE_EQ(o.lr, 3e-4);
  EXPECT_DOUBLE_EQ(o.beta2, 0.95);  // the default
  EXPECT_EQ(o.warmup_steps, 3);
  EXPECT_TRUE(o.warmup_given);
  EXPECT_EQ(o.mesh.dp, 2);
  EXPECT_EQ(o.mesh.tp, 2);
  EXPECT_EQ(o.mesh.pp, 1);
  EXPECT_TRUE(o.sequence_parallel);
  EXPECT_EQ(o.zero_stage, 1);
  EXPECT_EQ(o.recompute, model::Recompute::kSelective);
  EXPECT_TRUE(o.synthetic_data);
  EXPECT_EQ(o.stats_every, 50);
  EXPECT_FALSE(o.mqar.has_value());
  // Without warmup_steps: a tenth of the steps.
  SettingValues plain(Minimal(), Spelling::kFlags);
  TrainOptions p;
  ASSERT_TRUE(ParseTrainSettings(plain, &p).ok());
  EXPECT_EQ(p.warmup_steps, 1);
  EXPECT_FALSE(p.warmup_given);
}

TEST(TrainSettings, BoundsNameTheSettingInEachSpelling) {
  EXPECT_EQ(Error(With({{"batch_size", "0"}}), Spelling::kFlags),
            "flag --batch-size must be >= 1, got 0");
  EXPECT_EQ(Error(With({{"batch_size", "0"}}), Spelling::kSpec),
            "train.batch_size must be >= 1, got 0");
  EXPECT_EQ(Error(With({{"batch_size", "0"}}), Spelling::kFields), "batch_size must be >= 1, got 0");
  EXPECT_EQ(Error(With({{"steps", "ten"}}), Spelling::kSpec),
            "train.steps must be an integer, got 'ten'");
  EXPECT_EQ(Error(With({{"steps", "99999999999999999999"}}), Spelling::kFlags),
            "flag --steps is out of range (1 to 1099511627776), got 99999999999999999999");
  EXPECT_EQ(Error(With({{"lr", "nan"}}), Spelling::kSpec), "train.lr must be a finite number, got 'nan'");
  EXPECT_EQ(Error(With({{"lr", "0"}}), Spelling::kFlags), "flag --lr must be > 0, got 0");
  EXPECT_EQ(Error(With({{"tp", "0"}}), Spelling::kSpec), "layout.tp must be >= 1, got 0");
  EXPECT_EQ(Error(With({{"threads", "2000"}}), Spelling::kSpec),
            "resources.threads_per_rank must be <= 1024, got 2000");
}

TEST(TrainSettings, ChoicesAndRequiredSettings) {
  EXPECT_EQ(Error(With({{"dtype", "f16"}}), Spelling::kFlags),
            "flag --dtype must be f32, f64 or bf16, got 'f16'");
  EXPECT_EQ(Error(With({{"zero", "2"}}), Spelling::kSpec), "train.zero must be 0 or 1, got '2'");
  Given missing = Minimal();
  missing.erase("batch_size");
  EXPECT_EQ(Error(missing, Spelling::kSpec),
            "missing required train.batch_size (sequences per optimizer step)");
  EXPECT_EQ(Error(With({{"bogus", "1"}}), Spelling::kSpec), "unknown setting train.bogus");
}

TEST(TrainSettings, RulesBetweenSettings) {
  EXPECT_EQ(Error(With({{"microbatches", "3"}}), Spelling::kFlags),
            "--batch-size 8 is not divisible by --microbatches 3");
  EXPECT_EQ(Error(With({{"microbatches", "3"}}), Spelling::kSpec),
            "train.batch_size 8 is not divisible by layout.microbatches 3");
  Given two_sources = With({{"data", "d"}});
  EXPECT_EQ(Error(two_sources, Spelling::kSpec),
            "give exactly one of train.data DIR or train.synthetic_data (or train.task mqar)");
  EXPECT_EQ(Error(With({{"eval_every", "5"}}), Spelling::kFlags),
            "--eval-every: validation needs a prepared dataset (--data DIR written by satdar "
            "prep), whose held-out split it reads; --synthetic-data has none");
  EXPECT_EQ(Error(With({{"dtype", "bf16"}}), Spelling::kSpec),
            "train.dtype must be f32 or f64, got 'bf16' (bf16 is for resources.device cuda)");
  EXPECT_EQ(Error(With({{"dtype", "f64"}, {"device", "cuda"}}), Spelling::kFlags),
            "flag --dtype must be bf16 or f32, got 'f64' (f64 is for --device cpu)");
  EXPECT_EQ(Error(With({{"gpu_comm", "host"}}), Spelling::kSpec),
            "train.gpu_comm is for resources.device cuda");
  EXPECT_EQ(Error(With({{"checkpoint_every", "5"}}), Spelling::kFlags),
            "--resume and --checkpoint-every need --checkpoint-dir");
  EXPECT_EQ(Error(With({{"mqar_keys", "8"}}), Spelling::kFlags),
            "flag --mqar-keys needs --task mqar");
  EXPECT_EQ(Error(With({{"virtual_stages", "2"}}), Spelling::kSpec),
            "train.virtual_stages needs layout.pp 2 or more (the chunks interleave over the "
            "pipeline ranks)");
  EXPECT_EQ(Error(With({{"virtual_stages", "2"}, {"pp", "2"}, {"microbatches", "1"}}),
                  Spelling::kFlags),
            "--virtual-stages 2 needs --microbatches a multiple of --pp 2 (the interleaved "
            "schedule moves them in groups of --pp), got 1");
  EXPECT_EQ(Error(With({{"sequence_parallel", "true"}}), Spelling::kSpec),
            "train.sequence_parallel needs layout.tp 2 or more (it splits the token rows over "
            "the tensor-parallel ranks)");
  EXPECT_EQ(Error(With({{"sequence_parallel", "true"}, {"tp", "3"}}), Spelling::kFlags),
            "--sequence-parallel: a micro-batch's 128 tokens (--batch-size / --microbatches x "
            "--seq-len) are not divisible by --tp 3");
  EXPECT_EQ(Error(With({{"dp", "512"}, {"tp", "256"}}), Spelling::kSpec),
            "layout.dp x layout.tp x layout.pp x layout.ep is more than 65536 ranks");
  EXPECT_EQ(Error(With({{"job_id", ""}}), Spelling::kFlags),
            "--job-id must be 1 to 256 printable ASCII characters");
  EXPECT_EQ(Error(With({{"job_id", std::string(257, 'j')}}), Spelling::kSpec),
            "train.job_id must be 1 to 256 printable ASCII characters");
  EXPECT_EQ(Error(With({{"job_id", "a\tb"}}), Spelling::kFields),
            "job_id must be 1 to 256 printable ASCII characters");
  const std::string listen = Error(With({{"metrics_listen", "nohost"}}), Spelling::kFlags);
  EXPECT_EQ(listen.rfind("--metrics-listen", 0), 0u) << listen;
  EXPECT_EQ(Error(With({{"resume", "yes"}}), Spelling::kSpec),
            "train.resume must be true or false, got 'yes'");
  EXPECT_EQ(Error(With({{"quiet", "1"}}), Spelling::kFlags),
            "flag --quiet must be true or false, got '1'");
}

TEST(TrainSettings, TheMqarTask) {
  SettingValues values(With({{"task", "mqar"}, {"mqar_keys", "16"}, {"synthetic_data", "false"}}),
                       Spelling::kSpec);
  absl::StatusOr<std::optional<data::MqarOptions>> task = TaskFromSettings(values);
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_TRUE(task->has_value());
  EXPECT_EQ((*task)->keys, 16);
  EXPECT_EQ((*task)->values, 64);
  EXPECT_EQ(Error(With({{"task", "mqar"}, {"synthetic_data", "false"}, {"eval_every", "2"}}),
                  Spelling::kSpec),
            "train.eval_every: validation needs a prepared dataset (train.data DIR written by "
            "satdar prep), whose held-out split it reads; train.task mqar has none");
}

TEST(TrainSettings, TheGpuPathAndVirtualStages) {
  TrainOptions o;
  // Pipeline stages run on the GPU, interleaved too.
  o.mesh.pp = 2;
  EXPECT_TRUE(CheckGpuPathOptions(o, Spelling::kSpec).ok());
  o.virtual_stages = 2;
  EXPECT_TRUE(CheckGpuPathOptions(o, Spelling::kSpec).ok());
  o.virtual_stages = 1;
  o.mesh.pp = 1;
  // Tensor, sequence and expert parallelism run on the GPU, also with ZeRO-1.
  o.mesh.tp = 2;
  o.mesh.ep = 2;
  o.sequence_parallel = true;
  o.zero_stage = 1;
  EXPECT_TRUE(CheckGpuPathOptions(o, Spelling::kFlags).ok());
  o.zero_stage = 0;
  o.mesh.tp = 1;
  o.mesh.ep = 1;
  o.sequence_parallel = false;
  // Statistics and a padded vocabulary run on the GPU (the device model's classes).
  o.stats_every = 5;
  o.vocab_multiple = 8;
  EXPECT_TRUE(CheckGpuPathOptions(o, Spelling::kFlags).ok());
  o.stats_every = 0;
  o.vocab_multiple = 1;
  EXPECT_TRUE(CheckGpuPathOptions(o, Spelling::kFlags).ok());
  o.f64 = true;
  EXPECT_EQ(CheckGpuPathOptions(o, Spelling::kSpec).message(),
            "resources.device cuda: train.dtype must be bf16 or f32");
  o.f64 = false;

  model::ModelConfig c;
  c.num_hidden_layers = 6;
  o.mesh.pp = 2;
  o.virtual_stages = 2;
  EXPECT_EQ(ValidateVirtualStages(c, o, Spelling::kSpec).message(),
            "layout.pp 2 x train.virtual_stages 2 = 4 virtual stages do not divide config "
            "field \"num_hidden_layers\" (6)");
  c.num_hidden_layers = 8;
  EXPECT_TRUE(ValidateVirtualStages(c, o, Spelling::kFlags).ok());
  c.value_residual = model::ValueResidualKind::kResFormer;
  c.resformer_mode = model::ResformerMode::kLearnablePlus;
  EXPECT_EQ(ValidateVirtualStages(c, o, Spelling::kSpec).message(),
            "config field \"resformer_mode\" \"learnable_plus\" shares its lambdas across every "
            "stage, which a rank's several chunks cannot hold yet; use train.virtual_stages 1");
  const model::LayoutNames names = LayoutNamesOf(Spelling::kSpec);
  EXPECT_EQ(names.tp, "layout.tp");
  EXPECT_EQ(names.vocab_multiple, "train.vocab_multiple");
}

// Samples during training: a cadence with a text prompt, which needs a folder of data (its
// tokenizer), and rank 0 holding the whole model.
TEST(TrainSettings, Samples) {
  const Given text = {{"config", "c.json"}, {"steps", "10"}, {"batch_size", "8"},
                      {"seq_len", "16"},    {"data", "d"}};
  SettingValues values(With({{"sample_every", "5"}, {"sample_prompt", "The jury"}}, text),
                       Spelling::kFlags);
  TrainOptions o;
  ASSERT_TRUE(ParseTrainSettings(values, &o).ok());
  EXPECT_EQ(o.sample_every, 5);
  EXPECT_EQ(o.sample_prompt, "The jury");
  EXPECT_EQ(o.sample_tokens, 32);
  SettingValues off(text, Spelling::kFlags);
  TrainOptions p;
  ASSERT_TRUE(ParseTrainSettings(off, &p).ok());
  EXPECT_EQ(p.sample_every, 0);
  EXPECT_EQ(Error(With({{"sample_every", "5"}}, text), Spelling::kFlags),
            "--sample-every needs --sample-prompt TEXT (the text the samples continue)");
  EXPECT_EQ(Error(With({{"sample_prompt", "x"}}, text), Spelling::kFlags),
            "flag --sample-prompt needs --sample-every N");
  EXPECT_EQ(Error(With({{"sample_every", "5"}, {"sample_tokens", "0"}}, text), Spelling::kFlags),
            "flag --sample-tokens must be >= 1, got 0");
  EXPECT_EQ(Error(With({{"sample_every", "5"}, {"sample_prompt", "x"}}), Spelling::kFlags),
            "--sample-prompt is text, which only the tokenizer of --data DIR (a dataset from "
            "satdar prep, or a folder of text read as bytes) can encode; --synthetic-data has "
            "no tokenizer");
  model::ModelConfig config;
  o.mesh.tp = 2;
  absl::Status s = ValidateSampleLayout(config, o, Spelling::kFlags);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--sample-every decodes the whole model from rank 0's weights, but with "
                         "--tp 2 rank 0 holds only a piece of it; generate from a checkpoint "
                         "instead (satdar generate)");
  o.mesh.tp = 1;
  o.mesh.ep = 2;  // without experts the EP ranks are replicas
  EXPECT_TRUE(ValidateSampleLayout(config, o, Spelling::kFlags).ok());
  o.mesh.dp = 2;
  EXPECT_TRUE(ValidateSampleLayout(config, o, Spelling::kFlags).ok());
}

}  // namespace
}  // namespace satdar::settings
