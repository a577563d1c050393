// runtime/mesh_groups.h: the communicators of one rank of a dp x tp x pp x ep run, split from
// the world communicator (every rank must build them, in the same order).
//   tp, pp, ep, dp: the ranks that differ from this one only along that axis
//   data: the data-parallel replicas of this model piece (dp x ep ranks sharing tp and pp)
//   mp:   the pieces of this rank's replica (tp x pp x ep ranks sharing dp)
#ifndef SATDAR_RUNTIME_MESH_GROUPS_H_
#define SATDAR_RUNTIME_MESH_GROUPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/counting_communicator.h"
#include "comm/mesh.h"

namespace satdar::runtime {

struct MeshGroups {
  comm::MeshShape shape;
  comm::MeshCoord coord;
  int rank = 0;
  // Null for a group of one rank. Each counts the bytes this rank hands to it.
  std::unique_ptr<comm::CountingCommunicator> tp, pp, ep, dp, data, mp;
  int data_rank() const { return coord.dp * shape.ep + coord.ep; }
  int data_size() const { return shape.dp * shape.ep; }
};

// world null: one rank (every group null).
absl::StatusOr<MeshGroups> BuildMeshGroups(comm::Communicator* world,
                                           const comm::MeshShape& shape,
                                           const comm::CollectiveOptions& options);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_MESH_GROUPS_H_
