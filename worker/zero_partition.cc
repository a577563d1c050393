#include "worker/zero_partition.h"

namespace satdar::worker {

namespace {

ZeroPartition Make(Runs runs, comm::Communicator* group, int size, int rank) {
  ZeroPartition p;
  p.runs = std::move(runs);
  for (const auto& [off, len] : p.runs) p.length += len;
  p.group = size > 1 ? group : nullptr;
  p.size = size;
  p.rank = rank;
  p.shard = (p.length + size - 1) / size;
  return p;
}

}  // namespace

std::vector<ZeroPartition> ZeroPartitions(const Runs& dense, const Runs& experts,
                                          const MeshGroups& g) {
  std::vector<ZeroPartition> parts;
  if (g.shape.ep == 1 || experts.empty()) {
    // Every element is replicated over the data group: one partition, the whole buffer in order.
    Runs all;
    for (const Runs* r : {&dense, &experts}) all.insert(all.end(), r->begin(), r->end());
    std::sort(all.begin(), all.end());
    Runs merged;
    for (const auto& [off, len] : all) {
      if (!merged.empty() && merged.back().first + merged.back().second == off) {
        merged.back().second += len;
      } else {
        merged.emplace_back(off, len);
      }
    }
    parts.push_back(Make(std::move(merged), g.data.get(), g.data_size(), g.data_rank()));
    return parts;
  }
  parts.push_back(Make(dense, g.data.get(), g.data_size(), g.data_rank()));
  ZeroPartition e = Make(experts, g.dp.get(), g.shape.dp, g.coord.dp);
  e.grad_scale = 1.0 / g.shape.ep;
  e.dense = false;
  parts.push_back(std::move(e));
  return parts;
}

}  // namespace satdar::worker
