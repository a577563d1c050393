// coordinator/coordinator_metrics.h: the coordinator's own Prometheus metrics (prometheus-cpp),
// served at /metrics on its --http address:
//   satdar_jobs{state}                 gauge, every job by state (PENDING ... CANCELLED)
//   satdar_workers{state}              gauge, workers by state (ALIVE, LOST)
//   satdar_worker_slots{state}         gauge, rank slots of live workers (busy, free)
//   satdar_job_restarts_total          counter, attempts beyond each job's first
//   satdar_queue_length                gauge, jobs waiting to be placed
//   satdar_scheduling_delay_seconds    histogram, submit (or a retry's backoff end) to placement
//   satdar_rpc_duration_seconds{method} histogram, per gRPC method (a stream: its lifetime)
//   satdar_worker_calls_denied_total{method} counter, worker calls refused PERMISSION_DENIED:
//                                      another worker's session, or ranks not assigned to it
#ifndef SATDAR_COORDINATOR_COORDINATOR_METRICS_H_
#define SATDAR_COORDINATOR_COORDINATOR_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace satdar::coordinator {

// What the control state counts (ControlState::Counts).
struct StateCounts {
  std::map<std::string, int64_t> jobs;     // state name -> jobs
  std::map<std::string, int64_t> workers;  // ALIVE / LOST -> workers
  int64_t restarts = 0;                    // sum over jobs of attempts beyond the first
  int64_t queue_length = 0;
  int64_t slots_busy = 0, slots_free = 0;
};

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  void SetState(const StateCounts& counts);
  void ObserveRpc(const std::string& method, double seconds);
  void ObserveSchedulingDelay(double seconds);
  void CountDenied(const std::string& method);
  std::string Serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Family<prometheus::Gauge>* workers_;
  prometheus::Family<prometheus::Gauge>* slots_;
  prometheus::Counter* restarts_;
  prometheus::Gauge* queue_;
  prometheus::Histogram* scheduling_;
  prometheus::Family<prometheus::Histogram>* rpc_;
  prometheus::Family<prometheus::Counter>* denied_;
  std::mutex mu_;  // guards restarts_seen_
  int64_t restarts_seen_ = 0;
};

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_COORDINATOR_METRICS_H_
