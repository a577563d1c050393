// model/param_table.h: the one table of a model's parameters (llm.c's size table).
//
// Each row is a name (MODELS.md section 5), a shape, an init rule and an offset into one flat
// buffer. Parameters, gradients and both AdamW moments are flat buffers of table.size()
// elements carved by the same offsets, so the optimizer, gradient clipping, checkpoints and
// (later) data-parallel reductions all work on contiguous memory.
#ifndef SATDAR_MODEL_PARAM_TABLE_H_
#define SATDAR_MODEL_PARAM_TABLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace satdar::model {

enum class InitKind { kNormal, kConstant, kValues };

struct ParamInit {
  InitKind kind = InitKind::kNormal;
  double value = 0.02;          // std for kNormal, the value for kConstant
  std::vector<double> values;   // every element, for kValues (identity matrices, one-hots)
  static ParamInit Normal(double std) { return {InitKind::kNormal, std, {}}; }
  static ParamInit Constant(double v) { return {InitKind::kConstant, v, {}}; }
  static ParamInit Values(std::vector<double> v) { return {InitKind::kValues, 0.0, std::move(v)}; }
};

struct ParamSpec {
  std::string name;
  core::Shape shape;
  ParamInit init;
  int64_t offset = 0;  // elements
  int64_t numel = 0;
  // Kept for checkpoint compatibility but never read by the model (its gradient is 0):
  // weight files may omit it (e.g. layer 0's ResFormer lambda2).
  bool unused = false;
};

class ParamTable {
 public:
  // Appends a parameter after the previous one. Names must be unique.
  void Add(const std::string& name, core::Shape shape, ParamInit init, bool unused = false);

  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec* Find(const std::string& name) const;
  // Offset of `name`; aborts if absent (a programming error in a model).
  int64_t Offset(const std::string& name) const;
  int64_t size() const { return size_; }

  // Every element is a pure function of (seed, name, index): N(0, std) or a constant.
  template <typename T>
  void Initialize(T* params, uint64_t seed) const;

 private:
  std::vector<ParamSpec> specs_;
  std::map<std::string, size_t> index_;
  int64_t size_ = 0;
};

}  // namespace satdar::model

#endif  // SATDAR_MODEL_PARAM_TABLE_H_
