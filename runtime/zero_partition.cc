#include "runtime/zero_partition.h"

namespace satdar::runtime {

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
    // Every element is replicated over the data group: one partition, the whole buffer (the
    // dense and expert runs tile it) in order.
    int64_t total = 0;
    for (const Runs* r : {&dense, &experts}) {
      for (const auto& run : *r) total += run.second;
    }
    parts.push_back(Make({{0, total}}, g.data.get(), g.data_size(), g.data_rank()));
    return parts;
  }
  parts.push_back(Make(dense, g.data.get(), g.data_size(), g.data_rank()));
  ZeroPartition e = Make(experts, g.dp.get(), g.shape.dp, g.coord.dp);
  e.grad_scale = 1.0 / g.shape.ep;
  e.dense = false;
  parts.push_back(std::move(e));
  return parts;
}

}  // namespace satdar::runtime
