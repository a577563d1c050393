// coordinator/http_api.h: what the coordinator serves on its --http address (read-only):
//   /                      the dashboard (dashboard/: plain HTML, CSS and JavaScript, embedded)
//   /metrics               its own Prometheus metrics (coordinator_metrics.h)
//   /prometheus/targets    Prometheus HTTP service discovery: every running rank's /metrics,
//                          labelled job_id, rank and worker
//   /api/jobs              {"jobs": [...]} newest first; /api/jobs/<id>: {"job", "series"}
//   /api/workers           {"workers": [...]}
//   /healthz               "ok"
// Anything else is 404. The pages carry no secrets and need no token; bind --http to an
// address only the people and the Prometheus that should read it can reach.
#ifndef SATDAR_COORDINATOR_HTTP_API_H_
#define SATDAR_COORDINATOR_HTTP_API_H_

#include "coordinator/control_state.h"
#include "coordinator/coordinator_metrics.h"
#include "metrics/http_server.h"

namespace satdar::coordinator {

// Registers the handlers on *server (before it starts). state and metrics outlive it.
void AddHttpHandlers(ControlState* state, CoordinatorMetrics* metrics, metrics::HttpServer* server);

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_HTTP_API_H_
