#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/json.h"
#include "nlohmann/json.hpp"

namespace satdar::core {

namespace {
using Json = nlohmann::json;

// Header sizes above this are rejected as corrupt (the reference implementation uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}
}  // namespace

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  f.file_ = std::move(*mapped);
  const size_t size = f.file_.size();
  if (size < 8) {
    return Bad(path, absl::StrCat("truncated safetensors file: ", size,
                                  " bytes, less than the 8-byte header length"));
  }
  const char* base = f.file_.data();
  uint64_t header_len;
  std::memcpy(&header_len, base, 8);  // little-endian host
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return Bad(path, absl::StrCat("truncated safetensors file: header length ", header_len,
                                  " but only ", size - 8, " bytes follow"));
  }
  f.data_ = base + 8 + header_len;
  f.data_size_ = size - 8 - header_len;
  auto parsed = ParseJson(absl::string_view(base + 8, header_len),
                          absl::StrCat(path, ": safetensors header"));
  if (!parsed.ok()) return parsed.status();  // a tensor named twice is a duplicate key
  const Json& header = *parsed;
  if (!header.is_object()) return Bad(path, "safetensors header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Bad(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return Bad(path, absl::StrCat("__metadata__ value '", m.key(), "' is not a string"));
        }
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    std::string where = absl::StrCat("tensor '", name, "'");
    if (!v.is_object()) return Bad(path, absl::StrCat(where, ": entry is not an object"));
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return Bad(path, where + ": missing dtype");
    if (sh == v.end() || !sh->is_array()) return Bad(path, where + ": missing shape");
    if (off == v.end() || !off->is_array() || off->size() != 2) {
      return Bad(path, where + ": data_offsets must be [begin, end]");
    }
    SafetensorsEntry e;
    e.name = name;
    auto dtype = ParseDType(dt->get<std::string>());
    if (!dtype.ok()) {
      return Bad(path, absl::StrCat(where, ": unknown dtype '", dt->get<std::string>(), "'"));
    }
    e.dtype = *dtype;
    // Element and byte counts are computed with overflow checks: a shape whose product wraps
    // around must not pass for a smaller tensor.
    uint64_t elements = 1;
    bool overflow = false, zero = false;
    for (const Json& d : *sh) {
      if (!d.is_number_unsigned()) return Bad(path, where + ": shape entries must be >= 0");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX)) {
        return Bad(path, absl::StrCat(where, ": shape entry ", dim, " is too large"));
      }
      zero |= dim == 0;
      if (dim != 0 && elements > static_cast<uint64_t>(INT64_MAX) / dim) overflow = true;
      if (!overflow) elements *= std::max<uint64_t>(dim, 1);
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    if (zero) {
      elements = 0;
      overflow = false;
    }
    if (e.shape.size() > 16) return Bad(path, where + ": more than 16 dimensions");
    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return Bad(path, where + ": data_offsets must be non-negative integers");
    }
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (end < begin || end > f.data_size_) {
      return Bad(path, absl::StrCat(where, ": data_offsets [", begin, ", ", end,
                                    "] out of range (data section is ", f.data_size_,
                                    " bytes; truncated file?)"));
    }
    e.begin = static_cast<size_t>(begin);
    e.end = static_cast<size_t>(end);
    const uint64_t width = DTypeSize(e.dtype);
    if (overflow || elements > static_cast<uint64_t>(INT64_MAX) / width) {
      return Bad(path, absl::StrCat(where, ": shape ", sh->dump(), " has more elements than fit "
                                    "in 64 bits"));
    }
    const uint64_t expect = elements * width;
    if (end - begin != expect) {
      return Bad(path, absl::StrCat(where, ": ", end - begin, " bytes for shape ",
                                    ShapeString(e.shape), " of ", DTypeName(e.dtype),
                                    " (expected ", expect, ")"));
    }
    f.entries_.push_back(std::move(e));
  }
  std::sort(f.entries_.begin(), f.entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  for (size_t i = 1; i < f.entries_.size(); ++i) {
    const auto& a = f.entries_[i - 1];
    const auto& b = f.entries_[i];
    if (b.begin < a.end) {
      return Bad(path, absl::StrCat("tensors '", a.name, "' and '", b.name,
                                    "' have overlapping data_offsets"));
    }
  }
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  return f;
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

absl::Status SafetensorsFile::ReadFloats(const std::string& name, const Shape& expected,
                                         DType dtype, void* out) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return Bad(path_, absl::StrCat("missing tensor '", name, "'"));
  if (e->shape != expected) {
    return Bad(path_, absl::StrCat("tensor '", name, "' has shape ", ShapeString(e->shape),
                                   ", expected ", ShapeString(expected)));
  }
  if (!IsFloating(e->dtype)) {
    return Bad(path_, absl::StrCat("tensor '", name, "' has dtype ", DTypeName(e->dtype),
                                   ", expected a floating dtype (F32, F64 or BF16)"));
  }
  ConvertFloats(data(*e), e->dtype, out, dtype, static_cast<size_t>(NumElements(expected)));
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  size_t offset = 0;
  for (const TensorRef& t : tensors) {
    size_t bytes = static_cast<size_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad the header with spaces so the data section starts 8-byte aligned.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  uint64_t len = text.size();
  AtomicFileWriter writer;
  SATDAR_RETURN_IF_ERROR(writer.Open(path));
  SATDAR_RETURN_IF_ERROR(writer.Append(&len, 8));
  SATDAR_RETURN_IF_ERROR(writer.Append(text.data(), text.size()));
  for (const TensorRef& t : tensors) {
    size_t bytes = static_cast<size_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
    SATDAR_RETURN_IF_ERROR(writer.Append(t.data, bytes));
  }
  return writer.Commit();
}

}  // namespace satdar::core
