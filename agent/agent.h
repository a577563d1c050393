// agent/agent.h: `satdar worker`: registers its rank slots with the coordinator, heartbeats,
// runs the ranks it is assigned as child `satdar train` processes (each in its own process
// group, with the rank's flags and paths), uploads their output and progress, reports how
// they ended, and stops them when told (SIGTERM, then SIGKILL after a grace period).
//
// It kills its ranks itself when the coordinator has been unreachable for longer than the
// lease, so a partitioned worker never keeps writing checkpoints of a job that has moved on;
// and at start it kills what its previous life left running (work-dir/ranks.pids).
#ifndef SATDAR_AGENT_AGENT_H_
#define SATDAR_AGENT_AGENT_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "proto/rpc.h"

namespace satdar::agent {

struct AgentOptions {
  std::string coordinator;  // HOST:PORT
  std::string token_file;   // the worker token ("" when the coordinator needs none)
  rpc::ChannelOptions channel;
  int slots = 1;
  std::string work_dir;     // this worker's scratch space (configs, rank logs, pids)
  std::string shared_dir;   // storage every worker shares: <shared>/jobs/<job_id>/
  std::string data_root;    // train.data paths are relative to it
  std::string device = "cpu";
  std::string name;         // default: host name and pid
  std::string host = "127.0.0.1";  // where this worker's ranks listen (Gloo)
  std::string satdar;       // the satdar program the ranks run (default: this one)
  int stop_grace_ms = 5000;
  bool quiet = false;
};

// Runs until *stop becomes true (then stops every rank) or a fatal error: a bad flag or
// folder, a bad --tls-ca, a coordinator that disagrees about TLS (InvalidArgument), a
// --work-dir another worker holds (AlreadyExists, naming its pid: work-dir/worker.lock), a
// token the coordinator refuses (Unauthenticated or PermissionDenied; WorkerExitCodeFor makes
// both exit code 3, as for clients).
absl::Status RunWorker(const AgentOptions& options, const std::atomic<bool>* stop);

}  // namespace satdar::agent

#endif  // SATDAR_AGENT_AGENT_H_
