#include "coordinator/scheduler.h"

#include <algorithm>

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

}  // namespace satdar::coordinator
