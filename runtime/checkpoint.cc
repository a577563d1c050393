#include "runtime/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <functional>

#include <fcntl.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "nlohmann/json.hpp"

namespace satdar::runtime {

namespace {

constexpr char kPrefix[] = "ckpt_";
constexpr char kSuffix[] = ".safetensors";

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// The checksum of a checkpoint file: chained over every metadata entry but the checksum
// itself (key and value, in key order), then over the tensors in file order. A flipped byte
// anywhere, the stored step, seed and data position included, is found as corruption.
uint64_t FileChecksum(const std::map<std::string, std::string>& meta,
                      const std::vector<const void*>& data, const std::vector<size_t>& sizes) {
  uint64_t h = 0x6a09e667f3bcc909ull;
  for (const auto& [key, value] : meta) {
    if (key == "checksum") continue;
    const std::string entry = key + '\0' + value + '\0';
    h = core::Checksum64(entry.data(), entry.size(), h);
  }
  for (size_t i = 0; i < data.size(); ++i) h = core::Checksum64(data[i], sizes[i], h);
  return h;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Step number of "ckpt_00000012.safetensors" (one file) or "ckpt_00000012" (a folder of
// shards), or -1.
int64_t StepOf(const std::string& name) {
  size_t pl = sizeof(kPrefix) - 1, sl = sizeof(kSuffix) - 1;
  if (name.size() <= pl || name.compare(0, pl, kPrefix) != 0) return -1;
  std::string digits = name.substr(pl);
  if (digits.size() > sl && digits.compare(digits.size() - sl, sl, kSuffix) == 0) {
    digits.resize(digits.size() - sl);
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  int64_t step;
  if (!absl::SimpleAtoi(digits, &step)) return -1;
  return step;
}

std::string ShardFile(const std::string& folder, const std::string& shard_name) {
  return folder + "/shard-" + shard_name + kSuffix;
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

namespace {

absl::Status MakeDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory: cannot create folder ", dir));
  }
  return absl::OkStatus();
}

// One file: this piece's parameters and moments, and which slice of each tensor it holds.
template <typename T>
absl::Status WriteCheckpointFile(const std::string& path, const CheckpointInfo& info,
                                 const model::ParamTable& table,
                                 const OptimizerBuffers<T>& buffers) {
  const core::DType dtype = core::DTypeOf<T>::value;
  std::vector<core::TensorRef> tensors;
  std::vector<const void*> data;
  std::vector<size_t> sizes;
  // A padded slice (the vocabulary) is written without its padding rows, which are the last
  // rows of the slice: files hold true rows only, so they load into any padding.
  auto add = [&](const std::string& name, const model::ParamSpec& spec, const std::vector<T>& v) {
    const T* p = v.data() + spec.offset;
    core::Shape shape = spec.shape;
    int64_t numel = spec.numel;
    if (spec.padded()) {
      SATDAR_CHECK(spec.shard_dim == 0) << name << ": only dimension 0 is padded";
      numel = numel / shape[0] * spec.TrueCount();
      shape[0] = spec.TrueCount();
    }
    tensors.push_back({name, dtype, shape, p});
    data.push_back(p);
    sizes.push_back(numel * sizeof(T));
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
      {"loss", absl::StrFormat("%.17g", info.loss)},
      {"config", info.config_json},
      {"trainer", info.trainer_json},
      {"dtype", core::DTypeName(dtype)},
  };
  nlohmann::json shards = nlohmann::json::object();
  for (const auto& spec : table.specs()) {
    // [dim, index, count], and for a padded slice its first row (the slices are unequal).
    if (spec.padded() && spec.shard_count > 1) {
      shards[spec.name] = {spec.shard_dim, spec.shard_index, spec.shard_count, spec.TrueFirst()};
    } else if (spec.sharded() && !spec.padded()) {
      shards[spec.name] = {spec.shard_dim, spec.shard_index, spec.shard_count};
    }
  }
  if (!shards.empty()) meta["shards"] = shards.dump();
  meta["checksum"] = Hex(FileChecksum(meta, data, sizes));
  return core::WriteSafetensors(path, tensors, meta);
}

}  // namespace

template <typename T>
absl::Status SaveCheckpoint(const std::string& dir, const CheckpointInfo& info,
                            const model::ParamTable& table, const OptimizerBuffers<T>& buffers) {
  SATDAR_RETURN_IF_ERROR(MakeDir(dir));
  return WriteCheckpointFile(CheckpointPath(dir, info.step), info, table, buffers);
}

template <typename T>
absl::Status SaveShardedCheckpoint(const std::string& dir, const CheckpointInfo& info,
                                   const model::ParamTable& table,
                                   const OptimizerBuffers<T>& buffers,
                                   const std::string& shard_name, comm::Communicator* group,
                                   const comm::CollectiveOptions& options) {
  std::string final_dir = CheckpointPath(dir, info.step);
  final_dir.resize(final_dir.size() - (sizeof(kSuffix) - 1));
  const std::string tmp = final_dir + ".tmp";
  absl::Status prepared = absl::OkStatus();
  if (group->rank() == 0) {
    prepared = MakeDir(dir);
    if (prepared.ok()) prepared = core::RemoveTree(tmp);  // a crashed earlier attempt
    if (prepared.ok()) prepared = MakeDir(tmp);
  }
  SATDAR_RETURN_IF_ERROR(group->Barrier(options)->Wait());
  SATDAR_RETURN_IF_ERROR(prepared);
  SATDAR_RETURN_IF_ERROR(WriteCheckpointFile(ShardFile(tmp, shard_name), info, table, buffers));
  SATDAR_RETURN_IF_ERROR(group->Barrier(options)->Wait());
  if (group->rank() == 0) {
    SATDAR_RETURN_IF_ERROR(core::RemoveTree(final_dir));  // a rerun of the same step
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", final_dir));
    }
    SATDAR_RETURN_IF_ERROR(core::FsyncDir(dir));
  }
  return group->Barrier(options)->Wait();
}

absl::StatusOr<std::string> FindLatestCheckpoint(const std::string& dir) {
  SATDAR_ASSIGN_OR_RETURN(auto all, ListCheckpoints(dir));
  return all.empty() ? std::string() : all.back().second;
}

namespace {

// A tensor's pieces across the files of a checkpoint.
struct Piece {
  const core::SafetensorsFile* file;
  const core::SafetensorsEntry* entry;
  int dim = -1, index = 0, count = 1;
  int64_t start = -1;  // first row along dim 0 of an unequal (padded) slice; -1: equal slices
};

// Fills out (spec's local slice) from the pieces of tensor `name`.
template <typename T>
absl::Status Assemble(const std::string& path, const std::string& name,
                      const std::vector<Piece>& pieces, const model::ParamSpec& spec, T* out) {
  const core::DType dtype = core::DTypeOf<T>::value;
  const Piece& first = pieces.front();
  core::Shape global = first.entry->shape;
  const bool unequal = first.start >= 0;
  if (unequal) {
    global[0] = 0;
    for (const Piece& p : pieces) global[0] += p.entry->shape[0];
  } else if (first.dim >= 0) {
    global[first.dim] *= first.count;
  }
  if (global != spec.global_shape) {
    return Corrupt(path, absl::StrCat("tensor ", name, " has shape ", core::ShapeString(global),
                                      ", this model needs ", core::ShapeString(spec.global_shape)));
  }
  if (first.dim < 0 && !spec.sharded()) {
    return first.file->ReadFloats(name, spec.shape, dtype, out);
  }
  std::vector<T> full(core::NumElements(global)), piece;
  if (first.dim < 0) {
    SATDAR_RETURN_IF_ERROR(first.file->ReadFloats(name, global, dtype, full.data()));
  } else {
    if (static_cast<int>(pieces.size()) != first.count) {
      return Corrupt(path, absl::StrCat("tensor ", name, " has ", pieces.size(), " of its ",
                                        first.count, " slices"));
    }
    // Every slice of one tensor: the same split and shape, each index once.
    // Unequal slices: the same shape but for dimension 0, tiling it in index order.
    std::vector<const Piece*> by_index(first.count, nullptr);
    for (const Piece& p : pieces) {
      core::Shape a = p.entry->shape, b = first.entry->shape;
      if (unequal) a[0] = b[0] = 0;
      if (p.dim != first.dim || p.count != first.count || (p.start >= 0) != unequal || a != b ||
          by_index[p.index] != nullptr) {
        return Corrupt(path, absl::StrCat("the slices of tensor ", name, " do not fit together"));
      }
      by_index[p.index] = &p;
    }
    if (unequal) {
      const int64_t inner = core::NumElements(global) / global[0];
      int64_t row = 0;
      for (const Piece* p : by_index) {
        if (p->start != row) {
          return Corrupt(path, absl::StrCat("the slices of tensor ", name, " do not fit together"));
        }
        const int64_t rows = p->entry->shape[0];
        SATDAR_RETURN_IF_ERROR(
            p->file->ReadFloats(name, p->entry->shape, dtype, full.data() + row * inner));
        row += rows;
      }
    }
    for (const Piece& p : pieces) {
      if (unequal) break;
      model::ParamSpec slice;
      slice.shape = p.entry->shape;
      slice.global_shape = global;
      slice.shard_dim = p.dim;
      slice.shard_index = p.index;
      slice.shard_count = p.count;
      piece.resize(core::NumElements(slice.shape));
      SATDAR_RETURN_IF_ERROR(p.file->ReadFloats(name, slice.shape, dtype, piece.data()));
      for (size_t i = 0; i < piece.size(); ++i) full[slice.GlobalIndex(i)] = piece[i];
    }
  }
  for (int64_t i = 0; i < spec.numel; ++i) {
    const int64_t g = spec.GlobalIndex(i);
    out[i] = g < 0 ? T(0) : full[g];  // padding rows are 0
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

absl::StatusOr<CheckpointInfo> InfoOf(const core::SafetensorsFile& file) {
  const auto& meta = file.metadata();
  CheckpointInfo info;
  uint64_t seed;
  if (!absl::SimpleAtoi(meta.at("step"), &info.step) || info.step < 0 ||
      !absl::SimpleAtoi(meta.at("seed"), &seed) ||
      !absl::SimpleAtoi(meta.at("data_position"), &info.data_position) ||
      info.data_position < 0 ||
      (meta.count("loss") && !absl::SimpleAtod(meta.at("loss"), &info.loss))) {
    return Corrupt(file.path(), "step, seed, data_position or loss is not a number");
  }
  info.seed = seed;
  info.config_json = meta.at("config");
  info.trainer_json = meta.at("trainer");
  return info;
}

}  // namespace

std::string ConfigDifference(const std::string& stored, const std::string& mine) {
  auto a = core::ParseJson(stored, "stored config");
  auto b = core::ParseJson(mine, "config");
  if (!a.ok() || !b.ok() || !a->is_object() || !b->is_object()) return "it is not a config";
  std::function<std::string(const nlohmann::json&, const nlohmann::json&, const std::string&)>
      diff = [&](const nlohmann::json& x, const nlohmann::json& y,
                 const std::string& prefix) -> std::string {
    for (const auto& [key, value] : x.items()) {
      const std::string name = prefix + key;
      if (!y.contains(key)) return absl::StrCat("field \"", name, "\" is not in this config");
      if (value.is_object() && y[key].is_object()) {
        std::string d = diff(value, y[key], name + ".");
        if (!d.empty()) return d;
      } else if (value != y[key]) {
        return absl::StrCat("field \"", name, "\" is ", value.dump(), " there, ", y[key].dump(),
                            " in this config");
      }
    }
    for (const auto& [key, value] : y.items()) {
      if (!x.contains(key)) return absl::StrCat("field \"", prefix + key, "\" is not in it");
    }
    return "";
  };
  return diff(*a, *b, "");
}

absl::Status VerifyCheckpointFile(const core::SafetensorsFile& file,
                                  const std::string& config_json) {
  const auto& meta = file.metadata();
  const std::string& p = file.path();
  auto format = meta.find("format");
  if (format == meta.end()) return Corrupt(p, "has no 'format' metadata: not a satdar checkpoint");
  // v1 (earlier builds) checksummed the tensors only; it is still read, its metadata unverified.
  const bool v1 = format->second == kCheckpointFormatV1;
  if (!v1 && format->second != kCheckpointFormat) {
    return Corrupt(p, absl::StrCat("format '", format->second, "' is neither ", kCheckpointFormat,
                                   " nor ", kCheckpointFormatV1, " (written by a newer satdar?)"));
  }
  for (const char* key : {"step", "seed", "data_position", "config", "trainer", "dtype",
                          "checksum"}) {
    if (!meta.count(key)) {
      return Corrupt(p, absl::StrCat("metadata has no '", key, "': the file is corrupted"));
    }
  }
  if (!v1 && !meta.count("loss")) return Corrupt(p, "metadata has no 'loss': the file is corrupted");
  std::vector<const void*> data;
  std::vector<size_t> sizes;
  for (const auto& e : file.entries()) {
    data.push_back(file.data(e));
    sizes.push_back(e.end - e.begin);
  }
  const uint64_t sum = v1 ? FileChecksum({}, data, sizes) : FileChecksum(meta, data, sizes);
  if (Hex(sum) != meta.at("checksum")) {
    return Corrupt(p, "checksum mismatch: the file is corrupted (its metadata or tensors changed "
                      "after it was written)");
  }
  if (!config_json.empty() && meta.at("config") != config_json) {
    return Corrupt(p, absl::StrCat("was written for a different model config: ",
                                   ConfigDifference(meta.at("config"), config_json)));
  }
  return InfoOf(file).status();
}

template <typename T>
absl::StatusOr<CheckpointInfo> LoadCheckpoint(const std::string& path,
                                              const std::string& config_json,
                                              const model::ParamTable& table,
                                              const OptimizerBuffers<T>& buffers) {
  std::vector<std::string> paths;
  if (IsDir(path)) {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return Corrupt(path, "cannot open the folder");
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > sizeof(kSuffix) - 1 &&
          name.compare(name.size() - (sizeof(kSuffix) - 1), sizeof(kSuffix) - 1, kSuffix) == 0) {
        paths.push_back(path + "/" + name);
      }
    }
    ::closedir(d);
    std::sort(paths.begin(), paths.end());
    if (paths.empty()) return Corrupt(path, "the folder holds no shard files");
  } else {
    paths.push_back(path);
  }
  std::vector<core::SafetensorsFile> files;
  std::map<std::string, std::vector<Piece>> index;
  const core::DType dtype = core::DTypeOf<T>::value;
  files.reserve(paths.size());
  for (const std::string& p : paths) {
    SATDAR_ASSIGN_OR_RETURN(core::SafetensorsFile file, core::SafetensorsFile::Open(p));
    SATDAR_RETURN_IF_ERROR(VerifyCheckpointFile(file, config_json));
    const auto& meta = file.metadata();
    if (meta.at("dtype") != core::DTypeName(dtype)) {
      return Corrupt(p, absl::StrCat("was written in ", meta.at("dtype"), ", this run uses ",
                                     core::DTypeName(dtype)));
    }
    if (!files.empty() && (meta.at("step") != files[0].metadata().at("step") ||
                           meta.at("trainer") != files[0].metadata().at("trainer"))) {
      return Corrupt(p, "belongs to a different step or run than the other shards");
    }
    files.push_back(std::move(file));
  }
  for (const core::SafetensorsFile& file : files) {
    nlohmann::json shards = nlohmann::json::object();
    if (file.metadata().count("shards")) {
      auto parsed = core::ParseJson(file.metadata().at("shards"), file.path() + ": 'shards'");
      if (!parsed.ok()) return parsed.status();
      shards = *parsed;
      if (!shards.is_object()) {
        return Corrupt(file.path(), "metadata 'shards' is not a JSON object");
      }
    }
    for (const auto& e : file.entries()) {
      Piece piece{&file, &e};
      std::string base = e.name;
      for (const char* prefix : {"optimizer.exp_avg_sq.", "optimizer.exp_avg."}) {
        if (absl::StartsWith(base, prefix)) {
          base = base.substr(std::string(prefix).size());
          break;
        }
      }
      if (shards.contains(base)) {
        const auto& s = shards[base];
        if (!s.is_array() || (s.size() != 3 && s.size() != 4) || !s[0].is_number_integer() ||
            !s[1].is_number_integer() || !s[2].is_number_integer() ||
            s[2].get<int64_t>() > (1 << 20) ||
            (s.size() == 4 && (!s[3].is_number_integer() || s[3].get<int64_t>() < 0 ||
                               s[0].get<int64_t>() != 0))) {
          return Corrupt(file.path(), absl::StrCat("bad shard entry for ", base));
        }
        if (s.size() == 4) piece.start = s[3].get<int64_t>();
        piece.dim = static_cast<int>(s[0].get<int64_t>());
        piece.index = static_cast<int>(s[1].get<int64_t>());
        piece.count = static_cast<int>(s[2].get<int64_t>());
        if (s[0].get<int64_t>() != piece.dim || s[1].get<int64_t>() != piece.index) {
          return Corrupt(file.path(), absl::StrCat("bad shard entry for ", base));
        }
        if (piece.dim < 0 || piece.dim >= static_cast<int>(e.shape.size()) || piece.count < 1 ||
            piece.index < 0 || piece.index >= piece.count) {
          return Corrupt(file.path(), absl::StrCat("bad shard entry for ", base));
        }
      }
      auto& list = index[e.name];
      // Pipeline stages may both hold a tied embedding: keep one copy of each slice.
      bool duplicate = false;
      for (const Piece& q : list) duplicate |= q.index == piece.index && q.dim == piece.dim;
      if (!duplicate) list.push_back(piece);
    }
  }
  auto read = [&](const std::string& name, const model::ParamSpec& spec,
                  std::vector<T>* v) -> absl::Status {
    auto it = index.find(name);
    if (it == index.end()) return Corrupt(path, absl::StrCat("has no tensor ", name));
    return Assemble(path, name, it->second, spec, v->data() + spec.offset);
  };
  for (const auto& spec : table.specs()) {
    SATDAR_RETURN_IF_ERROR(read(spec.name, spec, buffers.params));
    if (buffers.exp_avg != nullptr) {
      SATDAR_RETURN_IF_ERROR(read("optimizer.exp_avg." + spec.name, spec, buffers.exp_avg));
      SATDAR_RETURN_IF_ERROR(read("optimizer.exp_avg_sq." + spec.name, spec, buffers.exp_avg_sq));
    }
  }
  SATDAR_ASSIGN_OR_RETURN(CheckpointInfo info, InfoOf(files[0]));
  // A checkpoint's name says its step; a file renamed (or a stored step changed) is refused.
  const size_t slash = path.find_last_not_of('/');
  const std::string base = path.substr(0, slash + 1);
  const int64_t named = StepOf(base.substr(base.rfind('/') + 1));
  if (named >= 0 && named != info.step) {
    return Corrupt(path, absl::StrCat("its name says step ", named, " but it holds step ",
                                      info.step));
  }
  return info;
}

absl::StatusOr<ResumePlan> CheckResume(const CheckpointInfo& info, const std::string& path,
                                       const std::string& trainer_json, uint64_t seed,
                                       bool warmup_given) {
  const std::string where = absl::StrCat("resume: checkpoint ", path);
  if (info.seed != seed) {
    return absl::InvalidArgumentError(absl::StrCat(where, " was written with seed ", info.seed,
                                                   ", this run has ", seed,
                                                   "; resume with the same value"));
  }
  const nlohmann::json stored = nlohmann::json::parse(info.trainer_json, nullptr, false);
  const nlohmann::json mine = nlohmann::json::parse(trainer_json, nullptr, false);
  if (!stored.is_object() || !mine.is_object() || !stored.contains("steps") ||
      !stored.contains("warmup_steps")) {
    return absl::InvalidArgumentError(absl::StrCat(where, " holds unreadable training options (",
                                                   info.trainer_json, ")"));
  }
  // Each stored field and the flag that sets it.
  static const std::pair<const char*, const char*> kFlags[] = {
      {"steps", "steps"},
      {"global_batch_size", "batch_size (the global batch: batch_size x dp x ep)"},
      {"seq_len", "seq_len"},
      {"lr", "lr"},
      {"min_lr_ratio", "min_lr_ratio"},
      {"warmup_steps", "warmup_steps"},
      {"weight_decay", "weight_decay"},
      {"beta1", "beta1"},
      {"beta2", "beta2"},
      {"eps", "eps"},
      {"grad_clip", "grad_clip"},
      {"synthetic_data", "synthetic_data"},
      {"data_dir", "data_dir"},
      {"task", "task"}};
  ResumePlan plan;
  plan.warmup_steps = stored["warmup_steps"].is_number_integer()
                          ? stored["warmup_steps"].get<int64_t>()
                          : mine["warmup_steps"].get<int64_t>();
  const int64_t steps = mine["steps"].get<int64_t>();
  const bool new_total = stored["steps"] != mine["steps"];
  for (const auto& [key, flag] : kFlags) {
    const auto a = stored.find(key), b = mine.find(key);
    const bool same = (a == stored.end()) == (b == mine.end()) && (a == stored.end() || *a == *b);
    if (same) continue;
    if (std::string(key) == "steps") {
      if (steps < info.step) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " is at step ", info.step, ", beyond steps ", steps,
            "; give steps ", info.step, " or more to continue it"));
      }
      continue;
    }
    // The default warmup (steps/10) would follow --steps; a resume keeps the one that ran.
    if (std::string(key) == "warmup_steps" && !warmup_given) continue;
    auto show = [](const nlohmann::json& j, const nlohmann::json::const_iterator& it) {
      return it == j.end() ? std::string("nothing") : it->dump();
    };
    return absl::InvalidArgumentError(absl::StrCat(
        where, " was written with ", flag, " ", show(stored, a), ", this run has ", show(mine, b),
        "; resume with the same value (or start a new run from its weights with init_from)"));
  }
  if (warmup_given) plan.warmup_steps = mine["warmup_steps"].get<int64_t>();
  if (new_total) {
    plan.note = absl::StrCat("the run's total changes from ", stored["steps"].dump(), " to ",
                             steps, " steps: the learning-rate schedule is recomputed for ",
                             steps, " steps (warmup ", plan.warmup_steps, ")");
  }
  return plan;
}

