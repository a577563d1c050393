#include "coordinator/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::coordinator {

std::optional<std::vector<std::string>> PlaceGang(int world, int group, const std::string& device,
                                                  std::vector<FreeSlots>* workers) {
  SATDAR_CHECK(group >= 1 && world % group == 0) << "bad gang " << world << "/" << group;
  std::vector<FreeSlots> trial = *workers;
  std::vector<std::string> placement;
  placement.reserve(world);
  for (int g = 0; g < world / group; ++g) {
    int best = -1;
    for (int w = 0; w < static_cast<int>(trial.size()); ++w) {
      if (trial[w].device != device || trial[w].free < group) continue;
      if (best < 0 || trial[w].free > trial[best].free) best = w;
    }
    if (best < 0) return std::nullopt;
    trial[best].free -= group;
    for (int r = 0; r < group; ++r) placement.push_back(trial[best].worker_id);
  }
  *workers = trial;
  return placement;
}

GangWait WhyNotPlaced(int world, int group, const std::string& device,
                      const std::vector<FreeSlots>& free, const std::vector<FreeSlots>& capacity) {
  SATDAR_CHECK(group >= 1) << "bad group " << group;
  const std::string dev = device == "cpu" ? "" : device + " ";
  const std::string noun = absl::StrCat(dev, world == 1 ? "slot" : "slots");  // "cuda slots"
  const std::string groups =
      group > 1 ? absl::StrCat(" in groups of ", group, " on one worker (TP ", group) : "";
  // Slots, and the slots that whole groups can use (a group never spans workers).
  auto count = [&](const std::vector<FreeSlots>& workers, int* n, int* all, int* room) {
    for (const FreeSlots& w : workers) {
      if (w.device != device) continue;
      const int f = std::max(0, w.free);
      ++*n;
      *all += f;
      *room += f / group * group;
    }
  };
  int workers = 0, total = 0, total_room = 0;
  count(capacity, &workers, &total, &total_room);
  if (total_room < world) {
    std::string have;
    if (workers == 0) {
      have = absl::StrCat("no ", dev, "worker is registered");
    } else {
      have = absl::StrCat("the ", workers, " registered ", dev,
                          workers == 1 ? "worker has " : "workers have ",
                          group > 1 ? absl::StrCat("room for ", total_room, " (", total, " slots)")
                                    : absl::StrCat(total));
    }
    return {true, absl::StrCat("waiting: needs ", world, " ", noun, groups, group > 1 ? ")" : "",
                               ", ", have, "; it starts once enough workers register")};
  }
  int unused = 0, now_free = 0, now_room = 0;
  count(free, &unused, &now_free, &now_room);
  if (group > 1) {
    return {false, absl::StrCat("waiting for ", world, " free ", noun, groups, "; ", now_free,
                                " free, room for ", now_room, ")")};
  }
  return {false, absl::StrCat("waiting for ", world, " free ", noun, " (", now_free, " free)")};
}

}  // namespace satdar::coordinator
