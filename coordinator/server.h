// coordinator/server.h: `satdar coordinator`: the gRPC server over ControlState, with the
// standard health service and server reflection, bearer-token checks, optional TLS, RPC
// latency metrics; with `http` the pages of http_api.h; and DIR/coordinator.json written once
// it serves ({"grpc": "HOST:PORT", "http": "HOST:PORT" or null}).
#ifndef SATDAR_COORDINATOR_SERVER_H_
#define SATDAR_COORDINATOR_SERVER_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace satdar::coordinator {

struct ServerOptions {
  std::string listen;        // HOST:PORT; port 0 binds a free one
  std::string http;          // HOST:PORT for the dashboard, /metrics, service discovery; "": none
  std::string state_dir;
  std::string client_token;  // empty: users need no token
  std::string worker_token;  // empty: workers need no token
  std::string tls_cert, tls_key;  // PEM files; both or neither
  int64_t heartbeat_ms = 1000;
  int64_t lease_ms = 10000;
  bool quiet = false;
};

// Serves until *stop becomes true (a signal handler sets it). Errors: bad flags or files,
// bad TLS files (rpc::LoadTlsKeyPair), a lost or foreign state.db (Store::Open: all
// InvalidArgument); a state folder another coordinator holds or a port another process serves
// (AlreadyExists: gRPC binds without SO_REUSEPORT, so two coordinators never share a port);
// a port that cannot be bound for another reason (Unavailable). Without tokens on an address
// that is not loopback it warns on stderr.
absl::Status RunCoordinator(const ServerOptions& options, const std::atomic<bool>* stop);

}  // namespace satdar::coordinator

#endif  // SATDAR_COORDINATOR_SERVER_H_
