#include "comm/mesh.h"

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::comm {

std::string MeshShape::ToString() const {
  return absl::StrCat("dp=", dp, " tp=", tp, " pp=", pp, " ep=", ep);
}

absl::Status ValidateMesh(const MeshShape& s, int world_size) {
  if (s.dp < 1 || s.tp < 1 || s.pp < 1 || s.ep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh dp, tp, pp and ep must be >= 1, got ", s.ToString()));
  }
  if (s.size() != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the world has ", world_size, " ranks but mesh dp x tp x pp x ep = ", s.ToString(),
        " = ", s.size()));
  }
  return absl::OkStatus();
}

MeshCoord CoordOf(const MeshShape& s, int rank) {
  SATDAR_CHECK(rank >= 0 && rank < s.size()) << "rank " << rank << " outside " << s.ToString();
  MeshCoord c;
  c.tp = rank % s.tp;
  rank /= s.tp;
  c.ep = rank % s.ep;
  rank /= s.ep;
  c.pp = rank % s.pp;
  c.dp = rank / s.pp;
  return c;
}

int RankOf(const MeshShape& s, const MeshCoord& c) {
  return ((c.dp * s.pp + c.pp) * s.ep + c.ep) * s.tp + c.tp;
}

SplitKey GroupAlong(const MeshShape& s, int rank, const std::string& axis) {
  MeshCoord c = CoordOf(s, rank);
  int key;
  if (axis == "dp") {
    key = c.dp;
    c.dp = 0;
  } else if (axis == "tp") {
    key = c.tp;
    c.tp = 0;
  } else if (axis == "pp") {
    key = c.pp;
    c.pp = 0;
  } else {
    SATDAR_CHECK(axis == "ep") << "unknown mesh axis " << axis;
    key = c.ep;
    c.ep = 0;
  }
  return {RankOf(s, c), key};
}

}  // namespace satdar::comm
