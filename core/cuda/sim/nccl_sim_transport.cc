// core/cuda/sim/nccl_sim_transport.cc: the NCCL simulator's transport: sockets, the process's
// listener, setting communicators' meshes up and down, and the messages between ranks that the
// operations of nccl_sim_collectives.cc exchange (nccl_sim.cc has the API).
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
#include "core/cuda/sim/nccl_sim_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <nccl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/sim/nccl_sim_internal.h"

namespace satdar::cuda_sim {
namespace {

using std::chrono::milliseconds;

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

// Whether the other end of `fd` closed (it sends nothing before our reply).
bool HungUp(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && p.revents != 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The process's listener: the root of the ids it made, and the mesh connections of its
// communicators during setup.

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

namespace {

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

}  // namespace

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
          const std::function<bool()>& cancel) {
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

// ---------------------------------------------------------------------------------------------
// Setting communicators up and down.

namespace {

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

// What each rank of the parent tells the others in ncclCommSplit.
struct SplitEntry {
  int32_t color;
  int32_t key;
  Addr addr;
};

}  // namespace

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

}  // namespace satdar::cuda_sim
