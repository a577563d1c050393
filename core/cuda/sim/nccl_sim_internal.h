// core/cuda/sim/nccl_sim_internal.h: what the parts of the NCCL simulator share: the error text
// of ncclGetLastError, the wire formats, and one communicator's state behind its ncclComm
// handle. nccl_sim.cc holds the API (and defines what is declared here), nccl_sim_transport.cc
// the sockets, listener and mesh, nccl_sim_collectives.cc the operations on streams. Internal to
// the simulator: nothing outside core/cuda/sim/nccl_sim*.cc includes it.
#ifndef SATDAR_CORE_CUDA_SIM_NCCL_SIM_INTERNAL_H_
#define SATDAR_CORE_CUDA_SIM_NCCL_SIM_INTERNAL_H_

#include <nccl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace satdar::cuda_sim {

inline constexpr uint32_t kIdMagic = 0x53494d4e;   // "SIMN": an id made by this simulator
inline constexpr uint32_t kMsgMagic = 0x4e43434c;  // framing check of every message

// ---------------------------------------------------------------------------------------------
// Errors: the text of ncclGetLastError.

// Sets the calling thread's last error (and the process's) to `msg`; returns `r`. Defined in
// nccl_sim.cc, with ncclGetLastError.
ncclResult_t Fail(ncclResult_t r, const std::string& msg);

// ---------------------------------------------------------------------------------------------
// Wire formats (host byte order: ranks run on machines of one architecture).

enum HelloKind : uint32_t { kJoin = 1, kMesh = 2 };

// The first bytes on every connection to a listener.
struct Hello {
  uint32_t magic = kIdMagic;
  uint32_t kind = 0;
  uint64_t key = 0;  // kJoin: the id's nonce; kMesh: the token of the accepting communicator
  int32_t rank = 0;
  int32_t nranks = 0;
  uint32_t ip = 0;    // kJoin: the joiner's listener
  uint32_t port = 0;  // network order in the low 16 bits
  uint64_t token = 0;
};

// Where a rank of a communicator accepts its mesh connections.
struct Addr {
  uint32_t ip = 0;
  uint32_t port = 0;
  uint64_t token = 0;
};

// What the layout of ncclUniqueId::internal holds.
struct IdBody {
  uint32_t magic;
  uint32_t ip;
  uint32_t port;
  uint32_t pad;
  uint64_t nonce;
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES, "id too large");

enum MsgKind : uint32_t { kColl = 1, kP2p = 2, kCts = 3, kCtrl = 4, kBye = 5 };

struct MsgHeader {
  uint32_t magic = kMsgMagic;
  uint32_t kind = 0;
  uint64_t seq = 0;
  int32_t op = 0;  // OpKind
  int32_t type = 0;
  int32_t red = 0;
  int32_t root = 0;
  uint64_t count = 0;
  uint64_t bytes = 0;  // the payload that follows
};

struct Msg {
  MsgHeader h;
  std::vector<char> data;
};

// ---------------------------------------------------------------------------------------------
// One communicator.

class Listener;

struct CommState {
  explicit CommState(bool b) : blocking(b) { wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }
  ~CommState() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
    for (auto& [r, fd] : incoming) close(fd);
    if (wake >= 0) close(wake);
  }
  void Setup(int r, int n) {
    rank = r;
    nranks = n;
    fds.assign(n, -1);
    inbox.assign(n, {});
    bye.assign(n, 0);
    closed.assign(n, 0);
    send_seq.assign(n, 0);
    recv_seq.assign(n, 0);
    send_mu.clear();
    for (int i = 0; i < n; ++i) send_mu.push_back(std::make_unique<std::mutex>());
  }

  const bool blocking;
  int wake = -1;

  std::mutex mu;  // guards everything below but the fds and the threads
  std::condition_variable cv;
  int rank = -1;
  int nranks = 0;
  ncclResult_t async = ncclInProgress;
  std::string error;
  std::atomic<bool> closing{false};  // aborted or destroyed: every wait gives up
  bool finalized = false;
  std::vector<std::deque<Msg>> inbox;  // by sending rank (self included)
  std::vector<char> bye, closed;
  std::map<int, int> incoming;  // mesh connections accepted during setup, by rank
  uint64_t coll_seq = 0, ctrl_seq = 0;
  std::vector<uint64_t> send_seq, recv_seq;
  int outstanding = 0;  // operations queued on streams and not finished

  std::vector<int> fds;  // by rank; -1 for self; written before the reader starts
  std::vector<std::unique_ptr<std::mutex>> send_mu;
  uint64_t token = 0;  // the listener's route to this communicator during setup
  Listener* listener = nullptr;
  uint64_t error_stamp = 0;  // when `error` was set (see Fail)

  std::mutex jobs_mu;
  std::vector<std::thread> jobs;  // init / split / finalize work of a non-blocking communicator
  std::thread reader;
};

// Sets the communicator's async error; the first one stays, and none once it is closing.
void SetAsync(CommState* s, ncclResult_t r, const std::string& msg);

// Ends the communicator's ncclInProgress (init, split or finalize done).
void SetReady(CommState* s);

}  // namespace satdar::cuda_sim

// The handle: a communicator's state, shared with the stream work still queued on it.
struct ncclComm {
  std::shared_ptr<satdar::cuda_sim::CommState> s;
};

#endif  // SATDAR_CORE_CUDA_SIM_NCCL_SIM_INTERNAL_H_
