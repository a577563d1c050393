// Compiled with -fexceptions: the Exposer's constructor throws (CivetException) when it cannot
// bind, and this file turns that into a Status.
#include "metrics/rank_exporter.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/address.h"
#include "core/check.h"
#include "prometheus/exposer.h"

namespace satdar::metrics {

absl::StatusOr<std::unique_ptr<RankExporter>> RankExporter::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry) {
  std::string host;
  SATDAR_RETURN_IF_ERROR(core::SplitHostPort(listen, "metrics address", &host, nullptr));
  std::unique_ptr<RankExporter> e(new RankExporter());
  e->registry_ = std::move(registry);
  try {
    // civetweb: one listening thread plus eight request threads; no document root, so any
    // path but /metrics is 404. A connection holds a thread while it is open, so a request
    // slower than 2 s is cut off, and a few slow or reconnecting clients leave the scraper
    // room (a scrape is answered in milliseconds).
    e->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", "8", "request_timeout_ms", "2000"});
  } catch (const std::exception& ex) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, ": ", ex.what()));
  }
  e->exposer_->RegisterCollectable(e->registry_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen));
  e->address_ = absl::StrCat(host, ":", ports[0]);
  return e;
}

RankExporter::~RankExporter() = default;

}  // namespace satdar::metrics
