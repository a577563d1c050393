#include "model/param_table.h"

#include <algorithm>

#include "core/check.h"
#include "core/random.h"

namespace satdar::model {

int64_t ParamSpec::GlobalIndex(int64_t i) const {
  if (shard_dim < 0) return i;
  int64_t inner = 1;
  for (size_t d = shard_dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t local = shape[shard_dim], global = global_shape[shard_dim];
  const int64_t outer = i / (inner * local), j = (i / inner) % local, k = i % inner;
  const int64_t row = shard_index * local + j;
  if (row >= global) return -1;  // padding
  return (outer * global + row) * inner + k;
}

int64_t ParamSpec::TrueFirst() const { return sharded() ? shard_index * shape[shard_dim] : 0; }

int64_t ParamSpec::TrueCount() const {
  if (!sharded()) return shape.empty() ? 1 : shape[0];
  const int64_t rest = global_shape[shard_dim] - TrueFirst();
  return std::max<int64_t>(0, std::min<int64_t>(shape[shard_dim], rest));
}

ParamTable::ParamTable(int64_t align) : align_(align) {
  SATDAR_CHECK(align >= 1) << "parameter table alignment " << align;
}

ParamSpec& ParamTable::AddShard(const std::string& name, const core::Shape& global_shape,
                                ParamInit init, int dim, int index, int count) {
  if (count == 1) return Add(name, global_shape, std::move(init));
  SATDAR_CHECK(dim >= 0 && dim < static_cast<int>(global_shape.size()) &&
               global_shape[dim] % count == 0 && index >= 0 && index < count)
      << name << ": cannot take slice " << index << " of " << count << " along dim " << dim;
  return AddSlice(name, global_shape, std::move(init), dim, index, count, global_shape[dim] / count);
}

ParamSpec& ParamTable::AddPaddedShard(const std::string& name, const core::Shape& global_shape,
                                      ParamInit init, int dim, int index, int count,
                                      int64_t padded_size) {
  SATDAR_CHECK(dim >= 0 && dim < static_cast<int>(global_shape.size()) &&
               padded_size >= global_shape[dim] && padded_size % count == 0 && index >= 0 &&
               index < count)
      << name << ": cannot pad dim " << dim << " to " << padded_size << " and take slice "
      << index << " of " << count;
  if (padded_size == global_shape[dim]) return AddShard(name, global_shape, init, dim, index, count);
  return AddSlice(name, global_shape, std::move(init), dim, index, count, padded_size / count);
}

ParamSpec& ParamTable::AddSlice(const std::string& name, const core::Shape& global_shape,
                                ParamInit init, int dim, int index, int count, int64_t size) {
  SATDAR_CHECK(init.kind != InitKind::kValues) << name << ": value inits are not sharded";
  core::Shape local = global_shape;
  local[dim] = size;
  ParamSpec& spec = Add(name, local, std::move(init));
  spec.shard_dim = dim;
  spec.shard_index = index;
  spec.shard_count = count;
  spec.global_shape = global_shape;
  return spec;
}

ParamSpec& ParamTable::Add(const std::string& name, core::Shape shape, ParamInit init, bool unused) {
  SATDAR_CHECK(index_.count(name) == 0) << "duplicate parameter " << name;
  ParamSpec spec;
  spec.name = name;
  spec.numel = core::NumElements(shape);
  spec.shape = std::move(shape);
  SATDAR_CHECK(init.kind != InitKind::kValues ||
               static_cast<int64_t>(init.values.size()) == spec.numel)
      << name << ": " << init.values.size() << " init values for " << spec.numel << " elements";
  spec.init = std::move(init);
  spec.unused = unused;
  spec.offset = size_;
  spec.stride = (spec.numel + align_ - 1) / align_ * align_;
  size_ += spec.stride;
  packed_size_ += spec.numel;
  spec.global_shape = spec.shape;
  index_[name] = specs_.size();
  specs_.push_back(std::move(spec));
  return specs_.back();
}

int64_t ParamTable::Append(const ParamTable& other) {
  // The appended specs keep their relative offsets only at the same alignment.
  SATDAR_CHECK(other.align() == align_)
      << "appending a table of align " << other.align() << " to one of align " << align_;
  const int64_t base = size_;
  for (const ParamSpec& s : other.specs()) {
    ParamSpec& spec = Add(s.name, s.shape, s.init, s.unused);
    const int64_t offset = spec.offset, stride = spec.stride;
    spec = s;
    spec.offset = offset;
    spec.stride = stride;
  }
  return base;
}

std::vector<size_t> ParamTable::BlockStarts() const {
  std::vector<size_t> starts;
  int last = -1;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    if (s.role == ParamRole::kLayer && (starts.empty() || s.layer != last)) {
      starts.push_back(i);
      last = s.layer;
    }
    if (s.role == ParamRole::kFinal) {
      starts.push_back(i);
      return starts;
    }
  }
  starts.push_back(specs_.size());
  return starts;
}

const ParamSpec* ParamTable::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &specs_[it->second];
}

int64_t ParamTable::Offset(const std::string& name) const {
  const ParamSpec* spec = Find(name);
  SATDAR_CHECK(spec != nullptr) << "no parameter named " << name;
  return spec->offset;
}

template <typename T>
void ParamTable::Initialize(T* params, uint64_t seed) const {
  for (const ParamSpec& spec : specs_) {
    T* p = params + spec.offset;
    if (spec.init.kind == InitKind::kConstant) {
      for (int64_t i = 0; i < spec.numel; ++i) {
        p[i] = spec.GlobalIndex(i) < 0 ? T(0) : static_cast<T>(spec.init.value);
      }
    } else if (spec.init.kind == InitKind::kValues) {
      for (int64_t i = 0; i < spec.numel; ++i) p[i] = static_cast<T>(spec.init.values[i]);
    } else {
      uint64_t stream = core::HashString(spec.name);
      for (int64_t i = 0; i < spec.numel; ++i) {
        const int64_t g = spec.GlobalIndex(i);
        p[i] = g < 0 ? T(0) : static_cast<T>(spec.init.value * core::RandomNormal(seed, stream, g));
      }
    }
  }
}

template void ParamTable::Initialize<float>(float*, uint64_t) const;
template void ParamTable::Initialize<double>(double*, uint64_t) const;

template <typename T>
void CopyTensors(const ParamTable& from, const T* src, const ParamTable& to, T* dst) {
  SATDAR_CHECK(from.specs().size() == to.specs().size())
      << "copying " << from.specs().size() << " tensors into a table of " << to.specs().size();
  for (size_t i = 0; i < from.specs().size(); ++i) {
    const ParamSpec &a = from.specs()[i], &b = to.specs()[i];
    SATDAR_CHECK(a.name == b.name && a.numel == b.numel)
        << "tensor " << i << ": " << a.name << " is " << b.name << " in the other table";
    std::copy(src + a.offset, src + a.offset + a.numel, dst + b.offset);
  }
}

template void CopyTensors<float>(const ParamTable&, const float*, const ParamTable&, float*);
template void CopyTensors<double>(const ParamTable&, const double*, const ParamTable&, double*);

}  // namespace satdar::model
