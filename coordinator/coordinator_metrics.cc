#include "coordinator/coordinator_metrics.h"

#include "prometheus/text_serializer.h"

namespace satdar::coordinator {

namespace {
using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
}  // namespace

CoordinatorMetrics::CoordinatorMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  jobs_ = &BuildGauge().Name("satdar_jobs").Help("Jobs by state").Register(r);
  for (const char* s : {"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}) {
    jobs_->Add({{"state", s}});
  }
  workers_ = &BuildGauge().Name("satdar_workers").Help("Workers by state").Register(r);
  for (const char* s : {"ALIVE", "LOST"}) workers_->Add({{"state", s}});
  slots_ = &BuildGauge().Name("satdar_worker_slots").Help("Rank slots of live workers").Register(r);
  restarts_ = &BuildCounter()
                   .Name("satdar_job_restarts_total")
                   .Help("Job attempts started after a failed one")
                   .Register(r)
                   .Add({});
  queue_ = &BuildGauge()
                .Name("satdar_queue_length")
                .Help("Jobs waiting to be placed (PENDING)")
                .Register(r)
                .Add({});
  scheduling_ = &BuildHistogram()
                     .Name("satdar_scheduling_delay_seconds")
                     .Help("From submit (or a retry's backoff end) to the gang's placement")
                     .Register(r)
                     .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                                                                      30, 60, 300, 900, 3600});
  rpc_ = &BuildHistogram()
              .Name("satdar_rpc_duration_seconds")
              .Help("gRPC calls served, by method (a stream counts its whole life)")
              .Register(r);
  denied_ = &BuildCounter()
                 .Name("satdar_worker_calls_denied_total")
                 .Help("Worker calls refused PERMISSION_DENIED (another worker's session, or "
                       "ranks and attempts not assigned to the caller), by method")
                 .Register(r);
  for (const char* m : {"Heartbeat", "ReportExit", "UploadLogs", "KvSet", "KvGet",
                        "RenewRankLease"}) {
    denied_->Add({{"method", m}});
  }
}

void CoordinatorMetrics::SetState(const StateCounts& c) {
  for (const char* s : {"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}) {
    auto it = c.jobs.find(s);
    jobs_->Add({{"state", s}}).Set(it == c.jobs.end() ? 0.0 : static_cast<double>(it->second));
  }
  for (const char* s : {"ALIVE", "LOST"}) {
    auto it = c.workers.find(s);
    workers_->Add({{"state", s}}).Set(it == c.workers.end() ? 0.0 : static_cast<double>(it->second));
  }
  slots_->Add({{"state", "busy"}}).Set(static_cast<double>(c.slots_busy));
  slots_->Add({{"state", "free"}}).Set(static_cast<double>(c.slots_free));
  queue_->Set(static_cast<double>(c.queue_length));
  std::lock_guard<std::mutex> lock(mu_);
  // The state's count only grows (attempts are never forgotten); the counter follows it, and a
  // restarted coordinator starts from the recovered total.
  if (c.restarts > restarts_seen_) {
    restarts_->Increment(static_cast<double>(c.restarts - restarts_seen_));
    restarts_seen_ = c.restarts;
  }
}

void CoordinatorMetrics::ObserveRpc(const std::string& method, double seconds) {
  // Family::Add returns the method's histogram once it exists (under the family's own lock).
  rpc_->Add({{"method", method}},
            prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                    0.05, 0.1, 0.25, 1, 10, 60})
      .Observe(seconds);
}

void CoordinatorMetrics::CountDenied(const std::string& method) {
  denied_->Add({{"method", method}}).Increment();
}

void CoordinatorMetrics::ObserveSchedulingDelay(double seconds) { scheduling_->Observe(seconds); }

std::string CoordinatorMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace satdar::coordinator
