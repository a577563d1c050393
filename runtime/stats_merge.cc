#include "runtime/stats_merge.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include "core/check.h"

namespace satdar::runtime {

namespace {

using Json = nlohmann::json;

// Element-wise sum of two arrays of numbers nested alike (a missing side counts as zero).
Json Add(const Json& a, const Json& b) {
  if (a.is_null()) return b;
  if (b.is_null()) return a;
  if (a.is_number() && b.is_number()) {
    if (a.is_number_integer() && b.is_number_integer()) return a.get<int64_t>() + b.get<int64_t>();
    return a.get<double>() + b.get<double>();
  }
  if (a.is_array() && b.is_array()) {
    Json out = Json::array();
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      out.push_back(Add(i < a.size() ? a[i] : Json(), i < b.size() ? b[i] : Json()));
    }
    return out;
  }
  return a;
}

// Per index the first non-null value.
Json FirstPresent(const Json& a, const Json& b) {
  if (!a.is_array() || !b.is_array()) return a.is_null() ? b : a;
  Json out = Json::array();
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const Json x = i < a.size() ? a[i] : Json(), y = i < b.size() ? b[i] : Json();
    out.push_back(x.is_null() ? y : x);
  }
  return out;
}

// Rows [layer][local KV head] of the TP ranks, side by side: [layer][all KV heads].
Json Beside(const std::vector<const Json*>& parts) {
  Json out = Json::array();
  size_t rows = 0;
  for (const Json* p : parts) rows = std::max(rows, p->is_array() ? p->size() : size_t{0});
  for (size_t r = 0; r < rows; ++r) {
    Json row = Json::array();
    for (const Json* p : parts) {
      if (!p->is_array() || r >= p->size() || !(*p)[r].is_array()) continue;
      for (const Json& v : (*p)[r]) row.push_back(v);
    }
    out.push_back(row);
  }
  return out;
}

const std::set<std::string>& DepthKeys() {
  static const std::set<std::string> k = {"attnres_depth_weights", "transparent_depth_weights",
                                          "dar_depth_weights", "dar_mix", "dar_transport",
                                          "dar_write"};
  return k;
}

// sum_k w_k x_k over instances nested alike (nulls stay null).
Json Weighted(const std::vector<const Json*>& xs, const std::vector<double>& w, bool sum) {
  const Json& first = *xs.front();
  if (first.is_number()) {
    double acc = 0, total = 0;
    for (size_t k = 0; k < xs.size(); ++k) {
      if (!xs[k]->is_number()) continue;
      acc += (sum ? 1.0 : w[k]) * xs[k]->get<double>();
      total += w[k];
    }
    if (sum) {
      return first.is_number_integer() ? Json(static_cast<int64_t>(acc)) : Json(acc);
    }
    return total > 0 ? Json(acc / total) : Json(nullptr);
  }
  if (first.is_array()) {
    Json out = Json::array();
    for (size_t i = 0; i < first.size(); ++i) {
      std::vector<const Json*> column;
      std::vector<double> cw;
      for (size_t k = 0; k < xs.size(); ++k) {
        if (xs[k]->is_array() && i < xs[k]->size()) {
          column.push_back(&(*xs[k])[i]);
          cw.push_back(w[k]);
        }
      }
      out.push_back(Weighted(column, cw, sum));
    }
    return out;
  }
  return first;
}

}  // namespace

Json MergeInstanceStats(const std::vector<Json>& instances, const std::vector<double>& weights) {
  if (instances.empty()) return Json::object();
  Json out = Json::object();
  for (const auto& [key, unused] : instances.front().items()) {
    std::vector<const Json*> xs;
    std::vector<double> w;
    for (size_t k = 0; k < instances.size(); ++k) {
      if (!instances[k].contains(key) || weights[k] <= 0) continue;
      xs.push_back(&instances[k][key]);
      w.push_back(weights[k]);
    }
    out[key] = xs.empty() ? instances.front()[key] : Weighted(xs, w, key.rfind("moe_", 0) == 0);
  }
  return out;
}

