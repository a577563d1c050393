// coordinator/scheduler.h: gang placement. A job starts only when all its ranks can be placed:
// ranks come in groups of `group` consecutive ranks (a TP group; TP is the innermost mesh axis)
// and each group goes to one worker; pipeline stages and replicas may span workers.
#ifndef SATDAR_COORDINATOR_SCHEDULER_H_
#define SATDAR_COORDINATOR_SCHEDULER_H_

#include <optional>
#include <string>
#include <vector>

namespace satdar::coordinator {

struct FreeSlots {
  std::string worker_id;
  std::string device;
  int free = 0;
};

// The worker of every rank 0..world-1, or nullopt when the gang does not fit now. Groups go to
// the worker with the most free slots first (ties: the order given), which keeps a job's ranks
// on few workers. On success *workers has the placed slots taken.
std::optional<std::vector<std::string>> PlaceGang(int world, int group, const std::string& device,
                                                  std::vector<FreeSlots>* workers);

// Why PlaceGang found no place for a gang of `world` ranks in groups of `group`: `free` as
// PlaceGang saw it, `capacity` every live worker with all its slots free. never_fits: the
// registered workers could not hold it even if idle ("waiting: needs 8 slots, the 2
// registered workers have 2; ..."); otherwise it waits for slots to free up ("waiting for 2
// free slots (1 free)").
struct GangWait {
  bool never_fits = false;
  std::string reason;
};
GangWait WhyNotPlaced(int world, int group, const std::string& device,
                      const std::vector<FreeSlots>& free, const std::vector<FreeSlots>& capacity);

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_SCHEDULER_H_
