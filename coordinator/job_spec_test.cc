#include "coordinator/job_spec.h"

#include <string>

#include "core/file_util.h"
#include "gtest/gtest.h"

namespace satdar::coordinator {
namespace {

TEST(JobSpec, TheDemoJobIsValid) {
  auto text = core::ReadFileToString("configs/jobs/demo.json", kMaxSpecBytes);
  ASSERT_TRUE(text.ok()) << text.status();
  auto spec = JobSpecFromJson(*text, "configs/jobs/demo.json", {"."});
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto job = ValidateJobSpec(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->world_size, 2);
  EXPECT_EQ(job->steps, 200);
  EXPECT_EQ(job->data_path, "brown-bpe4096");
}

struct Bad {
  std::string json;
  std::string message;
};

TEST(JobSpec, EveryBadSpecNamesItsField) {
  const std::string cfg = R"("config": {"vocab_size": 64, "hidden_size": 16,
      "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
      "max_position_embeddings": 64})";
  const std::string train = R"("train": {"steps": 2, "batch_size": 2, "seq_len": 8,
      "synthetic_data": true})";
  const Bad cases[] = {
      {"{" + cfg + ", " + train + R"(, "retries": 1})", "unknown field \"retries\""},
      {"{" + cfg + ", " + train + R"(, "layout": {"dp": 0}})", "layout.dp: must be an integer in [1, 65536]"},
      {"{" + cfg + ", " + train + R"(, "layout": {"tp": 4}})", "layout: layout.tp 4 does not divide"},
      {"{" + cfg + ", " + train + R"(, "resources": {"device": "tpu"}})", "resources.device"},
      {"{" + cfg + ", " + train + R"(, "max_restarts": -1})", "max_restarts: must be an integer in [0, 100]"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "rank": 1}})",
       "train.rank: is not allowed in a job spec (the worker sets it"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "metrics_listen": "0.0.0.0:9"}})",
       "train.metrics_listen: is not allowed in a job spec (the worker sets it"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "progress": "bar"}})",
       "train.progress: is not allowed in a job spec (the worker sets it"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": "yes"}})",
       "train.synthetic_data: must be true or false"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 80, "synthetic_data": true}})",
       "train.seq_len: 80 exceeds the config's max_position_embeddings 64"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "data": "/etc"}})",
       "train.data: \"/etc\" must be a path inside each worker's data root"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "data": "a/../../b"}})",
       "must be a path inside"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "lr": "inf"}})",
       "train.lr must be a finite number"},
      {"{" + cfg + R"(, "train": {"steps": 2, "seq_len": 8, "synthetic_data": true}})",
       "missing required train.batch_size"},
      {R"({"config": {"vocab_size": 64}, )" + train + "}", "field \"hidden_size\" is required"},
  };
  for (const Bad& b : cases) {
    auto spec = JobSpecFromJson(b.json, "job.json", {"."});
    absl::Status s = spec.ok() ? ValidateJobSpec(*spec).status() : spec.status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.json;
    EXPECT_NE(s.message().find(b.message), std::string::npos) << s << "\n  wanted: " << b.message;
  }
}

// The exact error of a spec (JSON) that must be refused; "" when it is valid.
std::string ErrorOf(const std::string& json) {
  auto spec = JobSpecFromJson(json, "job.json", {"."});
  absl::Status s = spec.ok() ? ValidateJobSpec(*spec).status() : spec.status();
  EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

const char kCfg[] = R"("config": {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 64})";

std::string Spec(const std::string& train, const std::string& rest = "") {
  return std::string("{") + kCfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, )" +
         train + "}" + rest + "}";
}

// Every string of a spec is printable text: "..\u0000" would otherwise pass the data-root check
// as ".." once a C string ends at the NUL.
TEST(JobSpec, ControlCharactersAreRefusedInEveryString) {
  EXPECT_EQ(ErrorOf(Spec(R"("data": "..\u0000")")),
            "job spec: train.data: holds the control character 0x00 at byte 2; a job spec's "
            "strings are printable text");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true)", R"(, "name": "\u001b[2Jgone")")),
            "job spec: name: holds the control character 0x1B at byte 0; a job spec's strings "
            "are printable text");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "data_format": "text\u0085")")),
            "job spec: train.data_format: holds the control character U+0085 at byte 4; a job "
            "spec's strings are printable text");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "lr\n": 1)")),
            "job spec: train: holds the control character 0x0A at byte 2; a job spec's strings "
            "are printable text");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true)", R"(, "resources": {"device": "cpu\u007f"})")),
            "job spec: resources.device: holds the control character 0x7F at byte 3; a job "
            "spec's strings are printable text");
  // Names in other scripts are text.
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true)", R"(, "name": "na\u00efve \u65e5\u672c")")), "");
}

