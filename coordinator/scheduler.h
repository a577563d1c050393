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

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_SCHEDULER_H_
