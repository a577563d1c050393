// satdar grad: one forward and backward pass; writes the loss and every gradient.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/ops/gemm.h"
#include "core/safetensors.h"
#include "core/thread_pool.h"
#include "model/memory_estimate.h"
#include "model/model.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "runtime/weights.h"

namespace satdar::cli {

namespace {

// Token batch (B, T+1) from a safetensors file, checked against the vocabulary.
absl::StatusOr<std::vector<int32_t>> LoadTokens(const std::string& path, int vocab, int* b,
                                                int* t) {
  auto file = core::SafetensorsFile::Open(path);
  if (!file.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens: ", file.status().message()));
  }
  const core::SafetensorsEntry* e = file->Find("tokens");
  if (e == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens: ", path, " has no tensor named 'tokens'"));
  }
  if (e->dtype != core::DType::kI32 && e->dtype != core::DType::kI64) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens: ", path,
                                                   ": tensor 'tokens' has dtype ",
                                                   core::DTypeName(e->dtype),
                                                   ", expected I32 or I64"));
  }
  if (e->shape.size() != 2 || e->shape[0] < 1 || e->shape[1] < 2 || e->shape[0] > kMaxBatch ||
      e->shape[1] > kMaxSeqLen + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens: ", path, ": tensor 'tokens' has shape ", core::ShapeString(e->shape),
        ", expected [B, T+1] with 1 <= B <= ", kMaxBatch, " and 1 <= T <= ", kMaxSeqLen));
  }
  *b = static_cast<int>(e->shape[0]);
  *t = static_cast<int>(e->shape[1] - 1);
  std::vector<int32_t> tokens(e->shape[0] * e->shape[1]);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t v = e->dtype == core::DType::kI32 ? static_cast<const int32_t*>(file->data(*e))[i]
                                              : static_cast<const int64_t*>(file->data(*e))[i];
    if (v < 0 || v >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: ", path, ": token id ", v,
                                                     " at flat index ", i,
                                                     " is outside [0, vocab_size=", vocab, ")"));
    }
    tokens[i] = static_cast<int32_t>(v);
  }
  return tokens;
}

template <typename T>
absl::Status RunGradTyped(const model::ModelConfig& config, const FlagSet& flags, int threads) {
  int b, t;
  SATDAR_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                          LoadTokens(flags.Get("--tokens"), config.vocab_size, &b, &t));
  if (t > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens: sequence length ", t, " exceeds max_position_embeddings ",
        config.max_position_embeddings));
  }
  model::MemoryShape shape;
  shape.use = model::MemoryUse::kGradient;
  shape.batch = b;
  shape.seq_len = t;
  shape.dtype_bytes = sizeof(T);
  SATDAR_RETURN_IF_ERROR(model::CheckFitsInMemory(config, shape, 1, "satdar grad", kCliBatchNames));
  core::cpu::InitBlas();
  core::ThreadPool pool(threads);
  SATDAR_ASSIGN_OR_RETURN(auto model, model::CreateModel<T>(config, &pool));
  const model::ParamTable& table = model->params();
  std::vector<T> params, grads(table.size(), T(0));
  std::vector<bool> present;  // never-read parameters may be absent; they get no gradient
  SATDAR_RETURN_IF_ERROR(runtime::LoadWeights<T>("--weights", flags.Get("--weights"), table,
                                                 model::ModelConfigToJson(config), &params,
                                                 &present));
  SATDAR_ASSIGN_OR_RETURN(const double loss, model->Forward(params.data(), tokens.data(), b, t));
  SATDAR_RETURN_IF_ERROR(model->Backward(params.data(), grads.data(), 1.0));
  T loss_t = static_cast<T>(loss);
  std::vector<core::TensorRef> out;
  out.push_back({"loss", core::DTypeOf<T>::value, {1}, &loss_t});
  for (size_t k = 0; k < table.specs().size(); ++k) {
    const model::ParamSpec& spec = table.specs()[k];
    if (!present[k]) continue;
    out.push_back({"grad." + spec.name, core::DTypeOf<T>::value, spec.shape,
                   grads.data() + spec.offset});
  }
  absl::Status s = core::WriteSafetensors(flags.Get("--out"), out, {});
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("--out: ", s.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGrad(const std::vector<std::string>& args) {
  FlagSet flags("grad");
  flags.Define("--config", "model config JSON", true);
  flags.Define("--weights", "weights (safetensors)", true);
  flags.Define("--tokens", "token batch (safetensors with 'tokens' [B, T+1])", true);
  flags.Define("--out", "where to write loss and grad.<name> (safetensors)", true);
  flags.DefineEnum("--dtype", "precision of the pass", {"f32", "f64"}, "f32");
  flags.Define("--threads", "CPU threads", false, "1");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  SATDAR_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("--threads", 1, kMaxThreads));
  const std::vector<InputPath> inputs = {{"--config", flags.Get("--config")},
                                         {"--weights", flags.Get("--weights")},
                                         {"--tokens", flags.Get("--tokens")}};
  SATDAR_RETURN_IF_ERROR(CheckInputs(inputs));
  SATDAR_RETURN_IF_ERROR(CheckOutput("--out", flags.Get("--out"), false, inputs));
  SATDAR_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(flags.Get("--config")));
  return flags.Get("--dtype") == "f64"
             ? RunGradTyped<double>(config, flags, static_cast<int>(threads))
             : RunGradTyped<float>(config, flags, static_cast<int>(threads));
}

}  // namespace satdar::cli
