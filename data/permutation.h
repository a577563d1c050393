// data/permutation.h: a keyed pseudo-random permutation of [0, n) that needs no memory:
// a 4-round Feistel network over the smallest even-bit domain that holds n, with cycle walking
// back into range. Perm(i) is a pure function of (n, key, i), so the shuffled order of any
// epoch is available to every rank at any position without building a table.
#ifndef SATDAR_DATA_PERMUTATION_H_
#define SATDAR_DATA_PERMUTATION_H_

#include <cstdint>

#include "core/random.h"

namespace satdar::data {

class KeyedPermutation {
 public:
  KeyedPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
    int bits = 2;
    while ((1ull << bits) < n && bits < 62) bits += 2;
    half_ = bits / 2;
    mask_ = (1ull << half_) - 1;
  }
  uint64_t operator()(uint64_t i) const {
    uint64_t x = i;
    do {
      x = Round(x);
    } while (x >= n_);  // cycle walking: at most a few rounds since the domain < 4n
    return x;
  }

 private:
  uint64_t Round(uint64_t x) const {
    uint64_t left = x >> half_, right = x & mask_;
    for (int r = 0; r < 4; ++r) {
      uint64_t f = core::RandomBits(key_, static_cast<uint64_t>(r), right) & mask_;
      uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    return (left << half_) | right;
  }
  uint64_t n_, key_, mask_;
  int half_;
};

}  // namespace satdar::data

#endif  // SATDAR_DATA_PERMUTATION_H_
