#include "coordinator/scheduler.h"

#include "gtest/gtest.h"

namespace satdar::coordinator {
namespace {

TEST(PlaceGang, TpGroupsStayOnOneWorker) {
  std::vector<FreeSlots> w = {{"a", "cpu", 3}, {"b", "cpu", 2}};
  // Two TP groups of 2: one on each worker (a has 3 free but cannot take 4).
  auto p = PlaceGang(4, 2, "cpu", &w);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, (std::vector<std::string>{"a", "a", "b", "b"}));
  EXPECT_EQ(w[0].free, 1);
  EXPECT_EQ(w[1].free, 0);
  // Nothing left for another group of 2; the slots are unchanged by a failed placement.
  EXPECT_FALSE(PlaceGang(2, 2, "cpu", &w).has_value());
  EXPECT_EQ(w[0].free, 1);
  auto one = PlaceGang(1, 1, "cpu", &w);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ((*one)[0], "a");
}

TEST(PlaceGang, ReplicasSpanWorkersAndDevicesMustMatch) {
  std::vector<FreeSlots> w = {{"a", "cpu", 1}, {"b", "cpu", 1}, {"g", "cuda", 8}};
  auto dp2 = PlaceGang(2, 1, "cpu", &w);
  ASSERT_TRUE(dp2.has_value());
  EXPECT_EQ(*dp2, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(PlaceGang(1, 1, "cpu", &w).has_value());
  auto gpu = PlaceGang(8, 4, "cuda", &w);
  ASSERT_TRUE(gpu.has_value());
  EXPECT_EQ(w[2].free, 0);
}

}  // namespace
}  // namespace satdar::coordinator
