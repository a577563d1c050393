// core/random.h: counter-based random numbers. Every value is a pure function of its key
// (seed, stream, index), so any rank can produce any element without shared state: this is
// what makes parameter init identical under every parallel layout, and synthetic data a
// function of (seed, step, sequence).
#ifndef SATDAR_CORE_RANDOM_H_
#define SATDAR_CORE_RANDOM_H_

#include <cmath>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace satdar::core {

// SplitMix64 finaliser: a bijective 64-bit mixer.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// 64-bit FNV-1a of a string (e.g. a parameter name), used as a stream id.
inline uint64_t HashString(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

inline uint64_t RandomBits(uint64_t seed, uint64_t stream, uint64_t index) {
  return Mix64(Mix64(Mix64(seed) ^ stream) + index);
}

// Uniform in (0, 1), never exactly 0 or 1.
inline double RandomUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(RandomBits(seed, stream, index) >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal (Box-Muller over two independent uniforms of the same key).
inline double RandomNormal(uint64_t seed, uint64_t stream, uint64_t index) {
  double u1 = RandomUniform(seed, stream, 2 * index);
  double u2 = RandomUniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace satdar::core

#endif  // SATDAR_CORE_RANDOM_H_
