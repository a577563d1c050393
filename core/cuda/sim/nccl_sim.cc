// core/cuda/sim/nccl_sim.cc: the NCCL subset of include/nccl.h on the CPU, for the CUDA simulator
// build. Ranks may live in one process (threads) or in several, on one machine or (with
// SATDAR_NCCL_SIM_ADDR set to a reachable IPv4 address of each host) on several.
//
// Transport. ncclGetUniqueId starts, once per process, a TCP listener with an accept thread and
// writes its address and a random nonce into the id. Each rank of ncclCommInitRankConfig joins
// at that listener (the root): the root checks nranks and the ranks, and once all nranks have
// joined it sends every rank the table of the ranks' own listeners. Each pair of ranks then
// holds one TCP connection (the lower rank accepts, the higher one connects). ncclCommSplit
// exchanges (color, key, listener) over the parent's connections and builds the child's mesh
// the same way. Each communicator has a reader thread that moves whole messages from its
// sockets into per-peer inboxes (so a sender never waits for a reader), and notices a peer
// whose connection closes without a goodbye (a dead process): the communicator's async error
// becomes ncclRemoteError.
//
// Semantics. Every operation is queued on its cudaStream_t (Enqueue) and moves data when the
// stream reaches it. Collectives and point-to-point calls are matched by issue order, as NCCL's
// are (collective n of a rank meets collective n of every other; the k-th Send from a to b
// meets the k-th Recv on b from a) and the simulator checks that the matched calls agree
// (operation, type, count, op, root; bytes for Send/Recv): a mismatch is ncclInvalidUsage,
// reported with Report. A Send completes only once its Recv is posted (as NCCL's do), so a
// ring of Send-then-Recv outside a group hangs as it would on GPUs, and inside a group does
// not. Reductions are computed by every rank from all contributions in rank order:
//   acc = x_0; acc = op(acc, x_1); ...; acc = op(acc, x_{n-1}); for ncclAvg then acc / n,
// in the type itself (wrapping for integers; bf16: each step in f32, rounded to nearest even
// to bf16), so every rank gets the same bits. (NCCL's own ring/tree order differs; ncclAvg of
// floats on NCCL pre-multiplies by 1/n.) As on NCCL, an operation that cannot complete (a dead
// or missing peer, a mismatch) does not finish on its stream until the communicator is aborted
// (ncclCommAbort) or destroyed; the error shows in ncclCommGetAsyncError. An aborted or
// destroyed communicator says goodbye to its peers, so a peer's abort is no error on the others
// (their operations that needed it wait, as on NCCL); only a connection that closes without one
// is.
//
// Groups: the operations of a group (or a lone call) on one (communicator, stream) become one
// stream item that posts its receives, then sends, then receives. A call that fails inside a
// group fails the group: ncclGroupEnd returns its error and queues nothing.
// Non-blocking communicators (config.blocking = 0): init, split and finalize return
// ncclInProgress and finish on a thread; ncclCommGetAsyncError says ncclInProgress until then
// (the parent's too, during a split), and other calls on it meanwhile are ncclInvalidUsage.
// Collectives return ncclSuccess at once. ncclCommDestroy first waits for the queued
// operations (as ncclCommFinalize does).
// Cost: every rank sends its whole contribution to every other (n (n - 1) messages per
// collective) and each message is copied through the reader: meant for tests, not speed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <nccl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda/sim/sim_runtime.h"

namespace satdar::cuda_sim {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kIdMagic = 0x53494d4e;   // "SIMN": an id made by this simulator
constexpr uint32_t kMsgMagic = 0x4e43434c;  // framing check of every message

// ---------------------------------------------------------------------------------------------
// Errors: the text of ncclGetLastError.

std::mutex g_error_mu;
std::string g_last_error;  // the last error of any thread (background jobs included)
std::atomic<uint64_t> g_error_stamp{0};
thread_local std::string t_last_error;
thread_local uint64_t t_error_stamp = 0;

ncclResult_t Fail(ncclResult_t r, const std::string& msg) {
  t_last_error = msg;
  t_error_stamp = ++g_error_stamp;
  std::lock_guard<std::mutex> l(g_error_mu);
  g_last_error = msg;
  return r;
}

uint64_t Random64() {
  static std::mutex mu;
  static std::mt19937_64 gen;
  static pid_t seeded_for = 0;
  std::lock_guard<std::mutex> l(mu);
  if (seeded_for != getpid()) {  // reseed in a forked child
    seeded_for = getpid();
    std::random_device rd;
    gen.seed((uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(getpid()) ^
             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  }
  return gen();
}

// ---------------------------------------------------------------------------------------------
// Sockets. Communicator sockets are non-blocking; every wait also watches a wake fd (an eventfd
// that abort/destroy make readable), so nothing blocks past ncclCommAbort.

enum class Io { kOk, kClosed, kWoken };

Io WaitFd(int fd, short events, int wake_fd) {
  pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
  for (;;) {
    int n = poll(p, wake_fd >= 0 ? 2 : 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Io::kClosed;
    if (wake_fd >= 0 && p[1].revents != 0) return Io::kWoken;
    if (p[0].revents != 0) return Io::kOk;
  }
}

Io WriteAll(int fd, const void* data, size_t n, int wake_fd) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Io io = WaitFd(fd, POLLOUT, wake_fd);
      if (io != Io::kOk) return io;
    } else {
      return Io::kClosed;
    }
  }
  return Io::kOk;
}

Io ReadAll(int fd, void* data, size_t n, int wake_fd) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return Io::kClosed;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      Io io = WaitFd(fd, POLLIN, wake_fd);
      if (io != Io::kOk) return io;
    } else {
      return Io::kClosed;
    }
  }
  return Io::kOk;
}

void SetNonBlocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Connects to ip:port (network order), watching wake_fd. -1 on failure (text in *err).
int ConnectTo(uint32_t ip, uint16_t port, int wake_fd, std::string* err) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  SetNonBlocking(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ip;
  a.sin_port = port;
  int r = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  if (r < 0 && errno == EINPROGRESS) {
    if (WaitFd(fd, POLLOUT, wake_fd) != Io::kOk) {
      close(fd);
      *err = "connect was interrupted (the communicator was aborted)";
      return -1;
    }
    int e = 0;
    socklen_t len = sizeof(e);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
    r = e == 0 ? 0 : -1;
    errno = e;
  }
  if (r < 0) {
    char host[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
    *err = std::string("cannot connect to ") + host + ":" + std::to_string(ntohs(port)) + ": " +
           std::strerror(errno);
    close(fd);
    return -1;
  }
  return fd;
}

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
void SetAsync(CommState* s, ncclResult_t r, const std::string& msg) {
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->closing || (s->async != ncclSuccess && s->async != ncclInProgress)) return;
    Fail(r, msg);
    s->async = r;
    s->error = msg;
    s->error_stamp = t_error_stamp;
  }
  s->cv.notify_all();
}