Json MergeStats(const std::vector<StatsPiece>& in, bool rows_split) {
  if (in.empty()) return Json::object();
  std::vector<const StatsPiece*> pieces;
  for (const StatsPiece& p : in) pieces.push_back(&p);
  std::sort(pieces.begin(), pieces.end(), [](const StatsPiece* a, const StatsPiece* b) {
    return std::tie(a->pp, a->ep, a->tp) < std::tie(b->pp, b->ep, b->tp);
  });
  int stages = 0;
  for (const StatsPiece* p : pieces) stages = std::max(stages, p->pp + 1);
  Json out = Json::object();
  std::set<std::string> keys;
  for (const StatsPiece* p : pieces) {
    if (!p->stats.is_object()) continue;
    for (const auto& [k, v] : p->stats.items()) keys.insert(k);
  }
  auto value = [](const StatsPiece* p, const std::string& key) {
    return p->stats.is_object() && p->stats.contains(key) ? p->stats[key] : Json();
  };
  for (const std::string& key : keys) {
    if (DepthKeys().count(key)) {
      Json all = Json::array();
      for (int s = 0; s < stages; ++s) {
        // Replicated over TP, or under sequence parallelism each TP rank's mean over its
        // equal share of the tokens: the mean of the TP ranks' means.
        std::vector<Json> held;
        for (const StatsPiece* p : pieces) {
          if (p->pp == s && p->ep == 0 && (rows_split || p->tp == 0)) held.push_back(value(p, key));
        }
        std::vector<const Json*> xs;
        for (const Json& v : held) {
          if (v.is_array()) xs.push_back(&v);
        }
        if (xs.empty()) continue;
        const Json mean = Weighted(xs, std::vector<double>(xs.size(), 1.0), /*sum=*/false);
        for (const Json& e : mean) all.push_back(e);
      }
      out[key] = all;
    } else if (key.rfind("satformer_gate_", 0) == 0) {
      Json sum;
      for (int s = 0; s < stages; ++s) {
        std::vector<const Json*> tp_parts;
        std::vector<Json> held;
        held.reserve(pieces.size());
        for (const StatsPiece* p : pieces) {
          if (p->pp != s || p->ep != 0) continue;
          held.push_back(value(p, key));
          tp_parts.push_back(&held.back());
        }
        if (!tp_parts.empty()) sum = Add(sum, Beside(tp_parts));
      }
      out[key] = sum;
    } else if (key.rfind("moe_", 0) == 0) {
      Json sum;
      for (const StatsPiece* p : pieces) {
        if (p->tp == 0) sum = Add(sum, value(p, key));
      }
      out[key] = sum;
    } else if (key.rfind("resformer_lambda", 0) == 0) {
      Json first;
      for (const StatsPiece* p : pieces) {
        if (p->tp == 0 && p->ep == 0) first = FirstPresent(first, value(p, key));
      }
      out[key] = first;
    } else {
      out[key] = value(pieces.front(), key);
    }
  }
  return out;
}

absl::StatusOr<nlohmann::json> GatherStats(const MeshGroups& g,
                                           const std::vector<nlohmann::json>& mine,
                                           bool sequence_parallel,
                                           const comm::CollectiveOptions& options) {
  using Json = nlohmann::json;
  Json list = Json::array();
  for (size_t c = 0; c < mine.size(); ++c) {
    const int stage = static_cast<int>(c) * g.shape.pp + g.coord.pp;
    list.push_back({{"tp", g.coord.tp}, {"pp", stage}, {"ep", g.coord.ep}, {"stats", mine[c]}});
  }
  const std::string text = list.dump();
  const int n = g.mp->size();
  std::vector<int64_t> lengths(n);
  const int64_t length = static_cast<int64_t>(text.size());
  SATDAR_RETURN_IF_ERROR(
      g.mp->AllGather(&length, lengths.data(), 1, core::DType::kI64, options)->Wait());
  const int64_t words = (*std::max_element(lengths.begin(), lengths.end()) + 7) / 8;
  std::vector<int64_t> send(words, 0), all(words * n);
  std::memcpy(send.data(), text.data(), text.size());
  SATDAR_RETURN_IF_ERROR(
      g.mp->AllGather(send.data(), all.data(), words, core::DType::kI64, options)->Wait());
  std::vector<StatsPiece> pieces;
  for (int r = 0; r < n; ++r) {
    const char* bytes = reinterpret_cast<const char*>(all.data() + r * words);
    const Json got = Json::parse(std::string(bytes, lengths[r]), nullptr, false);
    if (!got.is_array()) return absl::InternalError("statistics: a rank sent an unreadable list");
    for (const Json& j : got) {
      if (!j.is_object()) return absl::InternalError("statistics: a rank sent an unreadable object");
      pieces.push_back({j.value("tp", 0), j.value("pp", 0), j.value("ep", 0), j["stats"]});
    }
  }
  return MergeStats(pieces, sequence_parallel);
}

}  // namespace satdar::runtime
