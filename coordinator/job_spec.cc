#include "coordinator/job_spec.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "model/config.h"
#include "model/layout_check.h"
#include "settings/train_settings.h"

namespace satdar::coordinator {

namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("job spec: ", field, ": ", what));
}

absl::Status OnlyKnown(const Json& object, const std::string& where,
                       const std::set<std::string>& known) {
  for (const auto& [key, unused] : object.items()) {
    if (!known.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: unknown field \"", where, key, "\" (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PositiveInt(const Json& object, const char* key, const std::string& where,
                                int max_value) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return 1;
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > max_value) {
    return Bad(where + key, absl::StrCat("must be an integer in [1, ", max_value, "]"));
  }
  return static_cast<int>(it->get<int64_t>());
}

// The `satdar train` flags a job may set: what the model learns and how (optimizer, schedule,
// data, evaluation, statistics, checkpoint cadence, layout-related options). An allow-list:
// every other flag (paths, addresses, credentials, how ranks meet) belongs to the worker, and
// a flag added to `satdar train` later is refused here until someone decides it is a job's.
// --init-from is not here: its path would not be confined to the worker's --data-root the
// way "data" is.
const std::set<std::string>& JobTrainFlags() {
  static const auto* s = new std::set<std::string>{
      "steps", "batch_size", "seq_len", "data", "data_format", "synthetic_data", "seed", "dtype",
      "recompute", "gpu_comm", "peak_tflops", "lr", "min_lr_ratio", "warmup_steps",
      "weight_decay", "beta1", "beta2", "eps", "grad_clip", "log_every", "eval_every",
      "eval_batches", "task", "mqar_keys", "mqar_values", "mqar_pairs", "mqar_queries",
      "stats_every", "checkpoint_every", "keep_checkpoints", "virtual_stages",
      "sequence_parallel", "vocab_multiple", "comm_timeout", "zero"};
  // A renamed setting must be renamed here too, or jobs could silently no longer set it.
  static const bool checked = [] {
    for (const std::string& name : *s) {
      SATDAR_CHECK(settings::FindTrainSetting(name) != nullptr)
          << "job spec allow-list names " << name << ", which is no training setting";
    }
    return true;
  }();
  (void)checked;
  return *s;
}

// Where a spec says what some refused flags would say.
const std::map<std::string, std::string>& SetElsewhere() {
  static const auto* m = new std::map<std::string, std::string>{
      {"dp", "set it in \"layout\""},
      {"tp", "set it in \"layout\""},
      {"pp", "set it in \"layout\""},
      {"ep", "set it in \"layout\""},
      {"microbatches", "set it in \"layout\""},
      {"threads", "set it in \"resources\" as threads_per_rank"},
      {"device", "set it in \"resources\""},
      {"config", "it is the spec's \"config\""},
      {"checkpoint_dir", "checkpoints live in <shared-dir>/jobs/<job_id>/"},
      {"log_jsonl", "the log lives in <shared-dir>/jobs/<job_id>/"},
      {"summary_json", "the summary lives in <shared-dir>/jobs/<job_id>/"},
      {"resume", "every attempt resumes from the newest checkpoint"},
      {"init_from", "its path would not be confined to the worker's data root"},
  };
  return *m;
}