void SetReady(CommState* s) {
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->async == ncclInProgress) s->async = ncclSuccess;
  }
  s->cv.notify_all();
}

}  // namespace
}  // namespace satdar::cuda_sim

// The handle: a communicator's state, shared with the stream work still queued on it.
struct ncclComm {
  std::shared_ptr<satdar::cuda_sim::CommState> s;
};

namespace satdar::cuda_sim {
namespace {

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

Listener* Listener::Get(std::string* err) {
  static std::mutex mu;
  static Listener* listener = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> l(mu);
  if (listener != nullptr && owner == getpid()) return listener;
  if (listener != nullptr) close(listener->fd_);  // the parent's, inherited through fork; leaked
  auto* fresh = new Listener;
  if (!fresh->Start(err)) {
    delete fresh;
    listener = nullptr;
    return nullptr;
  }
  listener = fresh;
  owner = getpid();
  return listener;
}

bool Listener::Start(std::string* err) {
  const char* env = std::getenv("SATDAR_NCCL_SIM_ADDR");
  const std::string host = env != nullptr && *env != '\0' ? env : "127.0.0.1";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    *err = "SATDAR_NCCL_SIM_ADDR='" + host + "' is not an IPv4 address";
    return false;
  }
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = sizeof(a);
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(fd_, 128) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    *err = "cannot listen on " + host + ": " + std::strerror(errno);
    if (fd_ >= 0) close(fd_);
    return false;
  }
  ip_ = a.sin_addr.s_addr;
  port_ = a.sin_port;
  std::thread([this] { AcceptLoop(); }).detach();
  return true;
}

void Listener::AcceptLoop() {
  for (;;) {
    int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(milliseconds(10));
        continue;
      }
      return;
    }
    std::thread([this, fd] { Handle(fd); }).detach();
  }
}

void Listener::Handle(int fd) {
  Hello h;
  if (ReadAll(fd, &h, sizeof(h), -1) != Io::kOk || h.magic != kIdMagic) {
    close(fd);
    return;
  }
  if (h.kind == kJoin) {
    Join(fd, h);
    return;
  }
  std::shared_ptr<CommState> s;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = routes_.find(h.key);
    if (it != routes_.end()) s = it->second.lock();
  }
  if (s == nullptr) {
    close(fd);
    return;
  }
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->closing || h.rank < 0 || s->incoming.count(h.rank) != 0) {
      close(fd);
      return;
    }
    s->incoming[h.rank] = fd;
  }
  s->cv.notify_all();
}

// Whether the other end of `fd` closed (it sends nothing before our reply).
bool HungUp(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && p.revents != 0;
}

// The root's side of one rank's join: registers it, waits for all, replies with the table.
void Listener::Join(int fd, const Hello& h) {
  std::shared_ptr<Rendezvous> rv;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = roots_.find(h.key);
    if (it != roots_.end()) rv = it->second;
  }
  std::string error;
  std::vector<Addr> table;
  if (rv == nullptr) {
    error = "this ncclUniqueId is unknown at its root (made by another run, or already used)";
  } else {
    std::unique_lock<std::mutex> l(rv->mu);
    if (rv->error.empty() && rv->done) {
      rv->error = "rank " + std::to_string(h.rank) + " joined a communicator that was complete";
    } else if (rv->error.empty() && rv->nranks < 0) {
      rv->nranks = h.nranks;
      rv->first_rank = h.rank;
      rv->table.assign(h.nranks, Addr{});
      rv->present.assign(h.nranks, 0);
    } else if (rv->error.empty() && rv->nranks != h.nranks) {
      rv->error = "rank " + std::to_string(h.rank) + " passed nranks " + std::to_string(h.nranks) +
                  " but rank " + std::to_string(rv->first_rank) + " passed nranks " +
                  std::to_string(rv->nranks);
    }
    if (rv->error.empty() && (h.rank < 0 || h.rank >= rv->nranks || rv->present[h.rank])) {
      rv->error = "rank " + std::to_string(h.rank) + " joined twice or is not in 0.." +
                  std::to_string(rv->nranks - 1);
    }
    if (rv->error.empty()) {
      rv->table[h.rank] = Addr{h.ip, h.port, h.token};
      rv->present[h.rank] = 1;
      if (++rv->joined == rv->nranks) rv->done = true;
    }
    rv->cv.notify_all();
    const bool joined = rv->error.empty();
    while (!rv->done && rv->error.empty()) {
      rv->cv.wait_for(l, milliseconds(100));
      if (joined && !rv->done && HungUp(fd)) {  // it gave up (ncclCommAbort): withdraw it
        rv->present[h.rank] = 0;
        --rv->joined;
        close(fd);
        return;
      }
    }
    error = rv->error;
    table = rv->table;
  }
  int32_t head[2] = {error.empty() ? 0 : 1, 0};
  head[1] = static_cast<int32_t>(error.empty() ? table.size() * sizeof(Addr) : error.size());
  WriteAll(fd, head, sizeof(head), -1);
  if (error.empty()) {
    WriteAll(fd, table.data(), table.size() * sizeof(Addr), -1);
  } else {
    WriteAll(fd, error.data(), error.size(), -1);
  }
  close(fd);
}

// ---------------------------------------------------------------------------------------------
// Messages between ranks.

