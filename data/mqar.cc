#include "data/mqar.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/random.h"

namespace satdar::data {

absl::Status MqarOptions::Validate(int vocab_size, int seq_len) const {
  if (keys < 1 || values < 1 || pairs < 1 || queries < 1) {
    return absl::InvalidArgumentError(
        "mqar.keys, mqar.values, mqar.pairs and mqar.queries must be >= 1");
  }
  if (pairs > keys) {
    return absl::InvalidArgumentError(absl::StrCat("mqar.pairs ", pairs,
                                                   " exceeds mqar.keys ", keys,
                                                   " (keys within a sequence are distinct)"));
  }
  if (vocab_needed() > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MQAR needs ", vocab_needed(), " token ids (pad + mqar.keys + mqar.values) but the "
        "config's vocab_size is ", vocab_size));
  }
  if (2 * (pairs + queries) > seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_len ", seq_len, " is too short for ", pairs, " pairs and ", queries,
        " queries (needs ", 2 * (pairs + queries) - 1, ")"));
  }
  return absl::OkStatus();
}

void MqarBatches::Sequence(const SampleKey& key, int seq_len, int32_t* out) const {
  const uint64_t stream = core::Mix64(0x6d716172ull ^ core::Mix64(key.sample));
  uint64_t draw = 0;
  auto next = [&](uint64_t n) { return core::RandomBits(seed_, stream, draw++) % n; };
  // Distinct keys: a partial Fisher-Yates shuffle of 1..keys.
  std::vector<int32_t> pool(o_.keys);
  for (int k = 0; k < o_.keys; ++k) pool[k] = 1 + k;
  std::vector<int32_t> k(o_.pairs), v(o_.pairs);
  for (int i = 0; i < o_.pairs; ++i) {
    std::swap(pool[i], pool[i + next(o_.keys - i)]);
    k[i] = pool[i];
    v[i] = 1 + o_.keys + static_cast<int32_t>(next(o_.values));
  }
  std::fill(out, out + seq_len + 1, 0);
  int p = 0;
  for (int i = 0; i < o_.pairs; ++i) {
    out[p++] = k[i];
    out[p++] = v[i];
  }
  for (int q = 0; q < o_.queries; ++q) {
    const int i = static_cast<int>(next(o_.pairs));
    out[p++] = k[i];
    out[p++] = v[i];
  }
}

std::vector<int> MqarBatches::QueryPositions(int seq_len) const {
  std::vector<int> positions;
  for (int q = 0; q < o_.queries; ++q) {
    const int t = 2 * o_.pairs + 2 * q;  // the query key; its value follows
    if (t + 1 <= seq_len) positions.push_back(t);
  }
  return positions;
}

}  // namespace satdar::data
