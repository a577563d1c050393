// core/cuda/sim/nccl_sim_transport.h: the NCCL simulator's transport (nccl_sim_transport.cc):
// the process's TCP listener (the root of its ids), setting communicators' meshes up and down,
// and whole messages between ranks.
#ifndef SATDAR_CORE_CUDA_SIM_NCCL_SIM_TRANSPORT_H_
#define SATDAR_CORE_CUDA_SIM_NCCL_SIM_TRANSPORT_H_

#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda/sim/nccl_sim_internal.h"

namespace satdar::cuda_sim {

// ---------------------------------------------------------------------------------------------
// The process's listener: the root of the ids it made, and the mesh connections of its
// communicators during setup.

struct Rendezvous {
  std::mutex mu;
  std::condition_variable cv;
  int nranks = -1;
  int first_rank = -1;
  std::vector<Addr> table;
  std::vector<char> present;
  int joined = 0;
  bool done = false;
  std::string error;
};

class Listener {
 public:
  // The listener of this process, started on first use (again in a forked child).
  static Listener* Get(std::string* err);

  uint32_t ip() const { return ip_; }
  uint32_t port() const { return port_; }
  void AddRoot(uint64_t nonce) {
    std::lock_guard<std::mutex> l(mu_);
    roots_[nonce] = std::make_shared<Rendezvous>();
  }
  void AddRoute(uint64_t token, const std::shared_ptr<CommState>& s) {
    std::lock_guard<std::mutex> l(mu_);
    routes_[token] = s;
  }
  void RemoveRoute(uint64_t token) {
    std::lock_guard<std::mutex> l(mu_);
    routes_.erase(token);
  }

 private:
  bool Start(std::string* err);
  void AcceptLoop();
  void Handle(int fd);
  void Join(int fd, const Hello& h);

  int fd_ = -1;
  uint32_t ip_ = 0, port_ = 0;
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Rendezvous>> roots_;
  std::map<uint64_t, std::weak_ptr<CommState>> routes_;
};

// ncclCommInitRankConfig's work: join at the id's root, get the table, connect.
ncclResult_t InitJob(CommState* s, IdBody id);

// ncclCommSplit's work: exchange (color, key, listener) over the parent, then connect the child.
ncclResult_t SplitJob(std::shared_ptr<CommState> parent, std::shared_ptr<CommState> child,
                      int color, int key, uint64_t seq, bool parent_in_progress);

// Ends `s`: every wait gives up, the threads are joined, peers get a goodbye, the sockets shut.
// The state itself lives on while stream work still holds it.
void Close(CommState* s, bool abort);

// ---------------------------------------------------------------------------------------------
// Messages between ranks.

// Sends one message to `peer` (to the own inbox when peer is this rank). False when the
// communicator is closing or the connection is gone.
bool Post(CommState* s, int peer, MsgHeader h, const void* data);

// Waits for the message (kind, seq) from `peer`. False when the communicator closes first (or
// `cancel` says so; it is polled). Like NCCL, it never gives up on a silent peer by itself.
bool Take(CommState* s, int peer, uint32_t kind, uint64_t seq, Msg* out,
          const std::function<bool()>& cancel = nullptr);

// Waits (as NCCL's kernels do) until the communicator is aborted or destroyed.
void HangUntilClosed(CommState* s);

}  // namespace satdar::cuda_sim

#endif  // SATDAR_CORE_CUDA_SIM_NCCL_SIM_TRANSPORT_H_