void ReaderLoop(CommState* s) {
  std::vector<pollfd> p;
  std::vector<int> who;
  for (;;) {
    p.assign(1, pollfd{s->wake, POLLIN, 0});
    who.assign(1, -1);
    {
      std::lock_guard<std::mutex> l(s->mu);
      for (int r = 0; r < s->nranks; ++r) {
        if (s->fds[r] >= 0 && !s->closed[r]) {
          p.push_back(pollfd{s->fds[r], POLLIN, 0});
          who.push_back(r);
        }
      }
    }
    if (poll(p.data(), p.size(), -1) < 0 && errno != EINTR) return;
    if (p[0].revents != 0) return;
    for (size_t i = 1; i < p.size(); ++i) {
      if (p[i].revents == 0) continue;
      const int r = who[i];
      Msg m;
      Io io = ReadAll(p[i].fd, &m.h, sizeof(m.h), s->wake);
      if (io == Io::kOk && m.h.magic != kMsgMagic) io = Io::kClosed;
      if (io == Io::kOk && m.h.bytes > 0) {
        m.data.resize(m.h.bytes);
        io = ReadAll(p[i].fd, m.data.data(), m.data.size(), s->wake);
      }
      if (io == Io::kWoken) return;
      bool lost = false;
      {
        std::lock_guard<std::mutex> l(s->mu);
        if (io == Io::kClosed) {
          s->closed[r] = 1;
          lost = !s->bye[r] && !s->closing;
        } else if (m.h.kind == kBye) {
          s->bye[r] = 1;
        } else {
          s->inbox[r].push_back(std::move(m));
        }
      }
      s->cv.notify_all();
      if (lost) {
        SetAsync(s, ncclRemoteError,
                 "rank " + std::to_string(s->rank) + ": the connection to rank " +
                     std::to_string(r) +
                     " closed without a goodbye (that process died or the network broke)");
      }
    }
  }
}

// Sends one message to `peer` (to the own inbox when peer is this rank). False when the
// communicator is closing or the connection is gone.
bool Post(CommState* s, int peer, MsgHeader h, const void* data) {
  if (peer == s->rank) {
    Msg m;
    m.h = h;
    m.data.assign(static_cast<const char*>(data), static_cast<const char*>(data) + h.bytes);
    {
      std::lock_guard<std::mutex> l(s->mu);
      s->inbox[peer].push_back(std::move(m));
    }
    s->cv.notify_all();
    return true;
  }
  std::lock_guard<std::mutex> l(*s->send_mu[peer]);
  Io io = WriteAll(s->fds[peer], &h, sizeof(h), s->wake);
  if (io == Io::kOk && h.bytes > 0) io = WriteAll(s->fds[peer], data, h.bytes, s->wake);
  if (io == Io::kClosed) {
    SetAsync(s, ncclRemoteError,
             "rank " + std::to_string(s->rank) + ": sending to rank " + std::to_string(peer) +
                 " failed: " + std::strerror(errno) + " (that process died?)");
  }
  return io == Io::kOk;
}

// Waits for the message (kind, seq) from `peer`. False when the communicator closes first (or
// `cancel` says so; it is polled). Like NCCL, it never gives up on a silent peer by itself.
bool Take(CommState* s, int peer, uint32_t kind, uint64_t seq, Msg* out,
          const std::function<bool()>& cancel = nullptr) {
  std::unique_lock<std::mutex> l(s->mu);
  for (;;) {
    auto& q = s->inbox[peer];
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (it->h.kind == kind && it->h.seq == seq) {
        *out = std::move(*it);
        q.erase(it);
        return true;
      }
    }
    if (s->closing || (cancel && cancel())) return false;
    s->cv.wait_for(l, milliseconds(cancel ? 20 : 500));
  }
}

// Waits (as NCCL's kernels do) until the communicator is aborted or destroyed.
void HangUntilClosed(CommState* s) {
  std::unique_lock<std::mutex> l(s->mu);
  s->cv.wait(l, [&] { return s->closing.load(); });
}

}  // namespace
}  // namespace satdar::cuda_sim

