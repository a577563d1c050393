#include "worker/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/safetensors.h"

namespace satdar::worker {

namespace {

constexpr char kPrefix[] = "ckpt_";
constexpr char kSuffix[] = ".safetensors";

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// Checksum chained over tensors in file order (the order they were written).
uint64_t DataChecksum(const std::vector<const void*>& data, const std::vector<size_t>& sizes) {
  uint64_t h = 0x6a09e667f3bcc909ull;
  for (size_t i = 0; i < data.size(); ++i) h = core::Checksum64(data[i], sizes[i], h);
  return h;
}

// Step number of "ckpt_00000012.safetensors", or -1.
int64_t StepOf(const std::string& name) {
  size_t pl = sizeof(kPrefix) - 1, sl = sizeof(kSuffix) - 1;
  if (name.size() <= pl + sl || name.compare(0, pl, kPrefix) != 0 ||
      name.compare(name.size() - sl, sl, kSuffix) != 0) {
    return -1;
  }
  int64_t step;
  if (!absl::SimpleAtoi(name.substr(pl, name.size() - pl - sl), &step)) return -1;
  return step;
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpoints(
    const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    int64_t step = StepOf(e->d_name);
    if (step >= 0) out.emplace_back(step, dir + "/" + e->d_name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, ": ", what));
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s%08" PRId64 "%s", kPrefix, step, kSuffix);
  return dir + "/" + name;
}

template <typename T>
absl::Status SaveCheckpoint(const std::string& dir, const CheckpointInfo& info,
                            const model::ParamTable& table, const OptimizerBuffers<T>& buffers) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-dir: cannot create folder ", dir));
  }
  const core::DType dtype = core::DTypeOf<T>::value;
  std::vector<core::TensorRef> tensors;
  std::vector<const void*> data;
  std::vector<size_t> sizes;
  auto add = [&](const std::string& name, const model::ParamSpec& spec, const std::vector<T>& v) {
    const T* p = v.data() + spec.offset;
    tensors.push_back({name, dtype, spec.shape, p});
    data.push_back(p);
    sizes.push_back(spec.numel * sizeof(T));
  };
  for (const auto& spec : table.specs()) add(spec.name, spec, *buffers.params);
  for (const auto& spec : table.specs()) {
    add("optimizer.exp_avg." + spec.name, spec, *buffers.exp_avg);
  }
  for (const auto& spec : table.specs()) {
    add("optimizer.exp_avg_sq." + spec.name, spec, *buffers.exp_avg_sq);
  }
  std::map<std::string, std::string> meta = {
      {"format", kCheckpointFormat},
      {"step", std::to_string(info.step)},
      {"seed", std::to_string(info.seed)},
      {"data_position", std::to_string(info.data_position)},
      {"config", info.config_json},
      {"trainer", info.trainer_json},
      {"dtype", core::DTypeName(dtype)},
      {"checksum", Hex(DataChecksum(data, sizes))},
  };
  return core::WriteSafetensors(CheckpointPath(dir, info.step), tensors, meta);
}

absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& dir) {
  SATDAR_ASSIGN_OR_RETURN(auto all, ListCheckpoints(dir));
  return all.empty() ? std::string() : all.back().second;
}

template <typename T>
absl::StatusOr<CheckpointInfo> LoadCheckpoint(const std::string& path,
                                              const std::string& config_json,
                                              const model::ParamTable& table,
                                              const OptimizerBuffers<T>& buffers) {
  SATDAR_ASSIGN_OR_RETURN(core::SafetensorsFile file, core::SafetensorsFile::Open(path));
  const auto& meta = file.metadata();
  for (const char* key : {"format", "step", "seed", "data_position", "config", "trainer",
                          "dtype", "checksum"}) {
    if (!meta.count(key)) return Corrupt(path, absl::StrCat("metadata has no '", key, "'"));
  }
  if (meta.at("format") != kCheckpointFormat) {
    return Corrupt(path, absl::StrCat("format '", meta.at("format"), "' is not ",
                                      kCheckpointFormat));
  }
  if (meta.at("config") != config_json) {
    return Corrupt(path, "was written for a different model config");
  }
  const core::DType dtype = core::DTypeOf<T>::value;
  if (meta.at("dtype") != core::DTypeName(dtype)) {
    return Corrupt(path, absl::StrCat("was written in ", meta.at("dtype"), ", this run uses ",
                                      core::DTypeName(dtype)));
  }
  std::vector<const void*> data;
  std::vector<size_t> sizes;
  for (const auto& e : file.entries()) {
    data.push_back(file.data(e));
    sizes.push_back(e.end - e.begin);
  }
  if (Hex(DataChecksum(data, sizes)) != meta.at("checksum")) {
    return Corrupt(path, "checksum mismatch: the file is corrupted");
  }
  size_t expected = 3 * table.specs().size();
  if (file.entries().size() != expected) {
    return Corrupt(path, absl::StrCat("holds ", file.entries().size(), " tensors, expected ",
                                      expected, " for this model"));
  }
  auto read = [&](const std::string& name, const model::ParamSpec& spec,
                  std::vector<T>* v) -> absl::Status {
    return file.ReadFloats(name, spec.shape, dtype, v->data() + spec.offset);
  };
  for (const auto& spec : table.specs()) {
    SATDAR_RETURN_IF_ERROR(read(spec.name, spec, buffers.params));
    SATDAR_RETURN_IF_ERROR(read("optimizer.exp_avg." + spec.name, spec, buffers.exp_avg));
    SATDAR_RETURN_IF_ERROR(read("optimizer.exp_avg_sq." + spec.name, spec, buffers.exp_avg_sq));
  }
  CheckpointInfo info;
  uint64_t seed;
  if (!absl::SimpleAtoi(meta.at("step"), &info.step) ||
      !absl::SimpleAtoi(meta.at("seed"), &seed) ||
      !absl::SimpleAtoi(meta.at("data_position"), &info.data_position)) {
    return Corrupt(path, "step, seed or data_position is not a number");
  }
  info.seed = seed;
  info.config_json = meta.at("config");
  info.trainer_json = meta.at("trainer");
  return info;
}

absl::Status PruneCheckpoints(const std::string& dir, int keep) {
  SATDAR_ASSIGN_OR_RETURN(auto all, ListCheckpoints(dir));
  for (size_t i = 0; i + keep < all.size(); ++i) ::unlink(all[i].second.c_str());
  return absl::OkStatus();
}

template absl::Status SaveCheckpoint<float>(const std::string&, const CheckpointInfo&,
                                            const model::ParamTable&,
                                            const OptimizerBuffers<float>&);
template absl::Status SaveCheckpoint<double>(const std::string&, const CheckpointInfo&,
                                             const model::ParamTable&,
                                             const OptimizerBuffers<double>&);
template absl::StatusOr<CheckpointInfo> LoadCheckpoint<float>(const std::string&, const std::string&,
                                                              const model::ParamTable&,
                                                              const OptimizerBuffers<float>&);
template absl::StatusOr<CheckpointInfo> LoadCheckpoint<double>(const std::string&, const std::string&,
                                                               const model::ParamTable&,
                                                               const OptimizerBuffers<double>&);

}  // namespace satdar::worker
