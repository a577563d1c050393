// metrics/rank_exporter.h: serves a registry at /metrics over HTTP with prometheus-cpp's
// civetweb Exposer (its own threads: a slow or stuck scraper never touches the caller's).
// Every other path answers 404.
//
//   SATDAR_ASSIGN_OR_RETURN(auto exporter, RankExporter::Start("127.0.0.1:0", registry));
//   exporter->address();  // "127.0.0.1:43817", the port actually bound
#ifndef SATDAR_METRICS_RANK_EXPORTER_H_
#define SATDAR_METRICS_RANK_EXPORTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace satdar::metrics {

class RankExporter {
 public:
  // listen: HOST:PORT (port 0 binds a free one). InvalidArgument for a malformed address,
  // Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<RankExporter>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Registry> registry);
  ~RankExporter();  // stops serving (waits for a scrape in progress)

  const std::string& address() const { return address_; }

 private:
  RankExporter() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::string address_;
};

}  // namespace satdar::metrics

#endif  // SATDAR_METRICS_RANK_EXPORTER_H_
