// agent/grpc_kv_store.h: the rendezvous store of one attempt of a job, kept by the
// coordinator (WorkerService.KvSet/KvGet), so the ranks of a job meet without a shared folder:
// Gloo's rendezvous and NCCL's unique id go through it. `satdar train --coordinator ADDR
// --job-id J --attempt A` uses it.
#ifndef SATDAR_AGENT_GRPC_KV_STORE_H_
#define SATDAR_AGENT_GRPC_KV_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/kv_store.h"
#include "proto/rpc.h"

namespace satdar::agent {

struct CoordinatorStoreOptions {
  std::string address;
  std::string token;  // the worker token
  std::string session;  // the worker's session (SATDAR_WORKER_SESSION; rpc::SetWorkerSession)
  rpc::ChannelOptions channel;
  std::string job_id;
  int attempt = 0;
};

absl::StatusOr<std::unique_ptr<comm::KvStore>> OpenCoordinatorStore(
    const CoordinatorStoreOptions& options);

}  // namespace satdar::agent

#endif  // SATDAR_AGENT_GRPC_KV_STORE_H_