// A string of a spec is printable text: no NUL (a C string would end there, so "..\0" would
// pass the data-root check as ".."), no other C0 or C1 control character, no DEL.
absl::Status CheckText(const std::string& field, const std::string& value) {
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    const bool c1 = c == 0xC2 && i + 1 < value.size() &&
                    static_cast<unsigned char>(value[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(value[i + 1]) <= 0x9F;
    if (c < 0x20 || c == 0x7F || c1) {
      return Bad(field, absl::StrFormat("holds the control character %s at byte %d; a job "
                                        "spec's strings are printable text",
                                        c1 ? absl::StrFormat("U+%04X", value[i + 1] & 0xFF)
                                           : absl::StrFormat("0x%02X", c),
                                        i));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<satdar::v1::JobSpec> JobSpecFromJson(const std::string& json_text,
                                                    const std::string& source,
                                                    const std::vector<std::string>& base_dirs) {
  if (json_text.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": a job spec is at most ",
                                                   kMaxSpecBytes, " bytes"));
  }
  SATDAR_ASSIGN_OR_RETURN(Json j, core::ParseJson(json_text, source));
  if (!j.is_object()) return absl::InvalidArgumentError(source + ": a job spec is a JSON object");
  SATDAR_RETURN_IF_ERROR(
      OnlyKnown(j, "", {"name", "config", "train", "layout", "resources", "max_restarts"}));
  satdar::v1::JobSpec spec;
  if (j.contains("name")) {
    if (!j["name"].is_string()) return Bad("name", "must be a string");
    spec.set_name(j["name"].get<std::string>());
  }
  if (!j.contains("config")) return Bad("config", "is required (a path or a model config object)");
  if (j["config"].is_string()) {
    std::string path = j["config"].get<std::string>();
    if (!path.empty() && path[0] != '/') {
      for (const std::string& dir : base_dirs) {
        if (core::PathKind(dir + "/" + path) != "missing") {
          path = dir + "/" + path;
          break;
        }
      }
    }
    auto text = core::ReadFileToString(path, core::kMaxSmallFileBytes);
    if (!text.ok()) return Bad("config", std::string(text.status().message()));
    spec.set_config_json(*text);
  } else if (j["config"].is_object()) {
    spec.set_config_json(j["config"].dump());
  } else {
    return Bad("config", "must be a path or a model config object");
  }
  if (j.contains("train")) {
    if (!j["train"].is_object()) return Bad("train", "must be an object of satdar train flags");
    for (const auto& [key, value] : j["train"].items()) {
      satdar::v1::TrainFlag* f = spec.add_train();
      f->set_name(key);
      if (value.is_string()) {
        f->set_value(value.get<std::string>());
      } else if (value.is_boolean() || value.is_number()) {
        f->set_value(value.dump());
      } else {
        return Bad("train." + key, "must be a string, number or boolean");
      }
    }
  }
  if (j.contains("layout")) {
    const Json& l = j["layout"];
    if (!l.is_object()) return Bad("layout", "must be an object");
    SATDAR_RETURN_IF_ERROR(OnlyKnown(l, "layout.", {"dp", "tp", "pp", "ep", "microbatches"}));
    satdar::v1::Layout* out = spec.mutable_layout();
    SATDAR_ASSIGN_OR_RETURN(int dp, PositiveInt(l, "dp", "layout.", 65536));
    SATDAR_ASSIGN_OR_RETURN(int tp, PositiveInt(l, "tp", "layout.", 65536));
    SATDAR_ASSIGN_OR_RETURN(int pp, PositiveInt(l, "pp", "layout.", 65536));
    SATDAR_ASSIGN_OR_RETURN(int ep, PositiveInt(l, "ep", "layout.", 65536));
    SATDAR_ASSIGN_OR_RETURN(int mb, PositiveInt(l, "microbatches", "layout.", 1 << 24));
    out->set_dp(dp);
    out->set_tp(tp);
    out->set_pp(pp);
    out->set_ep(ep);
    out->set_microbatches(mb);
  }
  if (j.contains("resources")) {
    const Json& r = j["resources"];
    if (!r.is_object()) return Bad("resources", "must be an object");
    SATDAR_RETURN_IF_ERROR(OnlyKnown(r, "resources.", {"device", "threads_per_rank"}));
    if (r.contains("device")) {
      if (!r["device"].is_string()) return Bad("resources.device", "must be \"cpu\" or \"cuda\"");
      spec.mutable_resources()->set_device(r["device"].get<std::string>());
    }
    SATDAR_ASSIGN_OR_RETURN(int threads, PositiveInt(r, "threads_per_rank", "resources.",
                                                     static_cast<int>(settings::kMaxThreads)));
    spec.mutable_resources()->set_threads_per_rank(threads);
  }
  if (j.contains("max_restarts")) {
    const Json& m = j["max_restarts"];
    if (!m.is_number_integer() || m.get<int64_t>() < 0 || m.get<int64_t>() > kMaxRestarts) {
      return Bad("max_restarts", absl::StrCat("must be an integer in [0, ", kMaxRestarts, "]"));
    }
    spec.set_max_restarts(static_cast<int>(m.get<int64_t>()));
  }
  return spec;
}

absl::StatusOr<ValidJob> ValidateJobSpec(const satdar::v1::JobSpec& spec) {
  ValidJob job;
  if (spec.ByteSizeLong() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: larger than ", kMaxSpecBytes, " bytes"));
  }
  if (spec.name().size() > kMaxNameBytes) {
    return Bad("name", absl::StrCat("at most ", kMaxNameBytes, " bytes"));
  }
  SATDAR_RETURN_IF_ERROR(CheckText("name", spec.name()));
  SATDAR_RETURN_IF_ERROR(CheckText("resources.device", spec.resources().device()));
  for (const satdar::v1::TrainFlag& f : spec.train()) {
    SATDAR_RETURN_IF_ERROR(CheckText("train", f.name()));
    SATDAR_RETURN_IF_ERROR(CheckText("train." + f.name(), f.value()));
  }
  auto config = model::ParseModelConfig(spec.config_json(), "job spec: config");
  if (!config.ok()) return config.status();
  job.config_json = model::ModelConfigToJson(*config);
  auto one = [](int v) { return v == 0 ? 1 : v; };
  const satdar::v1::Layout& l = spec.layout();
  const int dp = one(l.dp()), tp = one(l.tp()), pp = one(l.pp()), ep = one(l.ep());
  const int micro = one(l.microbatches());
  for (int v : {l.dp(), l.tp(), l.pp(), l.ep(), l.microbatches()}) {
    if (v < 0) return Bad("layout", "every entry must be >= 1");
  }
  const int64_t world = static_cast<int64_t>(dp) * tp * pp * ep;
  if (world > settings::kMaxRanks) {
    return Bad("layout", absl::StrCat("dp x tp x pp x ep = ", world, " ranks, more than ",
                                      settings::kMaxRanks));
  }
  absl::Status split = model::ValidateSharding(*config, tp, pp, ep,
                                               settings::LayoutNamesOf(settings::Spelling::kSpec));
  if (!split.ok()) return Bad("layout", std::string(split.message()));
  job.world_size = static_cast<int>(world);
  job.tp = tp;
  job.device = spec.resources().device().empty() ? "cpu" : spec.resources().device();
  if (job.device != "cpu" && job.device != "cuda") {
    return Bad("resources.device", absl::StrCat("must be \"cpu\" or \"cuda\", got \"", job.device, "\""));
  }
  job.threads = one(spec.resources().threads_per_rank());
  if (job.threads < 1 || job.threads > settings::kMaxThreads) {
    return Bad("resources.threads_per_rank", absl::StrCat("must be in [1, ", settings::kMaxThreads, "]"));
  }
  if (spec.max_restarts() < 0 || spec.max_restarts() > kMaxRestarts) {
    return Bad("max_restarts", absl::StrCat("must be in [0, ", kMaxRestarts, "]"));
  }
  // The train settings (settings/train_settings.h: the bounds and rules `satdar train` has),
  // with the layout, the resources and what the worker adds.
  std::map<std::string, std::string> given;
  for (const satdar::v1::TrainFlag& f : spec.train()) {
    const std::string& name = f.name();
    const settings::SettingDef* def = settings::FindTrainSetting(name);
    if (def == nullptr) return Bad("train." + name, "is not a satdar train flag (names use '_' for '-')");
    if (!JobTrainFlags().count(name)) {
      auto elsewhere = SetElsewhere().find(name);
      return Bad("train." + name,
                 absl::StrCat("is not allowed in a job spec (",
                              elsewhere != SetElsewhere().end()
                                  ? elsewhere->second
                                  : "the worker sets it, or it is not a job's to set",
                              "; a job may set ", absl::StrJoin(JobTrainFlags(), ", "), ")"));
    }
    if (given.count(name)) return Bad("train." + name, "is given twice");
    if (f.value().size() > 4096) return Bad("train." + name, "value longer than 4096 bytes");
    const std::string flag = settings::NameOf(name, settings::Spelling::kFlags);
    if (name == "data") {
      const std::string& d = f.value();
      if (d.empty() || d[0] == '/' || d == ".." || d.rfind("../", 0) == 0 ||
          d.find("/../") != std::string::npos ||
          (d.size() >= 3 && d.compare(d.size() - 3, 3, "/..") == 0)) {
        return Bad("train.data", absl::StrCat("\"", d, "\" must be a path inside each worker's "
                                              "data root (relative, without ..)"));
      }
      job.data_path = d;
      given[name] = "/data-root/" + d;  // only for the checks below
      continue;
    }
    if (def->kind == settings::SettingKind::kBool) {
      if (f.value() != "true" && f.value() != "false") {
        return Bad("train." + name, absl::StrCat("must be true or false, got '", f.value(), "'"));
      }
      if (f.value() == "true") job.train_args.push_back(flag);
      given[name] = f.value();
      continue;
    }
    job.train_args.push_back(flag + "=" + f.value());
    given[name] = f.value();
  }
  for (const auto& [name, v] : {std::pair<const char*, int>{"dp", dp}, {"tp", tp}, {"pp", pp},
                                {"ep", ep}, {"microbatches", micro}}) {
    job.train_args.push_back(
        absl::StrCat(settings::NameOf(name, settings::Spelling::kFlags), "=", v));
    given[name] = absl::StrCat(v);
  }
  // What the worker adds: the config (checked above), the job's checkpoint folder, and the
  // resources, so that the rules between settings (bf16 only on cuda, ...) hold here too.
  given["config"] = "job.json";
  given["checkpoint_dir"] = "checkpoints";
  given["device"] = job.device;
  given["threads"] = absl::StrCat(job.threads);
  const bool stats_given = given.count("stats_every") > 0;
  const settings::SettingValues values(std::move(given), settings::Spelling::kSpec);
  absl::Status parsed = values.CheckGiven();
  settings::TrainOptions o;
  if (parsed.ok()) parsed = settings::ParseTrainSettings(values, &o);
  if (parsed.ok()) parsed = settings::ValidateVirtualStages(*config, o, settings::Spelling::kSpec);
  if (parsed.ok() && o.vocab_multiple > 1) {
    parsed = model::ValidateSharding(*config, tp, pp, ep,
                                     settings::LayoutNamesOf(settings::Spelling::kSpec),
                                     o.vocab_multiple);
  }
  if (parsed.ok() && job.device == "cuda") {
    // What the GPU path cannot run: options, and designs its kernels cannot take (from the
    // config alone; the rank checks again). As `satdar train --device cuda`, statistics are
    // off unless asked for.
    if (!stats_given) o.stats_every = 0;
    parsed = settings::CheckGpuPathOptions(o, settings::Spelling::kSpec);
    if (parsed.ok()) parsed = model::CheckDeviceSupport(*config, tp);
  }
  if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("job spec: ", parsed.message()));
  if (o.mqar.has_value()) {
    // What `satdar train` checks against the config before its first batch.
    absl::Status task = o.mqar->Validate(config->vocab_size, o.seq_len);
    if (!task.ok()) {
      // The task names its options (mqar.keys, seq_len); the spec's fields are train.mqar_keys
      // and train.seq_len.
      std::string m(task.message());
      for (size_t at = m.find("mqar."); at != std::string::npos; at = m.find("mqar.", at)) {
        m.replace(at, 5, "train.mqar_");
        at += 11;
      }
      if (m.rfind("seq_len ", 0) == 0) m = "train." + m;
      return absl::InvalidArgumentError(absl::StrCat("job spec: ", m));
    }
  }
  if (o.seq_len > config->max_position_embeddings) {
    return Bad("train.seq_len", absl::StrCat(o.seq_len, " exceeds the config's max_position_embeddings ",
                                             config->max_position_embeddings));
  }
  job.steps = o.steps;
  return job;
}

}  // namespace satdar::coordinator
