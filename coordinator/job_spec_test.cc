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
      {"{" + cfg + ", " + train + R"(, "layout": {"tp": 4}})", "layout: --tp 4 does not divide"},
      {"{" + cfg + ", " + train + R"(, "resources": {"device": "tpu"}})", "resources.device"},
      {"{" + cfg + ", " + train + R"(, "max_restarts": -1})", "max_restarts: must be an integer in [0, 100]"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "rank": 1}})",
       "train.rank: is set by the control plane"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "metrics_listen": "0.0.0.0:9"}})",
       "train.metrics_listen: is set by the control plane"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": true, "progress": "bar"}})",
       "train.progress: is set by the control plane"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "synthetic_data": "yes"}})",
       "train.synthetic_data: must be true or false"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 80, "synthetic_data": true}})",
       "train.seq_len: 80 exceeds the config's max_position_embeddings 64"},
      {"{" + cfg + R"(, "train": {"steps": 2, "batch_size": 2, "seq_len": 8, "data": "/etc"}})",
       "train.data: \"/etc\" must be a path inside each worker's --data-root"},
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

}  // namespace
}  // namespace satdar::coordinator
