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

TEST(WhyNotPlaced, SaysWhetherTheWorkersCouldEverHoldTheGang) {
  const std::vector<FreeSlots> capacity = {{"a", "cpu", 1}, {"g", "cuda", 4}};
  const std::vector<FreeSlots> free = {{"a", "cpu", 0}, {"g", "cuda", 3}};
  GangWait w = WhyNotPlaced(1, 1, "cpu", free, capacity);
  EXPECT_FALSE(w.never_fits);
  EXPECT_EQ(w.reason, "waiting for 1 free slot (0 free)");
  w = WhyNotPlaced(2, 1, "cpu", free, capacity);  // cuda slots do not count
  EXPECT_TRUE(w.never_fits);
  EXPECT_EQ(w.reason, "waiting: needs 2 slots, the 1 registered worker has 1; it starts once "
                      "enough workers register");
  w = WhyNotPlaced(4, 2, "cuda", free, capacity);
  EXPECT_FALSE(w.never_fits);
  EXPECT_EQ(w.reason, "waiting for 4 free cuda slots in groups of 2 on one worker (TP 2; 3 free, "
                      "room for 2)");
  w = WhyNotPlaced(8, 1, "cuda", free, capacity);
  EXPECT_EQ(w.reason, "waiting: needs 8 cuda slots, the 1 registered cuda worker has 4; it starts "
                      "once enough workers register");
  w = WhyNotPlaced(1, 1, "cuda", {}, {});
  EXPECT_EQ(w.reason, "waiting: needs 1 cuda slot, no cuda worker is registered; it starts once "
                      "enough workers register");
}

}  // namespace
}  // namespace satdar::coordinator
