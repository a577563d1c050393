// comm/mesh.h: the process mesh dp x tp x pp x ep. Global rank = ((dp * pp + pp_index) ...)
// with tensor parallelism innermost (neighbouring ranks share a TP group, as in Megatron-LM's
// default order), then expert, then pipeline, then data parallelism outermost.
#ifndef SATDAR_COMM_MESH_H_
#define SATDAR_COMM_MESH_H_

#include <string>

#include "absl/status/statusor.h"

namespace satdar::comm {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1, ep = 1;
  int size() const { return dp * tp * pp * ep; }
  std::string ToString() const;  // "dp=2 tp=1 pp=2 ep=1"
};

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0, ep = 0;
};

// The shape must be positive and multiply out to world_size (the error names the flags).
absl::Status ValidateMesh(const MeshShape& shape, int world_size);

MeshCoord CoordOf(const MeshShape& shape, int rank);
int RankOf(const MeshShape& shape, const MeshCoord& coord);

// Color and key for Communicator::Split that put a rank with every rank sharing all
// coordinates but `axis` ("dp", "tp", "pp" or "ep"), ordered along that axis.
struct SplitKey {
  int color, key;
};
SplitKey GroupAlong(const MeshShape& shape, int rank, const std::string& axis);

}  // namespace satdar::comm

#endif  // SATDAR_COMM_MESH_H_
