#include "core/random.h"

#include <cmath>

#include "gtest/gtest.h"

namespace satdar::core {
namespace {

TEST(Random, PureFunctionOfKey) {
  EXPECT_EQ(RandomBits(1, 2, 3), RandomBits(1, 2, 3));
  EXPECT_NE(RandomBits(1, 2, 3), RandomBits(1, 2, 4));
  EXPECT_NE(RandomBits(1, 2, 3), RandomBits(2, 2, 3));
  EXPECT_EQ(RandomNormal(7, HashString("a.weight"), 5), RandomNormal(7, HashString("a.weight"), 5));
}

TEST(Random, NormalMoments) {
  const int n = 200000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    double x = RandomNormal(3, 9, i);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.01);
}

TEST(Random, UniformInOpenInterval) {
  for (int i = 0; i < 10000; ++i) {
    double u = RandomUniform(0, 0, i);
    EXPECT_GT(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

}  // namespace
}  // namespace satdar::core
