// coordinator/job_spec.h: the job spec of INTERFACES.md ("Control plane (v2)") in its two
// forms: the JSON a user writes, which `satdar submit` converts, and satdar.v1.JobSpec, which
// the coordinator validates before storing anything.
//
//   SATDAR_ASSIGN_OR_RETURN(satdar::v1::JobSpec spec, JobSpecFromJson(text, "job.json", "."));
//   SATDAR_ASSIGN_OR_RETURN(ValidJob job, ValidateJobSpec(spec));
//
// Every error is InvalidArgument naming the field ("job spec: train.batch_size: ...").
#ifndef SATDAR_COORDINATOR_JOB_SPEC_H_
#define SATDAR_COORDINATOR_JOB_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/satdar/v1/control.pb.h"

namespace satdar::coordinator {

// Bounds of what a job may ask for (documented in control.proto).
inline constexpr size_t kMaxSpecBytes = 1 << 20;
inline constexpr size_t kMaxNameBytes = 128;
inline constexpr int kMaxRestarts = 100;

// `config` as a relative path is read from the first of base_dirs where it exists (the
// client passes the current folder, then the spec file's folder).
absl::StatusOr<satdar::v1::JobSpec> JobSpecFromJson(const std::string& json_text,
                                                    const std::string& source,
                                                    const std::vector<std::string>& base_dirs);

// What the coordinator runs for a valid spec.
struct ValidJob {
  int world_size = 1;
  int tp = 1;
  int64_t steps = 0;
  std::string device = "cpu";
  int threads = 1;
  std::string config_json;              // canonical
  std::vector<std::string> train_args;  // `satdar train` flags, paths excluded
  std::string data_path;                // relative to a worker's --data-root, or ""
};

// The spec's strings are printable text (no NUL or other control character), its config
// parses, its layout splits the config (divisibility, world size), its train flags are ones a
// job may set (an allow-list of `satdar train`'s model, optimizer, schedule, data, evaluation,
// statistics and layout flags) within the bounds and rules between settings that `satdar
// train` has too (settings/train_settings.h: eval_every needs a dataset, bf16 is for cuda, ...),
// and its data path stays inside the data root.
absl::StatusOr<ValidJob> ValidateJobSpec(const satdar::v1::JobSpec& spec);

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_JOB_SPEC_H_