// The train flags a job may set are an allow-list: a worker's paths, addresses and
// credentials (tls_ca would make every rank read any file of the worker host) are refused.
TEST(JobSpec, OnlyAllowedTrainFlags) {
  const std::string allowed =
      "batch_size, beta1, beta2, checkpoint_every, comm_timeout, data, data_format, dtype, eps, "
      "eval_batches, eval_every, gpu_comm, grad_clip, keep_checkpoints, log_every, lr, "
      "min_lr_ratio, mqar_keys, mqar_pairs, mqar_queries, mqar_values, peak_tflops, recompute, "
      "seed, seq_len, sequence_parallel, stats_every, steps, synthetic_data, task, "
      "virtual_stages, vocab_multiple, warmup_steps, weight_decay, zero";
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "tls_ca": "/etc/shadow")")),
            "job spec: train.tls_ca: is not allowed in a job spec (the worker sets it, or it is "
            "not a job's to set; a job may set " + allowed + ")");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "init_from": "/etc")")),
            "job spec: train.init_from: is not allowed in a job spec (its path would not be "
            "confined to the worker's data root; a job may set " + allowed + ")");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "dp": 2)")),
            "job spec: train.dp: is not allowed in a job spec (set it in \"layout\"; a job may "
            "set " + allowed + ")");
  for (const char* refused : {"token_file", "coordinator", "job_id", "attempt", "gloo_iface",
                              "lock_wait", "config", "resume", "checkpoint_dir", "log_jsonl",
                              "summary_json", "quiet", "launcher", "rendezvous", "world_size"}) {
    const std::string value = std::string(refused) == "resume" || std::string(refused) == "quiet"
                                  ? "true"
                                  : "\"x\"";
    const std::string message =
        ErrorOf(Spec(std::string(R"("synthetic_data": true, ")") + refused + "\": " + value));
    EXPECT_EQ(message.rfind(std::string("job spec: train.") + refused +
                                ": is not allowed in a job spec (", 0),
              0u)
        << message;
  }
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "lr": 0.01, "seed": 3, "stats_every": 0,
                           "checkpoint_every": 1, "keep_checkpoints": 2, "recompute": "full")")),
            "");
}

// The rules between flags that `satdar train` enforces are the submit's too, by the same code.
TEST(JobSpec, TrainsRulesBetweenFlagsHoldAtSubmit) {
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "eval_every": 1)")),
            "job spec: train.eval_every: validation needs a prepared dataset (train.data DIR "
            "written by satdar prep), whose held-out split it reads; train.synthetic_data has none");
  EXPECT_EQ(ErrorOf(Spec(R"("task": "mqar", "eval_every": 5)")),
            "job spec: train.eval_every: validation needs a prepared dataset (train.data DIR "
            "written by satdar prep), whose held-out split it reads; train.task mqar has none");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "dtype": "bf16")")),
            "job spec: train.dtype must be f32 or f64, got 'bf16' (bf16 is for resources.device "
            "cuda)");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "gpu_comm": "host")")),
            "job spec: train.gpu_comm is for resources.device cuda");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "dtype": "f64")", R"(, "resources": {"device": "cuda"})")),
            "job spec: train.dtype must be bf16 or f32, got 'f64' (f64 is for resources.device "
            "cpu)");
  // What the GPU path runs, for a cuda job (every layout).
  const std::string cuda = R"(, "resources": {"device": "cuda"})";
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true)", cuda)), "");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "stats_every": 5)", cuda)), "");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true, "vocab_multiple": 2)", cuda)), "");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true)", R"(, "layout": {"tp": 2}, "resources": {"device": "cuda"})")),
            "");
  EXPECT_EQ(ErrorOf(Spec(R"("synthetic_data": true)", R"(, "layout": {"pp": 2}, "resources": {"device": "cuda"})")),
            "");
  // A design the GPU's kernels cannot take is refused at submit (model/layout_check.h).
  EXPECT_EQ(ErrorOf(R"({"config": {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 64,
    "residual": "hc", "hc_streams": 9}, "train": {"steps": 2, "batch_size": 2, "seq_len": 8,
    "synthetic_data": true}, "resources": {"device": "cuda"}})"),
            "job spec: device cuda: hc_streams 9 exceeds the GPU kernels' limit of 8");
  EXPECT_EQ(ErrorOf(Spec(R"("task": "mqar", "mqar_keys": 40, "mqar_values": 40)")),
            "job spec: MQAR needs 81 token ids (pad + train.mqar_keys + train.mqar_values) but the "
            "config's vocab_size is 64");
  EXPECT_EQ(ErrorOf(Spec(R"("task": "mqar", "mqar_keys": 4, "mqar_values": 4, "mqar_pairs": 2,
                           "mqar_queries": 4)")),
            "job spec: train.seq_len 8 is too short for 2 pairs and 4 queries (needs 11)");
}

}  // namespace
}  // namespace satdar::coordinator
