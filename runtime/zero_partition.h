// runtime/zero_partition.h: how ZeRO-1 shards a rank's AdamW moments over the replicas that
// hold the same weights.
//
// A partition is a set of elements of the flat buffer (runs, in ascending order) that a group
// of replicas holds identically, packed in run order and split into equal shards: member r of
// the group owns packed elements [r * shard, (r + 1) * shard) (the last shard padded). With
// data parallelism alone there is one partition, the whole buffer over the data group. With
// expert parallelism there are two: the dense weights over the data group (dp x ep replicas)
// and the routed experts over the dp group (the replicas of this rank's experts), whose
// averaged gradients are then divided by ep (the loss is the mean over all dp x ep replicas).
//
//   auto parts = ZeroPartitions(RolesOf(table, groups, tied), groups);  // model/param_roles.h
//   parts[p].Pack(grads, packed.data());   // flat -> packed (padding stays as it was)
#ifndef SATDAR_RUNTIME_ZERO_PARTITION_H_
#define SATDAR_RUNTIME_ZERO_PARTITION_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/param_roles.h"
#include "runtime/mesh_groups.h"

namespace satdar::runtime {

using Runs = model::Runs;  // (offset, length), ascending

struct ZeroPartition {
  Runs runs;               // the partition's elements in the flat buffer
  int64_t length = 0;      // their number
  int64_t shard = 0;       // elements each member owns: ceil(length / size)
  comm::Communicator* group = nullptr;  // null: one member
  int size = 1, rank = 0;  // the group's size and this rank's place in it
  double grad_scale = 1;   // applied after averaging over the group (1/ep for experts)
  bool dense = true;       // replicated over the expert-parallel ranks (norm: counted once)

  int64_t padded() const { return shard * size; }
  // The partition is the flat buffer itself from element 0 (packing is the identity): the
  // buffers are sized padded() and collectives run on them in place.
  bool identity() const { return runs.size() == 1 && runs[0].first == 0; }
  // First packed element this member owns.
  int64_t lo() const { return rank * shard; }

  // packed[k] = flat[element k] for k < length.
  template <typename T>
  void Pack(const T* flat, T* packed) const;
  // flat[element k] = packed[k] for k < length.
  template <typename T>
  void Unpack(const T* packed, T* flat) const;
  // Calls f(packed index, flat index) for this member's owned elements (not the padding).
  template <typename F>
  void ForOwned(F f) const {
    int64_t k = 0;
    const int64_t lo_k = lo(), hi_k = std::min(length, lo_k + shard);
    for (const auto& [off, len] : runs) {
      const int64_t a = std::max(k, lo_k), b = std::min(k + len, hi_k);
      for (int64_t i = a; i < b; ++i) f(i - lo_k, off + (i - k));
      k += len;
      if (k >= hi_k) break;
    }
  }
};

// The partitions of a rank's flat buffer (dense, then experts when the layout has EP ranks
// and the model experts), from its roles (gradient_sync.h: dense and expert runs).
std::vector<ZeroPartition> ZeroPartitions(const Runs& dense, const Runs& experts,
                                          const MeshGroups& groups);

template <typename T>
void ZeroPartition::Pack(const T* flat, T* packed) const {
  for (const auto& [off, len] : runs) {
    std::copy(flat + off, flat + off + len, packed);
    packed += len;
  }
}

template <typename T>
void ZeroPartition::Unpack(const T* packed, T* flat) const {
  for (const auto& [off, len] : runs) {
    std::copy(packed, packed + len, flat + off);
    packed += len;
  }
}

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_ZERO_PARTITION_H_