namespace satdar::cuda_sim {
namespace {

// ---------------------------------------------------------------------------------------------
// Types and reductions.

enum OpKind : int32_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv };

const char* OpName(int32_t k) {
  switch (k) {
    case kAllReduce: return "ncclAllReduce";
    case kReduceScatter: return "ncclReduceScatter";
    case kAllGather: return "ncclAllGather";
    case kBroadcast: return "ncclBroadcast";
    case kSend: return "ncclSend";
    case kRecv: return "ncclRecv";
  }
  return "?";
}

// 0 for the types the simulator does not implement.
size_t TypeSize(int32_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

const char* TypeName(int32_t t) {
  static const char* const kNames[] = {"ncclInt8",     "ncclUint8",      "ncclInt32",
                                       "ncclUint32",   "ncclInt64",      "ncclUint64",
                                       "ncclFloat16",  "ncclFloat32",    "ncclFloat64",
                                       "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return t >= 0 && t < ncclNumTypes ? kNames[t] : "an unknown ncclDataType_t";
}

const char* RedName(int32_t r) {
  static const char* const kNames[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
  return r >= 0 && r < ncclNumOps ? kNames[r] : "an unknown ncclRedOp_t";
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN.
uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <typename T>
T Apply(T a, T b, int32_t op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // integers wrap, as on the GPU
    switch (op) {
      case ncclProd: return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ncclMax: return std::max(a, b);
      case ncclMin: return std::min(a, b);
      default: return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  } else {
    switch (op) {
      case ncclProd: return a * b;
      case ncclMax: return std::fmax(a, b);
      case ncclMin: return std::fmin(a, b);
      default: return a + b;
    }
  }
}

template <typename T>
void CombineT(char* acc, const char* x, size_t n, int32_t op) {
  for (size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, x + i * sizeof(T), sizeof(T));
    a = Apply(a, b, op);
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

void CombineBf16(char* acc, const char* x, size_t n, int32_t op) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, acc + 2 * i, 2);
    std::memcpy(&b, x + 2 * i, 2);
    a = FloatToBf16(Apply(Bf16ToFloat(a), Bf16ToFloat(b), op));
    std::memcpy(acc + 2 * i, &a, 2);
  }
}

// acc = op(acc, x), element by element.
void Combine(char* acc, const char* x, size_t n, int32_t type, int32_t op) {
  switch (type) {
    case ncclInt8: return CombineT<int8_t>(acc, x, n, op);
    case ncclUint8: return CombineT<uint8_t>(acc, x, n, op);
    case ncclInt32: return CombineT<int32_t>(acc, x, n, op);
    case ncclUint32: return CombineT<uint32_t>(acc, x, n, op);
    case ncclInt64: return CombineT<int64_t>(acc, x, n, op);
    case ncclUint64: return CombineT<uint64_t>(acc, x, n, op);
    case ncclFloat32: return CombineT<float>(acc, x, n, op);
    case ncclFloat64: return CombineT<double>(acc, x, n, op);
    case ncclBfloat16: return CombineBf16(acc, x, n, op);
  }
}

template <typename T>
void DivideT(char* acc, size_t n, int nranks) {
  for (size_t i = 0; i < n; ++i) {
    T a;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    a = static_cast<T>(a / static_cast<T>(nranks));
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

// ncclAvg's last step: acc / nranks (integers truncate).
void Divide(char* acc, size_t n, int32_t type, int nranks) {
  switch (type) {
    case ncclInt8: return DivideT<int8_t>(acc, n, nranks);
    case ncclUint8: return DivideT<uint8_t>(acc, n, nranks);
    case ncclInt32: return DivideT<int32_t>(acc, n, nranks);
    case ncclUint32: return DivideT<uint32_t>(acc, n, nranks);
    case ncclInt64: return DivideT<int64_t>(acc, n, nranks);
    case ncclUint64: return DivideT<uint64_t>(acc, n, nranks);
    case ncclFloat32: return DivideT<float>(acc, n, nranks);
    case ncclFloat64: return DivideT<double>(acc, n, nranks);
    case ncclBfloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t a;
        std::memcpy(&a, acc + 2 * i, 2);
        a = FloatToBf16(Bf16ToFloat(a) / static_cast<float>(nranks));
        std::memcpy(acc + 2 * i, &a, 2);
      }
      return;
  }
}

// ---------------------------------------------------------------------------------------------
// Operations on streams.

struct Op {
  OpKind kind;
  std::shared_ptr<CommState> comm;
  cudaStream_t stream;
  const void* send;
  void* recv;
  size_t count;  // elements: per rank (ReduceScatter: received; AllGather: sent)
  int32_t type;
  int32_t red;
  int peer;  // Broadcast: the root; Send/Recv: the peer
  uint64_t seq = 0;
  size_t bytes() const { return count * TypeSize(type); }
};

MsgHeader HeaderOf(const Op& op, uint32_t kind) {
  MsgHeader h;
  h.kind = kind;
  h.seq = op.seq;
  h.op = op.kind;
  h.type = op.type;
  h.red = op.red;
  h.root = op.kind == kBroadcast ? op.peer : 0;
  h.count = op.count;
  h.bytes = kind == kCts ? 0 : op.bytes();
  return h;
}

std::string Describe(int32_t op, int32_t type, int32_t red, int32_t root, uint64_t count) {
  std::string s =
      std::string(OpName(op)) + "(count " + std::to_string(count) + ", " + TypeName(type);
  if (op == kAllReduce || op == kReduceScatter) s += std::string(", ") + RedName(red);
  if (op == kBroadcast) s += ", root " + std::to_string(root);
  return s + ")";
}

// Whether the peer's matched call agrees with ours; reports and sets the async error if not.
bool Matches(const Op& op, const Msg& m, int from) {
  CommState* s = op.comm.get();
  bool same;
  if (op.kind == kRecv) {
    same = m.h.op == kSend && m.h.bytes == op.bytes();
  } else {
    same = m.h.op == op.kind && m.h.type == op.type && m.h.count == op.count &&
           m.h.root == (op.kind == kBroadcast ? op.peer : 0) &&
           (m.h.red == op.red || (op.kind != kAllReduce && op.kind != kReduceScatter));
  }
  if (same) return true;
  const std::string mine = Describe(op.kind, op.type, op.red, op.peer, op.count);
  const std::string theirs = Describe(m.h.op, m.h.type, m.h.red, m.h.root, m.h.count);
  const std::string what =
      "NCCL simulator: rank " + std::to_string(s->rank) + "'s " + mine + " (" +
      (op.kind == kRecv ? "receive" : "collective") + " #" + std::to_string(op.seq) +
      " of this communicator) was matched with rank " + std::to_string(from) + "'s " + theirs +
      (op.kind == kRecv ? " of " + std::to_string(m.h.bytes) + " bytes (the receive expects " +
                              std::to_string(op.bytes()) + ")"
                        : "") +
      ": NCCL needs every rank to issue the same operations in the same order with the same "
      "counts";
  Report(what);
  SetAsync(s, ncclInvalidUsage, what);
  return false;
}

// The first half of an operation: what it sends (it never waits for data, only for a Recv to
// be posted: NCCL's Send does not complete before its Recv is issued).
bool SendPart(const Op& op) {
  CommState* s = op.comm.get();
  const int n = s->nranks, r = s->rank;
  const size_t bytes = op.bytes();
  const char* src = static_cast<const char*>(op.send);
  switch (op.kind) {
    case kAllReduce:
    case kAllGather:
    case kBroadcast:
      if (op.kind == kBroadcast && r != op.peer) return true;
      for (int p = 0; p < n; ++p) {
        if (p != r && !Post(s, p, HeaderOf(op, kColl), src)) return false;
      }
      return true;
    case kReduceScatter:
      for (int p = 0; p < n; ++p) {
        if (p != r && !Post(s, p, HeaderOf(op, kColl), src + p * bytes)) return false;
      }
      return true;
    case kSend: {
      Msg cts;
      return Take(s, op.peer, kCts, op.seq, &cts) && Post(s, op.peer, HeaderOf(op, kP2p), src);
    }
    case kRecv: return true;
  }
  return true;
}

// Reduces every rank's contribution in rank order into `out` (`mine` is this rank's).
bool ReduceInto(const Op& op, const char* mine, void* out) {
  CommState* s = op.comm.get();
  const int n = s->nranks, r = s->rank;
  const size_t bytes = op.bytes();
  std::vector<Msg> got(n);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    if (!Take(s, p, kColl, op.seq, &got[p]) || !Matches(op, got[p], p)) return false;
  }
  auto part = [&](int p) { return p == r ? mine : got[p].data.data(); };
  std::vector<char> acc(part(0), part(0) + bytes);
  for (int p = 1; p < n; ++p) Combine(acc.data(), part(p), op.count, op.type, op.red);
  if (op.red == ncclAvg) Divide(acc.data(), op.count, op.type, n);
  if (bytes > 0) std::memcpy(out, acc.data(), bytes);
  return true;
}

// The second half: what it receives and computes.
bool RecvPart(const Op& op) {
  CommState* s = op.comm.get();
  const int n = s->nranks, r = s->rank;
  const size_t bytes = op.bytes();
  const char* src = static_cast<const char*>(op.send);
  char* dst = static_cast<char*>(op.recv);
  Msg m;
  switch (op.kind) {
    case kAllReduce: return ReduceInto(op, src, dst);
    case kReduceScatter: return ReduceInto(op, src + r * bytes, dst);
    case kAllGather:
      for (int p = 0; p < n; ++p) {
        if (p == r) {
          if (bytes > 0 && dst + p * bytes != src) std::memmove(dst + p * bytes, src, bytes);
          continue;
        }
        if (!Take(s, p, kColl, op.seq, &m) || !Matches(op, m, p)) return false;
        if (bytes > 0) std::memcpy(dst + p * bytes, m.data.data(), bytes);
      }
      return true;
    case kBroadcast:
      if (r == op.peer) {
        if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
        return true;
      }
      if (!Take(s, op.peer, kColl, op.seq, &m) || !Matches(op, m, op.peer)) return false;
      if (bytes > 0) std::memcpy(dst, m.data.data(), bytes);
      return true;
    case kRecv:
      if (!Take(s, op.peer, kP2p, op.seq, &m) || !Matches(op, m, op.peer)) return false;
      if (bytes > 0) std::memcpy(dst, m.data.data(), bytes);
      return true;
    case kSend: return true;
  }
  return true;
}

// Runs the operations one group put on one stream of one communicator: posts its receives,
// sends, then receives, so that matched Send/Recv of a group never wait for each other.
cudaError_t RunBundle(const std::vector<Op>& ops) {
  CommState* s = ops.front().comm.get();
  bool ok = true;
  for (const Op& op : ops) {
    if (ok && op.kind == kRecv) ok = Post(s, op.peer, HeaderOf(op, kCts), nullptr);
  }
  for (const Op& op : ops) ok = ok && SendPart(op);
  for (const Op& op : ops) ok = ok && RecvPart(op);
  if (!ok) HangUntilClosed(s);  // as a GPU's NCCL kernel: the stream waits for ncclCommAbort
  {
    std::lock_guard<std::mutex> l(s->mu);
    --s->outstanding;
  }
  s->cv.notify_all();
  return cudaSuccess;
}

// The calling thread's open group (ncclGroupStart .. ncclGroupEnd).
thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group_ops;
thread_local ncclResult_t t_group_error = ncclSuccess;

// Fails a call; inside a group the group fails too (ncclGroupEnd returns the error and runs
// none of its operations, as NCCL does).
ncclResult_t Reject(ncclResult_t r, const std::string& msg) {
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = r;
  return Fail(r, msg);
}

// Queues the operations, one stream work per (communicator, stream), in issue order; numbers
// them as the peers will.
ncclResult_t Launch(std::vector<Op> ops) {
  std::vector<std::vector<Op>> bundles;
  for (Op& op : ops) {
    auto it = std::find_if(bundles.begin(), bundles.end(), [&](const std::vector<Op>& b) {
      return b.front().comm == op.comm && b.front().stream == op.stream;
    });
    if (it == bundles.end()) {
      bundles.emplace_back();
      it = bundles.end() - 1;
    }
    it->push_back(std::move(op));
  }
  ncclResult_t result = ncclSuccess;
  for (auto& b : bundles) {
    CommState* s = b.front().comm.get();
    const cudaStream_t stream = b.front().stream;
    {
      std::lock_guard<std::mutex> l(s->mu);
      for (Op& op : b) {
        if (op.kind == kSend) {
          op.seq = s->send_seq[op.peer]++;
        } else if (op.kind == kRecv) {
          op.seq = s->recv_seq[op.peer]++;
        } else {
          op.seq = s->coll_seq++;
        }
      }
      ++s->outstanding;
    }
    auto shared = std::make_shared<std::vector<Op>>(std::move(b));
    const cudaError_t e = Enqueue(stream, [shared] { return RunBundle(*shared); });
    if (e != cudaSuccess) {
      {
        std::lock_guard<std::mutex> l(s->mu);
        --s->outstanding;
      }
      s->cv.notify_all();
      result = Fail(ncclUnhandledCudaError,
                    std::string(OpName(shared->front().kind)) +
                        ": cannot queue on the stream: " + cudaGetErrorString(e));
    }
  }
  return result;
}

// Checks that `comm` can take an operation now.
ncclResult_t CheckReady(const char* call, ncclComm_t comm) {
  if (comm == nullptr) return Reject(ncclInvalidArgument, std::string(call) + ": comm is NULL");
  CommState* s = comm->s.get();
  std::lock_guard<std::mutex> l(s->mu);
  if (s->async == ncclInProgress) {
    return Reject(ncclInvalidUsage,
                  std::string(call) +
                      ": the communicator is still initializing, splitting or finalizing "
                      "(ncclInProgress): wait until ncclCommGetAsyncError gives ncclSuccess");
  }
  if (s->async != ncclSuccess) {
    return Reject(s->async, std::string(call) + ": the communicator has failed: " + s->error);
  }
  if (s->finalized) {
    return Reject(ncclInvalidUsage, std::string(call) + ": the communicator was finalized");
  }
  return ncclSuccess;
}

ncclResult_t CheckBuffer(const char* call, const char* name, const void* p, size_t bytes) {
  if (bytes == 0 || IsDeviceRange(p, bytes)) return ncclSuccess;
  char ptr[32];
  std::snprintf(ptr, sizeof(ptr), "%p", p);
  const std::string what = std::string("NCCL simulator: ") + call + ": " + name + " " + ptr +
                           " is not device memory of " + std::to_string(bytes) +
                           " bytes (NCCL counts elements, not bytes; buffers must be "
                           "cudaMalloc'd)";
  Report(what);
  return Reject(ncclInvalidArgument, what);
}

// Checks and queues (or, inside a group, defers) one operation.
ncclResult_t Submit(const char* call, Op op, ncclComm_t comm) {
  ncclResult_t r = CheckReady(call, comm);
  if (r != ncclSuccess) return r;
  op.comm = comm->s;
  const int n = op.comm->nranks;
  const size_t es = TypeSize(op.type);
  if (es == 0) {
    return Reject(ncclInvalidArgument, std::string(call) + ": " + TypeName(op.type) +
                                           " is not in the simulator's subset");
  }
  if ((op.kind == kAllReduce || op.kind == kReduceScatter) &&
      (op.red < 0 || op.red >= ncclNumOps)) {
    return Reject(ncclInvalidArgument, std::string(call) + ": reduction op " +
                                           std::to_string(op.red) + " is not simulated");
  }
  if ((op.kind == kBroadcast || op.kind == kSend || op.kind == kRecv) &&
      (op.peer < 0 || op.peer >= n)) {
    return Reject(ncclInvalidArgument, std::string(call) + ": " +
                                           (op.kind == kBroadcast ? "root " : "peer ") +
                                           std::to_string(op.peer) + " is not a rank of the " +
                                           std::to_string(n) + " of this communicator");
  }
  if (op.count > (SIZE_MAX / es) / static_cast<size_t>(n)) {
    return Reject(ncclInvalidArgument, std::string(call) + ": count is too large");
  }
  const size_t bytes = op.count * es, all = bytes * n;
  const size_t send_bytes =
      op.kind == kReduceScatter                                                 ? all
      : op.kind == kRecv || (op.kind == kBroadcast && op.peer != op.comm->rank) ? 0
                                                                                : bytes;
  const size_t recv_bytes = op.kind == kAllGather ? all : op.kind == kSend ? 0 : bytes;
  if ((r = CheckBuffer(call, "sendbuff", op.send, send_bytes)) != ncclSuccess) return r;
  if ((r = CheckBuffer(call, "recvbuff", op.recv, recv_bytes)) != ncclSuccess) return r;
  if (t_group_depth > 0) {
    t_group_ops.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<Op> one;
  one.push_back(std::move(op));
  return Launch(std::move(one));
}

}  // namespace
}  // namespace satdar::cuda_sim

namespace satdar::cuda_sim {
namespace {

// ---------------------------------------------------------------------------------------------
// Setting communicators up and down.

// Reads `config` (NULL: `dflt`). Only `blocking` is simulated; other fields must be unset.
ncclResult_t ReadConfig(const char* call, const ncclConfig_t* c, bool dflt, bool* blocking) {
  *blocking = dflt;
  if (c == nullptr) return ncclSuccess;
  const std::string where = std::string(call) + ": config";
  if (c->magic != 0xcafebeef || c->size != sizeof(ncclConfig_t)) {
    return Fail(ncclInvalidArgument, where + " was not initialized with NCCL_CONFIG_INITIALIZER");
  }
  if (c->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (c->blocking != 0 && c->blocking != 1) {
      return Fail(ncclInvalidArgument, where + ".blocking must be 0 or 1");
    }
    *blocking = c->blocking == 1;
  }
  const int ints[] = {c->cgaClusterSize,      c->minCTAs,           c->maxCTAs,
                      c->splitShare,          c->trafficClass,      c->collnetEnable,
                      c->CTAPolicy,           c->shrinkShare,       c->nvlsCTAs,
                      c->nChannelsPerNetPeer, c->nvlinkCentricSched};
  for (int v : ints) {
    if (v != NCCL_CONFIG_UNDEF_INT) {
      Report(where +
             " sets a field other than blocking/commName/netName, which the NCCL "
             "simulator does not implement");
      return Fail(ncclInvalidArgument,
                  where + ": only blocking, commName and netName are simulated");
    }
  }
  return ncclSuccess;
}

void Wake(CommState* s) {
  const uint64_t one = 1;
  ssize_t ignored = write(s->wake, &one, sizeof(one));
  (void)ignored;
}

// Connects `s` (rank s->rank of s->nranks) with every rank of `table` and starts its reader.
ncclResult_t BuildMesh(CommState* s, const std::vector<Addr>& table) {
  const int r = s->rank, n = s->nranks;
  const std::string me = "rank " + std::to_string(r) + " of " + std::to_string(n);
  for (int p = 0; p < r; ++p) {
    std::string err;
    const int fd = ConnectTo(table[p].ip, static_cast<uint16_t>(table[p].port), s->wake, &err);
    if (fd < 0) {
      SetAsync(s, ncclSystemError,
               me + ": cannot connect to rank " + std::to_string(p) + ": " + err);
      return s->async;
    }
    s->fds[p] = fd;
    Hello h;
    h.kind = kMesh;
    h.key = table[p].token;
    h.rank = r;
    h.nranks = n;
    if (WriteAll(fd, &h, sizeof(h), s->wake) != Io::kOk) {
      SetAsync(s, ncclRemoteError, me + ": rank " + std::to_string(p) + " closed the connection");
      return s->async;
    }
  }
  {
    std::unique_lock<std::mutex> l(s->mu);
    s->cv.wait(l, [&] {
      if (s->closing) return true;
      for (int p = r + 1; p < n; ++p) {
        if (s->incoming.count(p) == 0) return false;
      }
      return true;
    });
    if (s->closing) return ncclInvalidUsage;
    for (int p = r + 1; p < n; ++p) {
      s->fds[p] = s->incoming[p];
      s->incoming.erase(p);
    }
  }
  if (s->listener != nullptr) s->listener->RemoveRoute(s->token);
  for (int fd : s->fds) {
    if (fd >= 0) SetNonBlocking(fd);
  }
  s->reader = std::thread(ReaderLoop, s);
  SetReady(s);
  return ncclSuccess;
}

// ncclCommInitRankConfig's work: join at the id's root, get the table, connect.
ncclResult_t InitJob(CommState* s, IdBody id) {
  const std::string me = "ncclCommInitRankConfig (rank " + std::to_string(s->rank) + " of " +
                         std::to_string(s->nranks) + ")";
  std::string err;
  const int fd = ConnectTo(id.ip, static_cast<uint16_t>(id.port), s->wake, &err);
  if (fd < 0) {
    if (!s->closing) SetAsync(s, ncclSystemError, me + ": cannot reach the id's root: " + err);
    return s->closing ? ncclInvalidUsage : s->async;
  }
  Hello h;
  h.kind = kJoin;
  h.key = id.nonce;
  h.rank = s->rank;
  h.nranks = s->nranks;
  h.ip = s->listener->ip();
  h.port = s->listener->port();
  h.token = s->token;
  int32_t head[2] = {0, 0};
  Io io = WriteAll(fd, &h, sizeof(h), s->wake);
  if (io == Io::kOk) io = ReadAll(fd, head, sizeof(head), s->wake);
  std::vector<char> body(io == Io::kOk && head[1] > 0 ? head[1] : 0);
  if (io == Io::kOk && !body.empty()) io = ReadAll(fd, body.data(), body.size(), s->wake);
  close(fd);
  if (io != Io::kOk) {
    if (!s->closing) SetAsync(s, ncclSystemError, me + ": the id's root closed the connection");
    return s->closing ? ncclInvalidUsage : s->async;
  }
  if (head[0] != 0) {
    SetAsync(s, ncclInvalidArgument, me + ": " + std::string(body.begin(), body.end()));
    return s->async;
  }
  if (body.size() != s->nranks * sizeof(Addr)) {
    SetAsync(s, ncclInternalError, me + ": the root's table has the wrong size");
    return s->async;
  }
  std::vector<Addr> table(s->nranks);
  std::memcpy(table.data(), body.data(), body.size());
  return BuildMesh(s, table);
}

// What each rank of the parent tells the others in ncclCommSplit.
struct SplitEntry {
  int32_t color;
  int32_t key;
  Addr addr;
};

// ncclCommSplit's work: exchange (color, key, listener) over the parent, then connect the child.
ncclResult_t SplitJob(std::shared_ptr<CommState> parent, std::shared_ptr<CommState> child,
                      int color, int key, uint64_t seq, bool parent_in_progress) {
  CommState* s = parent.get();
  const int n = s->nranks, r = s->rank;
  std::vector<SplitEntry> all(n);
  all[r] =
      SplitEntry{color, key,
                 Addr{s->listener->ip(), s->listener->port(), child != nullptr ? child->token : 0}};
  MsgHeader h;
  h.kind = kCtrl;
  h.seq = seq;
  h.bytes = sizeof(SplitEntry);
  auto cancel = [&child] { return child != nullptr && child->closing; };
  bool ok = true;
  for (int p = 0; p < n && ok; ++p) ok = p == r || Post(s, p, h, &all[r]);
  for (int p = 0; p < n && ok; ++p) {
    Msg m;
    if (p == r) continue;
    ok = Take(s, p, kCtrl, seq, &m, cancel) && m.data.size() == sizeof(SplitEntry);
    if (ok) std::memcpy(&all[p], m.data.data(), sizeof(SplitEntry));
  }
  if (parent_in_progress) SetReady(s);
  std::string why;
  if (!ok) {
    std::lock_guard<std::mutex> l(s->mu);
    why = s->closing ? "the parent communicator was aborted or destroyed" : s->error;
  }
  if (child == nullptr) return ok ? ncclSuccess : s->async;
  if (!ok) {
    if (!child->closing) SetAsync(child.get(), ncclRemoteError, "ncclCommSplit: " + why);
    return child->closing ? ncclInvalidUsage : child->async;
  }
  std::vector<int> members;
  for (int p = 0; p < n; ++p) {
    if (all[p].color == color) members.push_back(p);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[a].key < all[b].key; });
  std::vector<Addr> table;
  int me = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == r) me = static_cast<int>(i);
    table.push_back(all[members[i]].addr);
  }
  {
    std::lock_guard<std::mutex> l(child->mu);
    child->Setup(me, static_cast<int>(members.size()));
  }
  return BuildMesh(child.get(), table);
}

void AddJob(CommState* s, std::thread t) {
  std::lock_guard<std::mutex> l(s->jobs_mu);
  s->jobs.push_back(std::move(t));
}

// Ends `s`: every wait gives up, the threads are joined, peers get a goodbye, the sockets shut.
// The state itself lives on while stream work still holds it.
void Close(CommState* s, bool abort) {
  {
    std::lock_guard<std::mutex> l(s->mu);
    s->closing = true;
  }
  s->cv.notify_all();
  Wake(s);
  std::vector<std::thread> jobs;
  {
    std::lock_guard<std::mutex> l(s->jobs_mu);
    jobs.swap(s->jobs);
  }
  for (auto& t : jobs) t.join();
  if (s->reader.joinable()) s->reader.join();
  if (s->listener != nullptr) s->listener->RemoveRoute(s->token);
  MsgHeader bye;
  bye.kind = kBye;
  for (size_t p = 0; p < s->fds.size(); ++p) {
    const int fd = s->fds[p];
    if (fd < 0) continue;
    std::unique_lock<std::mutex> l(*s->send_mu[p], std::defer_lock);
    if (abort ? l.try_lock() : (l.lock(), true)) {
      ssize_t ignored = send(fd, &bye, sizeof(bye), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)ignored;
    }
    shutdown(fd, SHUT_RDWR);
  }
}

// Waits until no operation of `s` is queued (or it failed, or closes).
void Drain(CommState* s) {
  std::unique_lock<std::mutex> l(s->mu);
  s->cv.wait(l, [&] {
    return s->outstanding == 0 || s->closing ||
           (s->async != ncclSuccess && s->async != ncclInProgress);
  });
}

}  // namespace
}  // namespace satdar::cuda_sim

