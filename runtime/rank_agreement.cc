#include "runtime/rank_agreement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "nlohmann/json.hpp"

namespace satdar::runtime {

namespace {

// Every rank's string, in rank order (all-gathered as 64-bit words).
absl::StatusOr<std::vector<std::string>> AllGatherStrings(comm::Communicator* world,
                                                          const std::string& mine,
                                                          const comm::CollectiveOptions& o) {
  const int n = world->size();
  int64_t length = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lengths(n);
  SATDAR_RETURN_IF_ERROR(
      world->AllGather(&length, lengths.data(), 1, core::DType::kI64, o)->Wait());
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const size_t words = static_cast<size_t>(longest + 7) / 8;
  std::vector<int64_t> send(words, 0), all(words * n, 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  SATDAR_RETURN_IF_ERROR(
      world->AllGather(send.data(), all.data(), words, core::DType::kI64, o)->Wait());
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) {
    const char* p = reinterpret_cast<const char*>(all.data() + r * words);
    out[r].assign(p, static_cast<size_t>(std::min<int64_t>(lengths[r], longest)));
  }
  return out;
}

}  // namespace

absl::Status CheckSameOnEveryRank(comm::Communicator* world, const Fingerprint& mine,
                                  const comm::CollectiveOptions& options) {
  if (world == nullptr || world->size() == 1) return absl::OkStatus();
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [name, value] : mine) j.push_back({name, value});
  SATDAR_ASSIGN_OR_RETURN(std::vector<std::string> all,
                          AllGatherStrings(world, j.dump(), options));
  // Every rank reports the first difference it finds in rank order, so all name the same one.
  for (int r = 1; r < static_cast<int>(all.size()); ++r) {
    if (all[r] == all[0]) continue;
    const nlohmann::json a = nlohmann::json::parse(all[0], nullptr, false);
    const nlohmann::json b = nlohmann::json::parse(all[r], nullptr, false);
    if (a.is_array() && b.is_array()) {
      for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        if (a[i] == b[i]) continue;
        auto pair = [](const nlohmann::json& e) {
          return e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string();
        };
        if (!pair(a[i]) || !pair(b[i])) break;
        const std::string name = a[i][0].get<std::string>();
        const std::string va = a[i][1].get<std::string>(), vb = b[i][1].get<std::string>();
        const bool long_values = va.size() > 80 || vb.size() > 80;
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " was started with a different ", name, " than rank 0",
            long_values ? "" : absl::StrCat(" (", vb, " instead of ", va, ")"),
            "; every rank of a run must get the same config and flags"));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", r, " was started with other flags than rank 0 (a different satdar version?)"));
  }
  return absl::OkStatus();
}

absl::Status ShareStatus(comm::Communicator* world, int root, const absl::Status& status,
                         const comm::CollectiveOptions& options) {
  if (world == nullptr || world->size() == 1) return status;
  int64_t code = static_cast<int64_t>(status.code());
  SATDAR_RETURN_IF_ERROR(world->Broadcast(&code, 1, core::DType::kI64, root, options)->Wait());
  if (code == 0) return absl::OkStatus();
  SATDAR_ASSIGN_OR_RETURN(
      std::vector<std::string> messages,
      AllGatherStrings(world, world->rank() == root ? std::string(status.message()) : "",
                       options));
  return absl::Status(static_cast<absl::StatusCode>(code),
                      world->rank() == root ? std::string(status.message())
                                            : absl::StrCat("rank ", root, ": ", messages[root]));
}

}  // namespace satdar::runtime
