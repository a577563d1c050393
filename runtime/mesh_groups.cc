#include "runtime/mesh_groups.h"

#include "core/check.h"

namespace satdar::runtime {

absl::StatusOr<MeshGroups> BuildMeshGroups(comm::Communicator* world,
                                           const comm::MeshShape& shape,
                                           const comm::CollectiveOptions& options) {
  MeshGroups g;
  g.shape = shape;
  if (world == nullptr) {
    SATDAR_CHECK(shape.size() == 1) << "a " << shape.ToString() << " run needs a world";
    return g;
  }
  SATDAR_RETURN_IF_ERROR(comm::ValidateMesh(shape, world->size()));
  g.rank = world->rank();
  g.coord = comm::CoordOf(shape, g.rank);
  auto split = [&](int color, int key, int size,
                   std::unique_ptr<comm::CountingCommunicator>* out) -> absl::Status {
    // Every rank takes part in every split, even when its group would have one rank.
    SATDAR_ASSIGN_OR_RETURN(auto comm, world->Split(color, key, options));
    if (size > 1) *out = std::make_unique<comm::CountingCommunicator>(std::move(comm));
    return absl::OkStatus();
  };
  const struct {
    const char* axis;
    int size;
    std::unique_ptr<comm::CountingCommunicator>* out;
  } axes[] = {{"tp", shape.tp, &g.tp}, {"pp", shape.pp, &g.pp}, {"ep", shape.ep, &g.ep},
              {"dp", shape.dp, &g.dp}};
  for (const auto& a : axes) {
    const comm::SplitKey k = comm::GroupAlong(shape, g.rank, a.axis);
    SATDAR_RETURN_IF_ERROR(split(k.color, k.key, a.size, a.out));
  }
  const comm::MeshCoord& c = g.coord;
  SATDAR_RETURN_IF_ERROR(split(c.pp * shape.tp + c.tp, g.data_rank(), g.data_size(), &g.data));
  SATDAR_RETURN_IF_ERROR(split(c.dp, g.rank, shape.tp * shape.pp * shape.ep, &g.mp));
  return g;
}

}  // namespace satdar::runtime