absl::Status PruneCheckpoints(const std::string& dir, int keep) {
  SATDAR_ASSIGN_OR_RETURN(auto all, ListCheckpoints(dir));
  for (size_t i = 0; i + keep < all.size(); ++i) SATDAR_RETURN_IF_ERROR(core::RemoveTree(all[i].second));
  return absl::OkStatus();
}

template absl::Status SaveCheckpoint<float>(const std::string&, const CheckpointInfo&,
                                            const model::ParamTable&,
                                            const OptimizerBuffers<float>&);
template absl::Status SaveCheckpoint<double>(const std::string&, const CheckpointInfo&,
                                             const model::ParamTable&,
                                             const OptimizerBuffers<double>&);
template absl::Status SaveShardedCheckpoint<float>(const std::string&, const CheckpointInfo&,
                                                   const model::ParamTable&,
                                                   const OptimizerBuffers<float>&,
                                                   const std::string&, comm::Communicator*,
                                                   const comm::CollectiveOptions&);
template absl::Status SaveShardedCheckpoint<double>(const std::string&, const CheckpointInfo&,
                                                    const model::ParamTable&,
                                                    const OptimizerBuffers<double>&,
                                                    const std::string&, comm::Communicator*,
                                                   const comm::CollectiveOptions&);
template absl::StatusOr<CheckpointInfo> LoadCheckpoint<float>(const std::string&, const std::string&,
                                                              const model::ParamTable&,
                                                              const OptimizerBuffers<float>&);
template absl::StatusOr<CheckpointInfo> LoadCheckpoint<double>(const std::string&, const std::string&,
                                                               const model::ParamTable&,
                                                               const OptimizerBuffers<double>&);

}  // namespace satdar::runtime