// ---------------------------------------------------------------------------------------------
// The API.

using satdar::cuda_sim::CommState;
namespace sim = satdar::cuda_sim;

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr)
    return sim::Fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  std::string err;
  sim::Listener* l = sim::Listener::Get(&err);
  if (l == nullptr) return sim::Fail(ncclSystemError, "ncclGetUniqueId: " + err);
  sim::IdBody body{sim::kIdMagic, l->ip(), l->port(), 0, sim::Random64()};
  l->AddRoot(body.nonce);
  std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
  std::memcpy(uniqueId->internal, &body, sizeof(body));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  const char* call = "ncclCommInitRankConfig";
  if (comm == nullptr) return sim::Fail(ncclInvalidArgument, std::string(call) + ": comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return sim::Fail(ncclInvalidArgument, std::string(call) + ": rank " + std::to_string(rank) +
                                              " is not in 0..nranks-1 (nranks " +
                                              std::to_string(nranks) + ")");
  }
  sim::IdBody id;
  std::memcpy(&id, commId.internal, sizeof(id));
  if (id.magic != sim::kIdMagic) {
    return sim::Fail(
        ncclInvalidArgument,
        std::string(call) + ": commId was not made by the simulator's ncclGetUniqueId");
  }
  bool blocking = true;
  ncclResult_t r = sim::ReadConfig(call, config, true, &blocking);
  if (r != ncclSuccess) return r;
  std::string err;
  sim::Listener* l = sim::Listener::Get(&err);
  if (l == nullptr) return sim::Fail(ncclSystemError, std::string(call) + ": " + err);
  auto s = std::make_shared<CommState>(blocking);
  s->Setup(rank, nranks);
  s->listener = l;
  s->token = sim::Random64();
  l->AddRoute(s->token, s);
  auto* handle = new ncclComm{s};
  if (!blocking) {
    sim::AddJob(s.get(), std::thread([s, id] { sim::InitJob(s.get(), id); }));
    *comm = handle;
    return ncclInProgress;
  }
  r = sim::InitJob(s.get(), id);
  if (r != ncclSuccess) {
    sim::Close(s.get(), true);
    delete handle;
    return r;
  }
  *comm = handle;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  const char* call = "ncclCommSplit";
  ncclResult_t r = sim::CheckReady(call, comm);
  if (r != ncclSuccess) return r;
  if (newcomm == nullptr)
    return sim::Fail(ncclInvalidArgument, std::string(call) + ": newcomm is NULL");
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return sim::Fail(ncclInvalidArgument, std::string(call) + ": color " + std::to_string(color) +
                                              " is negative and not NCCL_SPLIT_NOCOLOR");
  }
  std::shared_ptr<CommState> parent = comm->s;
  bool blocking = parent->blocking;
  if ((r = sim::ReadConfig(call, config, parent->blocking, &blocking)) != ncclSuccess) return r;
  std::shared_ptr<CommState> child;
  if (color != NCCL_SPLIT_NOCOLOR) {
    child = std::make_shared<CommState>(blocking);
    child->listener = parent->listener;
    child->token = sim::Random64();
    parent->listener->AddRoute(child->token, child);
  }
  uint64_t seq;
  bool in_progress = false;
  {
    std::lock_guard<std::mutex> l(parent->mu);
    seq = parent->ctrl_seq++;
    if (!blocking && parent->async == ncclSuccess) {
      parent->async = ncclInProgress;
      in_progress = true;
    }
  }
  ncclComm* handle = child != nullptr ? new ncclComm{child} : nullptr;
  if (!blocking) {
    std::thread t([=] { sim::SplitJob(parent, child, color, key, seq, in_progress); });
    sim::AddJob(child != nullptr ? child.get() : parent.get(), std::move(t));
    *newcomm = handle;
    return ncclInProgress;
  }
  r = sim::SplitJob(parent, child, color, key, seq, false);
  if (r != ncclSuccess) {
    if (child != nullptr) sim::Close(child.get(), true);
    delete handle;
    return r;
  }
  *newcomm = handle;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return sim::Fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  std::shared_ptr<CommState> s = comm->s;
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->async != ncclSuccess) {
      return sim::Fail(s->async == ncclInProgress ? ncclInvalidUsage : s->async,
                       "ncclCommFinalize: the communicator is " +
                           (s->async == ncclInProgress ? std::string("still in progress")
                                                       : "failed: " + s->error));
    }
    s->finalized = true;
    if (!s->blocking) s->async = ncclInProgress;
  }
  if (!s->blocking) {
    sim::AddJob(s.get(), std::thread([s] {
                  sim::Drain(s.get());
                  sim::SetReady(s.get());
                }));
    return ncclInProgress;
  }
  sim::Drain(s.get());
  std::lock_guard<std::mutex> l(s->mu);
  return s->async == ncclInProgress ? ncclSuccess : s->async;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  sim::Drain(comm->s.get());  // NCCL finishes the queued operations first
  sim::Close(comm->s.get(), false);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  sim::Close(comm->s.get(), true);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) {
    return sim::Fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  }
  std::lock_guard<std::mutex> l(comm->s->mu);
  *asyncError = comm->s->async;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) {
    return sim::Fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
  }
  std::lock_guard<std::mutex> l(comm->s->mu);
  if (comm->s->nranks == 0) {
    return sim::Fail(ncclInvalidUsage, "ncclCommCount: the communicator is still being split");
  }
  *count = comm->s->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) {
    return sim::Fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
  }
  std::lock_guard<std::mutex> l(comm->s->mu);
  if (comm->s->nranks == 0) {
    return sim::Fail(ncclInvalidUsage, "ncclCommUserRank: the communicator is still being split");
  }
  *rank = comm->s->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

