// data/mqar.h: multi-query associative recall (MQAR, Zoology), the synthetic in-context
// retrieval task behind SATFormer's retrieval claims. Each sequence lists `pairs` key-value
// pairs (distinct keys, random values), then `queries` keys drawn from those pairs, each
// followed by its value; the rest is padding (id 0). Ids: 0 pad, keys 1..keys, values
// keys+1..keys+values; the model's vocab_size must hold them. A model recalls a query when
// its prediction after the query key is the key's value.
#ifndef SATDAR_DATA_MQAR_H_
#define SATDAR_DATA_MQAR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "data/batches.h"

namespace satdar::data {

struct MqarOptions {
  int keys = 64;
  int values = 64;
  int pairs = 8;
  int queries = 8;
  int vocab_needed() const { return 1 + keys + values; }
  // Errors name the flag (--mqar-keys, ...).
  absl::Status Validate(int vocab_size, int seq_len) const;
};

// Sequences keyed by sample number (all positions, pairs first).
class MqarBatches : public BatchSource {
 public:
  MqarBatches(uint64_t seed, const MqarOptions& options) : seed_(seed), o_(options) {}
  void Sequence(const SampleKey& key, int seq_len, int32_t* out) const override;
  // Input positions t (0-based) whose next token is a queried value, for a sequence of seq_len.
  std::vector<int> QueryPositions(int seq_len) const;

 private:
  uint64_t seed_;
  MqarOptions o_;
};

}  // namespace satdar::data

#endif  // SATDAR_DATA_MQAR_H_
