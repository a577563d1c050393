// settings/train_settings.h: what a training run can be asked to do, written once. Every
// setting of `satdar train` (name, kind, default, help: TrainSettingDefs), their bounds and the
// rules between them (ParseTrainSettings), from the values a user gave. The command line
// (cli/train_flags.h: `--batch-size 8`) and the coordinator's job specs
// (coordinator/job_spec.h: "train": {"batch_size": 8}) are two spellings of these settings, and
// messages name a setting the way its caller's user wrote it (Spelling). Kernel-free: the
// coordinator links it.
//
//   SettingValues values({{"steps", "10"}, {"batch_size", "8"}, ...}, Spelling::kSpec);
//   SATDAR_RETURN_IF_ERROR(values.CheckGiven());   // names, choices, required settings
//   TrainOptions o;
//   SATDAR_RETURN_IF_ERROR(ParseTrainSettings(values, &o));
#ifndef SATDAR_SETTINGS_TRAIN_SETTINGS_H_
#define SATDAR_SETTINGS_TRAIN_SETTINGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/mqar.h"
#include "model/config.h"
#include "model/layout_check.h"
#include "settings/train_options.h"

namespace satdar::settings {

// Upper bounds of counts a user gives (far above any real run; the memory estimate refuses
// what does not fit long before).
inline constexpr int64_t kMaxThreads = 1024;
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 22;  // model::kMaxPositions
inline constexpr int64_t kMaxRanks = int64_t{1} << 16;   // per mesh axis and world size
inline constexpr int64_t kMaxSeed = INT64_MAX;
inline constexpr int64_t kMaxCount = int64_t{1} << 40;   // cadences, batches, shard sizes

// How a message names a setting ("batch_size" here).
enum class Spelling {
  kFlags,   // `satdar train`'s flags: "--batch-size"; "flag --batch-size must be ..."
  kSpec,    // a job spec's fields: "train.batch_size", "layout.tp", "resources.device"
  kFields,  // the settings' own names: "batch_size", "tp", "device"
};
std::string NameOf(const std::string& setting, Spelling spelling);

enum class SettingKind { kValue, kBool, kEnum };

struct SettingDef {
  std::string name;  // "batch_size"
  SettingKind kind = SettingKind::kValue;
  std::string help;
  bool required = false;
  std::string default_value;         // "" for none (a kBool is false unless given)
  std::vector<std::string> choices;  // kEnum
};

// Every setting of `satdar train`, in --help order.
const std::vector<SettingDef>& TrainSettingDefs();
// The definition of `name`, or null.
const SettingDef* FindTrainSetting(const std::string& name);
// The task settings (--task and the MQAR sizes), which `satdar eval` takes too.
bool IsTaskSetting(const std::string& name);

// The values a user gave (setting name -> text; a kBool's "true" or "false"), read with the
// settings' defaults and bounds. Messages spell names as `spelling` says and carry no prefix:
// the caller adds its own ("satdar train: ", "job spec: ").
class SettingValues {
 public:
  SettingValues(std::map<std::string, std::string> given, Spelling spelling)
      : given_(std::move(given)), spelling_(spelling) {}

  // InvalidArgument for a name that is no setting, a bool that is not true or false, an enum's
  // value outside its choices or a required setting not given (in TrainSettingDefs order).
  absl::Status CheckGiven() const;

  bool Has(const std::string& name) const { return given_.count(name) > 0; }
  // The value given, else the default.
  std::string Get(const std::string& name) const;
  bool GetBool(const std::string& name) const { return Get(name) == "true"; }
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t min_value,
                                 int64_t max_value) const;
  // A finite number >= min_value (> with min_inclusive false) and <= max_value.
  absl::StatusOr<double> GetDouble(const std::string& name, double min_value,
                                   bool min_inclusive = true, double max_value = 1e300) const;

  Spelling spelling() const { return spelling_; }
  // NameOf(name, spelling()).
  std::string Name(const std::string& name) const { return NameOf(name, spelling_); }
  // What "must be ..." follows: "flag --batch-size", "train.batch_size" or "batch_size".
  std::string Subject(const std::string& name) const;

 private:
  std::map<std::string, std::string> given_;
  Spelling spelling_;
};

// TrainOptions (all but the config, the communicators and the GPU's runtime choices) from the
// values: bounds, and the rules between settings (the batch divisible by the micro-batches,
// one data source, validation only on a prepared dataset, the dtypes of each device, the
// layout's sizes, virtual stages, sequence parallelism). InvalidArgument naming settings as
// values.spelling() says.
absl::Status ParseTrainSettings(const SettingValues& values, TrainOptions* o);

// --task and the MQAR sizes: nullopt for language modelling.
absl::StatusOr<std::optional<data::MqarOptions>> TaskFromSettings(const SettingValues& values);

// What the GPU path (device cuda) cannot run, from the options alone: f64 (the kernels are
// bf16 and f32). Every layout runs there.
absl::Status CheckGpuPathOptions(const TrainOptions& o, Spelling spelling);

// virtual_stages against the config: pp x V dividing the layers, and a design whose
// parameters are not shared across stages (ResFormer learnable_plus's are).
absl::Status ValidateVirtualStages(const model::ModelConfig& config, const TrainOptions& o,
                                   Spelling spelling);

// sample_every against the layout: samples decode the whole model from rank 0's weights, so
// not with tp or pp > 1, nor ep > 1 on a config with experts. InvalidArgument naming settings.
absl::Status ValidateSampleLayout(const model::ModelConfig& config, const TrainOptions& o,
                                  Spelling spelling);

// The layout's sizes as `spelling` names them (model/layout_check.h's ValidateSharding).
model::LayoutNames LayoutNamesOf(Spelling spelling);

}  // namespace satdar::settings

#endif  // SATDAR_SETTINGS_TRAIN_SETTINGS_H_