// The newer of this thread's last error and the communicator's error (any thread's last
// error when neither is set).
const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string text;
  text = sim::t_last_error;
  uint64_t stamp = sim::t_error_stamp;
  if (comm != nullptr) {
    std::lock_guard<std::mutex> l(comm->s->mu);
    if (!comm->s->error.empty() && comm->s->error_stamp >= stamp) text = comm->s->error;
  }
  if (text.empty()) {
    std::lock_guard<std::mutex> l(sim::g_error_mu);
    text = sim::g_last_error;
  }
  return text.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return sim::Submit(
      "ncclAllReduce",
      sim::Op{sim::kAllReduce, nullptr, stream, sendbuff, recvbuff, count, datatype, op, 0}, comm);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return sim::Submit(
      "ncclReduceScatter",
      sim::Op{sim::kReduceScatter, nullptr, stream, sendbuff, recvbuff, recvcount, datatype, op, 0},
      comm);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return sim::Submit("ncclAllGather",
                     sim::Op{sim::kAllGather, nullptr, stream, sendbuff, recvbuff, sendcount,
                             datatype, ncclSum, 0},
                     comm);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return sim::Submit(
      "ncclBroadcast",
      sim::Op{sim::kBroadcast, nullptr, stream, sendbuff, recvbuff, count, datatype, ncclSum, root},
      comm);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return sim::Submit(
      "ncclSend",
      sim::Op{sim::kSend, nullptr, stream, sendbuff, nullptr, count, datatype, ncclSum, peer},
      comm);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return sim::Submit(
      "ncclRecv",
      sim::Op{sim::kRecv, nullptr, stream, nullptr, recvbuff, count, datatype, ncclSum, peer},
      comm);
}

ncclResult_t ncclGroupStart() {
  ++sim::t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (sim::t_group_depth == 0) {
    return sim::Fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  }
  if (--sim::t_group_depth > 0) return ncclSuccess;
  std::vector<sim::Op> ops;
  ops.swap(sim::t_group_ops);
  const ncclResult_t failed = sim::t_group_error;
  sim::t_group_error = ncclSuccess;
  if (failed != ncclSuccess) return failed;  // the failed call's text stays the last error
  if (ops.empty()) return ncclSuccess;
  return sim::Launch(std::move(ops));
}
