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

// Where a parameter sits in the decoder (model/param_layout.h's order). The gradient reductions
// and the cost model read this, never the names.
enum class ParamRole {
  kEmbedding,  // model.embed_tokens.weight (also the head when tied)
  kGlobal,     // before the first block and in no block (ResFormer learnable_plus's lambdas)
  kLayer,      // block `layer`: its branches, its value-residual, FFN and topology parameters
  kFinal,      // model.norm and the topology's parameters after the last block
  kHead,       // lm_head.weight (untied)
};

struct ParamSpec {
  std::string name;
  ParamRole role = ParamRole::kGlobal;
  int layer = -1;  // the block (global index) for ParamRole::kLayer, else -1
  core::Shape shape;
  ParamInit init;
  int64_t offset = 0;  // elements
  int64_t numel = 0;
  // Elements from offset to the next tensor's: numel rounded up to the table's alignment. The
  // stride - numel padding elements belong to no tensor and stay 0.
  int64_t stride = 0;
  // Kept for checkpoint compatibility but never read by the model (its gradient is 0):
  // weight files may omit it (e.g. layer 0's ResFormer lambda2).
  bool unused = false;
  // A tensor-parallel shard: this rank holds slice shard_index of shard_count equal slices
  // of dimension shard_dim of the global tensor (global_shape); shard_dim -1: all of it.
  // A padded shard (the vocabulary) splits the global dimension padded to shard_count x
  // shape[shard_dim]: the elements past the global tensor's end are padding (always 0).
  int shard_dim = -1;
  int shard_index = 0, shard_count = 1;
  core::Shape global_shape;
  // Replicated over tensor-parallel ranks, but each computes only its heads' part of the
  // gradient (e.g. the q/k norms): the gradient is summed over the TP group.
  bool tp_partial_grad = false;
  // Replicated on every pipeline stage, each computing its own layers' part of the gradient
  // (ResFormer learnable_plus's lambda softmax spans all layers): summed over the stages.
  bool pp_partial_grad = false;
  // A routed expert's weight, held by one expert-parallel rank: its gradient already holds
  // every EP rank's tokens and is reduced over data-parallel replicas only.
  bool expert = false;

  bool sharded() const { return shard_dim >= 0; }
  // Index into the global tensor of local element i, or -1 for a padding element.
  int64_t GlobalIndex(int64_t i) const;
  // This slice's true (non-padding) rows [first, first + count) along shard_dim, in global
  // coordinates; the whole dimension when not sharded.
  int64_t TrueFirst() const;
  int64_t TrueCount() const;
  bool padded() const { return sharded() && shape[shard_dim] * shard_count != global_shape[shard_dim]; }
};

class ParamTable {
 public:
  // align: every tensor starts at a multiple of `align` elements (1: packed, the CPU's table;
  // 32 on the GPU, so every GEMM operand is aligned for cuBLASLt's fast kernels, where a DAR
  // layer's few scalars would otherwise misalign everything after them).
  explicit ParamTable(int64_t align = 1);

  // Appends a parameter after the previous one. Names must be unique. The reference stays
  // valid until the next Add (to set the flags above).
  ParamSpec& Add(const std::string& name, core::Shape shape, ParamInit init, bool unused = false);
  // This rank's slice `index` of `count` along `dim` of a tensor of global_shape (count 1:
  // the plain Add). Initialization matches the global tensor element by element.
  ParamSpec& AddShard(const std::string& name, const core::Shape& global_shape, ParamInit init,
                      int dim, int index, int count);
  // Like AddShard, with dimension `dim` padded to padded_size (a multiple of count, at least
  // global_shape[dim]) before the split. padded_size == global_shape[dim]: AddShard.
  ParamSpec& AddPaddedShard(const std::string& name, const core::Shape& global_shape,
                            ParamInit init, int dim, int index, int count, int64_t padded_size);

  const std::vector<ParamSpec>& specs() const { return specs_; }
  // Appends every parameter of `other` (flags and sharding kept; the same align) after this
  // table's; returns where they start. A pipeline rank with virtual stages holds its chunks' tables this way.
  int64_t Append(const ParamTable& other);
  // Marks specs [first, end) tp_partial_grad (sequence parallelism: computed on this rank's
  // token rows).
  void MarkTpPartial(size_t first) {
    for (size_t i = first; i < specs_.size(); ++i) specs_[i].tp_partial_grad = true;
  }
  // Gives specs [first, end) `role` (and `layer`, for ParamRole::kLayer).
  void MarkRole(size_t first, ParamRole role, int layer = -1) {
    for (size_t i = first; i < specs_.size(); ++i) {
      specs_[i].role = role;
      specs_[i].layer = layer;
    }
  }
  // Index into specs() of the first parameter of each block this table holds, in table order,
  // then of the first kFinal parameter (specs().size() on a rank without the final norm). The
  // elements from one entry to the next are one block's (the first also holds what comes
  // before it): what a data-parallel reduction overlapped with backward sends per block.
  std::vector<size_t> BlockStarts() const;
  const ParamSpec* Find(const std::string& name) const;
  // Offset of `name`; aborts if absent (a programming error in a model).
  int64_t Offset(const std::string& name) const;
  // Elements of a flat buffer (parameters, gradients, moments): the tensors and their padding.
  int64_t size() const { return size_; }
  // Elements of the tensors alone (including a padded vocabulary shard's rows): size() at
  // align 1, what the descriptions and the FLOP count report as the parameters.
  int64_t packed_size() const { return packed_size_; }
  int64_t align() const { return align_; }

  // Every element is a pure function of (seed, name, index): N(0, std) or a constant.
  template <typename T>
  void Initialize(T* params, uint64_t seed) const;

 private:
  // Slice `index` of `count` along `dim`, `size` elements long there.
  ParamSpec& AddSlice(const std::string& name, const core::Shape& global_shape, ParamInit init,
                      int dim, int index, int count, int64_t size);

  std::vector<ParamSpec> specs_;
  std::map<std::string, size_t> index_;
  int64_t align_ = 1;
  int64_t size_ = 0, packed_size_ = 0;
};

// Copies every tensor of `src` (laid out by `from`) into `dst` (laid out by `to`): the same
// specs in the same order, at any two alignments. Leaves to's padding elements as they are.
template <typename T>
void CopyTensors(const ParamTable& from, const T* src, const ParamTable& to, T* dst);

}  // namespace satdar::model

#endif  // SATDAR_MODEL_PARAM_TABLE_H_
