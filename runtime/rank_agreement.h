// runtime/rank_agreement.h: what the ranks of one run must agree on before they train.
//
//   SATDAR_RETURN_IF_ERROR(CheckSameOnEveryRank(world, {{"--seed", "3"}, ...}, options));
//   SATDAR_RETURN_IF_ERROR(ShareStatus(world, 0, rank0_only_check, options));
//
// CheckSameOnEveryRank: every rank contributes (name, value) pairs in the same order; each
// compares them with rank 0's, so ranks started with another --seed or --config fail together
// (InvalidArgument, exit code 2) with a message naming the first entry that differs, the rank
// and both values, instead of training different models. ShareStatus: a check only one rank
// can make (the checkpoint folder's lock) ends every rank with that rank's error.
#ifndef SATDAR_RUNTIME_RANK_AGREEMENT_H_
#define SATDAR_RUNTIME_RANK_AGREEMENT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "comm/communicator.h"

namespace satdar::runtime {

using Fingerprint = std::vector<std::pair<std::string, std::string>>;

absl::Status CheckSameOnEveryRank(comm::Communicator* world, const Fingerprint& mine,
                                  const comm::CollectiveOptions& options);

// root's `status` on every rank (the others pass anything).
absl::Status ShareStatus(comm::Communicator* world, int root, const absl::Status& status,
                         const comm::CollectiveOptions& options);

}  // namespace satdar::runtime

#endif  // SATDAR_RUNTIME_RANK_AGREEMENT_H_
