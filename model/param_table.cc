#include "model/param_table.h"

#include "core/check.h"
#include "core/random.h"

namespace satdar::model {

void ParamTable::Add(const std::string& name, core::Shape shape, ParamInit init, bool unused) {
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
  size_ += spec.numel;
  index_[name] = specs_.size();
  specs_.push_back(std::move(spec));
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
      for (int64_t i = 0; i < spec.numel; ++i) p[i] = static_cast<T>(spec.init.value);
    } else if (spec.init.kind == InitKind::kValues) {
      for (int64_t i = 0; i < spec.numel; ++i) p[i] = static_cast<T>(spec.init.values[i]);
    } else {
      uint64_t stream = core::HashString(spec.name);
      for (int64_t i = 0; i < spec.numel; ++i) {
        p[i] = static_cast<T>(spec.init.value * core::RandomNormal(seed, stream, i));
      }
    }
  }
}

template void ParamTable::Initialize<float>(float*, uint64_t) const;
template void ParamTable::Initialize<double>(double*, uint64_t) const;

}  // namespace satdar::model
