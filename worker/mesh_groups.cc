#include "worker/mesh_groups.h"

#include "core/check.h"

namespace satdar::worker {

absl::StatusOr<MeshGroups> BuildMeshGroups(parallel::Communicator* world,
                                           const parallel::MeshShape& shape,
                                           const parallel::CollectiveOptions& options) {
  MeshGroups g;
  g.shape = shape;
  if (world == nullptr) {
    SATDAR_CHECK(shape.size() == 1) << "a " << shape.ToString() << " run needs a world";
    return g;
  }
  SATDAR_RETURN_IF_ERROR(parallel::ValidateMesh(shape, world->size()));
  g.rank = world->rank();
  g.coord = parallel::CoordOf(shape, g.rank);
  auto split = [&](int color, int key, int size,
                   std::unique_ptr<parallel::CountingCommunicator>* out) -> absl::Status {
    // Every rank takes part in every split, even when its group would have one rank.
    SATDAR_ASSIGN_OR_RETURN(auto comm, world->Split(color, key, options));
    if (size > 1) *out = std::make_unique<parallel::CountingCommunicator>(std::move(comm));
    return absl::OkStatus();
  };
  for (const char* axis : {"tp", "pp", "ep", "dp"}) {
    const parallel::SplitKey k = parallel::GroupAlong(shape, g.rank, axis);
    std::unique_ptr<parallel::CountingCommunicator>* out =
        axis[0] == 't' ? &g.tp : axis[0] == 'p' ? &g.pp : axis[0] == 'e' ? &g.ep : &g.dp;
    const int size = axis[0] == 't'   ? shape.tp
                     : axis[0] == 'p' ? shape.pp
                     : axis[0] == 'e' ? shape.ep
                                      : shape.dp;
    SATDAR_RETURN_IF_ERROR(split(k.color, k.key, size, out));
  }
  const parallel::MeshCoord& c = g.coord;
  SATDAR_RETURN_IF_ERROR(split(c.pp * shape.tp + c.tp, g.data_rank(), g.data_size(), &g.data));
  SATDAR_RETURN_IF_ERROR(split(c.dp, g.rank, shape.tp * shape.pp * shape.ep, &g.mp));
  return g;
}

}  // namespace satdar::worker
