// core/safetensors.h: the safetensors format (8-byte little-endian header length, a JSON
// header of {name: {dtype, shape, data_offsets}} plus optional "__metadata__" strings, then
// raw little-endian data).
//
//   SATDAR_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open("w.safetensors"));
//   const SafetensorsEntry* e = f.Find("model.norm.weight");
//
//   std::vector<TensorRef> out = {{"loss", DType::kF64, {1}, &loss}};
//   SATDAR_RETURN_IF_ERROR(WriteSafetensors("g.safetensors", out, {}));
//
// Open validates everything before returning (truncation, offsets out of range or
// overlapping, unknown dtypes, sizes that disagree with shapes) and names the file and
// tensor in the error. Writes are atomic (see file_util.h).
#ifndef SATDAR_CORE_SAFETENSORS_H_
#define SATDAR_CORE_SAFETENSORS_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/file_util.h"
#include "core/tensor.h"

namespace satdar::core {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin = 0;  // byte offsets into the data section
  size_t end = 0;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // Entries in file order (ascending offsets).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  const void* data(const SafetensorsEntry& entry) const { return data_ + entry.begin; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Raw bytes of the data section (for checksums).
  const void* data_section() const { return data_; }
  size_t data_section_size() const { return data_size_; }

  // Reads entry `name` converted to floating dtype `dtype`, checking its shape.
  absl::Status ReadFloats(const std::string& name, const Shape& expected, DType dtype,
                          void* out) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  core::MappedFile file_;
  const char* data_ = nullptr;
  size_t data_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

struct TensorRef {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;
};

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace satdar::core

#endif  // SATDAR_CORE_SAFETENSORS_H_
