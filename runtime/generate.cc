#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::runtime {

namespace {

// The first maximum: the lowest id among equal logits (as Model::Predictions).
int32_t Argmax(const double* logits, int vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

absl::Status CheckSampling(const SamplingOptions& o) {
  if (o.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens: ", o.max_new_tokens, " (at least 0)"));
  }
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: ", o.temperature, " (a finite number >= 0)"));
  }
  if (o.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k: ", o.top_k, " (at least 0)"));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p: ", o.top_p, " (in (0, 1])"));
  }
  return absl::OkStatus();
}

absl::Status CheckPrompt(int i, const std::vector<int32_t>& p, const SamplingOptions& o,
                         int vocab, int window) {
  if (p.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt ", i, ": empty (a prompt needs at least one token)"));
  }
  for (size_t j = 0; j < p.size(); ++j) {
    if (p[j] < 0 || p[j] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", i, ": id ", p[j], " at position ",
                                                     j, " is outside [0, ", vocab, ")"));
    }
  }
  if (static_cast<int64_t>(p.size()) + o.max_new_tokens > window) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt ", i, ": ", p.size(), " tokens and max_new_tokens ", o.max_new_tokens,
        " pass the window of ", window, " positions (max_position_embeddings)"));
  }
  return absl::OkStatus();
}

}  // namespace

int32_t NextToken(const double* logits, int vocab, const SamplingOptions& o, std::mt19937_64* rng) {
  if (o.temperature <= 0 || o.top_k == 1 || vocab <= 1) return Argmax(logits, vocab);
  const double inv_t = 1.0 / o.temperature;
  const double top = logits[Argmax(logits, vocab)];
  // Candidates most likely first (equal logits: the lower id first), when an order matters.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int k = o.top_k > 0 && o.top_k < vocab ? o.top_k : vocab;
  if (k < vocab || o.top_p < 1) {
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  }
  std::vector<double> p(static_cast<size_t>(k));
  double total = 0;
  for (int j = 0; j < k; ++j) {
    p[j] = std::exp((logits[ids[j]] - top) * inv_t);
    total += p[j];
  }
  int n = k;
  if (o.top_p < 1) {
    double cum = 0;
    for (int j = 0; j < k; ++j) {
      cum += p[j];
      if (cum >= o.top_p * total) {
        n = j + 1;
        break;
      }
    }
  }
  double mass = 0;
  for (int j = 0; j < n; ++j) mass += p[j];
  const double u = static_cast<double>((*rng)() >> 11) * 0x1p-53 * mass;
  double cum = 0;
  for (int j = 0; j < n; ++j) {
    cum += p[j];
    if (u < cum) return ids[j];
  }
  return ids[n - 1];  // u rounded up to the whole mass
}

std::mt19937_64 PromptRng(uint64_t seed, uint64_t prompt) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(prompt), static_cast<uint32_t>(prompt >> 32)};
  return std::mt19937_64(seq);
}

absl::StatusOr<GenerateResult> Generate(DecodeSession* session,
    const std::vector<std::vector<int32_t>>& prompts, const SamplingOptions& o,
    const std::function<void(int prompt, int32_t id)>& on_token) {
  using Clock = std::chrono::steady_clock;
  SATDAR_RETURN_IF_ERROR(CheckSampling(o));
  const int vocab = session->config().vocab_size;
  const int window = session->window();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SATDAR_RETURN_IF_ERROR(CheckPrompt(static_cast<int>(i), prompts[i], o, vocab, window));
  }
  GenerateResult result;
  result.ids.resize(prompts.size());
  if (o.max_new_tokens == 0) return result;
  std::map<size_t, std::vector<int>> by_length;
  for (size_t i = 0; i < prompts.size(); ++i) {
    by_length[prompts[i].size()].push_back(static_cast<int>(i));
  }
  const Clock::time_point start = Clock::now();
  Clock::duration in_callbacks{0};
  std::vector<double> logits;
  for (const auto& [len, all] : by_length) {
    for (size_t first = 0; first < all.size(); first += kMaxGenerateBatch) {
      const std::vector<int> rows(all.begin() + first,
                                  all.begin() + std::min(all.size(), first + kMaxGenerateBatch));
      const int b = static_cast<int>(rows.size());
      const int tn = static_cast<int>(len);
      std::vector<std::mt19937_64> rngs;
      std::vector<int32_t> tokens;
      tokens.reserve(static_cast<size_t>(b) * len);
      for (int i : rows) {
        rngs.push_back(PromptRng(o.seed, static_cast<uint64_t>(i)));
        tokens.insert(tokens.end(), prompts[i].begin(), prompts[i].end());
      }
      SATDAR_RETURN_IF_ERROR(session->Begin(b, tn + o.max_new_tokens));
      SATDAR_RETURN_IF_ERROR(session->Step(tokens.data(), b, tn, false, &logits));
      std::vector<bool> done(static_cast<size_t>(b), false);
      int left = b;
      std::vector<int32_t> next(static_cast<size_t>(b), 0);
      while (true) {
        if (logits.size() != static_cast<size_t>(b) * vocab) {
          return absl::InternalError(absl::StrCat("decode step: ", logits.size(),
                                                  " logits for ", b, " rows of ", vocab));
        }
        for (int r = 0; r < b; ++r) {
          if (done[r]) continue;  // its row keeps stepping on its last token; nothing is kept
          const int32_t id = NextToken(logits.data() + static_cast<size_t>(r) * vocab, vocab, o,
                                       &rngs[r]);
          std::vector<int32_t>& out = result.ids[rows[r]];
          out.push_back(id);
          ++result.new_tokens;
          next[r] = id;
          if (id == o.eos_id || static_cast<int>(out.size()) == o.max_new_tokens) {
            done[r] = true;
            --left;
          }
          if (on_token) {
            const Clock::time_point c0 = Clock::now();
            on_token(rows[r], id);
            in_callbacks += Clock::now() - c0;
          }
        }
        if (left == 0) break;
        SATDAR_RETURN_IF_ERROR(session->Step(next.data(), b, 1, false, &logits));
      }
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start - in_callbacks).count();
  return result;
}

}  // namespace satdar::runtime
