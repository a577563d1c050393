// runtime/generate.h: text generation over a DecodeSession: greedy decoding (the argmax of the
// logits, what a full forward pass over the prefix gives) or sampling with temperature, top-k
// and top-p, reproducible per prompt whatever the batching.
//
//   SamplingOptions o;  // greedy, 32 new tokens, stop at id 2
//   SATDAR_ASSIGN_OR_RETURN(GenerateResult r, Generate(session.get(), prompts, o, nullptr));
//
// Sampling runs on the host in double: softmax(logits / temperature), then the top_k most
// likely tokens, then the smallest prefix of those (most likely first, renormalised) whose
// mass reaches top_p; u = (rng() >> 11) * 2^-53 picks from the cumulative sums (portable:
// std::uniform_real_distribution differs between standard libraries).
#ifndef SATDAR_RUNTIME_GENERATE_H_
#define SATDAR_RUNTIME_GENERATE_H_

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/decode_session.h"

namespace satdar::runtime {

struct SamplingOptions {
  int max_new_tokens = 32;
  double temperature = 0;  // 0: greedy (argmax, the lowest id on ties)
  int top_k = 0;           // 0: all
  double top_p = 1;        // nucleus: the smallest set of most likely tokens with mass >= top_p
  uint64_t seed = 0;       // prompt i draws from its own generator seeded from (seed, i)
  int eos_id = 2;          // generation stops after emitting it
};

// One token from one row of logits (vocab doubles). Greedy (temperature 0 or top_k 1) draws
// nothing from rng; ties between equal logits go to the lower id.
int32_t NextToken(const double* logits, int vocab, const SamplingOptions& o, std::mt19937_64* rng);

// Prompt i's generator: std::mt19937_64 over std::seed_seq{seed's halves, i's halves}.
std::mt19937_64 PromptRng(uint64_t seed, uint64_t prompt);

struct GenerateResult {
  // Per prompt, the new tokens (ending with eos_id if it stopped there).
  std::vector<std::vector<int32_t>> ids;
  int64_t new_tokens = 0;
  double seconds = 0;                     // decoding time (prefill + steps)
};

// Prompts of equal length decode as one batch (rows that finished keep stepping, their tokens are
// dropped); on_token(prompt, id) is called as each new token is chosen. InvalidArgument naming
// "prompt N" for an empty prompt, an id out of range, or prompt + max_new_tokens > window().
//
// Prompts are numbered from 0 as in `prompts`. A batch holds at most kMaxGenerateBatch
// prompts; each is prefilled with one Step over the whole prompt, then steps one token at a
// time. seconds counts the session's steps and the sampling, not on_token (which may be
// empty). Other InvalidArgument errors name the field of o (max_new_tokens, temperature,
// top_k, top_p).
inline constexpr int kMaxGenerateBatch = 32;
absl::StatusOr<GenerateResult> Generate(DecodeSession* session,
    const std::vector<std::vector<int32_t>>& prompts, const SamplingOptions& o,
    const std::function<void(int prompt, int32_t id)>& on_token);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_GENERATE_H_
