// runtime/weights.h: loads a model's parameters from a safetensors file by their MODELS.md
// names: weights written by `satdar init`, PyTorch, or a training checkpoint (whose
// optimizer.* tensors are skipped). Every parameter must be present with its exact shape,
// except those the model never reads (ParamSpec::unused), which keep their init value.
// A training checkpoint is verified first (its checksum over metadata and tensors, and its
// stored config against this one); so is the config that `satdar init` and `export` store
// beside the weights. Weights from elsewhere (PyTorch) carry no config and are checked by
// names and shapes alone.
#ifndef SATDAR_RUNTIME_WEIGHTS_H_
#define SATDAR_RUNTIME_WEIGHTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/param_table.h"

namespace satdar::runtime {

// Fills params (table.size()); present[k] says whether table.specs()[k] was in the file.
// Errors are InvalidArgument and name the flag, file and tensor.
template <typename T>
absl::Status LoadWeights(const std::string& flag, const std::string& path,
                         const model::ParamTable& table, const std::string& config_json,
                         std::vector<T>* params, std::vector<bool>* present);

// Every element of every parameter is finite: weights holding NaN or Inf (a diverged run, a
// damaged export) would only give NaN losses and gradients. InvalidArgument naming `what` (the
// flag and file) and the first tensor and element that is not.
template <typename T>
absl::Status CheckFiniteWeights(const std::string& what, const model::ParamTable& table,
                                const T* params);

// A whole model's weights (table: the CPU's or the device's layout) from exactly one of
// `weights` (LoadWeights: init/export/PyTorch safetensors or a single-file checkpoint) and
// `checkpoint` (LoadCheckpoint: a checkpoint file or folder of any layout, written in f32 or
// f64 whatever T is), then checked finite. InvalidArgument naming the field ("weights: ...",
// "checkpoint: ...") and file; the parameters the file lacks and the model never reads keep
// their init values.
template <typename T>
absl::Status LoadModelWeights(const std::string& weights, const std::string& checkpoint,
                              const model::ParamTable& table, const std::string& config_json,
                              std::vector<T>* params);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_WEIGHTS_H_
