// The Gloo communicator. This is the only file of satdar compiled with exceptions (Gloo reports
// errors by throwing): every Gloo call is made inside a try block here, and what it throws
// becomes an absl::Status before it leaves this file. Nothing of Gloo is in the header.
#include "comm/gloo_communicator.h"

#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "comm/rank_order_reduce.h"

namespace satdar::comm {

namespace {

using core::DType;
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// Deadlines further away than this are treated as "a year" (no overflow of time points).
Millis ToMillis(absl::Duration d) {
  return absl::ToChronoMilliseconds(
      std::min(std::max(d, absl::ZeroDuration()), absl::Hours(24 * 365)));
}

std::string ExceptionText() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// ---- the KvStore seen as Gloo's rendezvous store ----

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(KvStore* kv, std::string prefix, absl::Duration timeout)
      : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = kv_->Set(prefix_ + key, std::string(data.begin(), data.end()));
    if (!s.ok()) Fail(std::move(s));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = kv_->Get(prefix_ + key, timeout_);
    if (!v.ok()) Fail(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, ToMillis(timeout_)); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    const Millis limit = timeout.count() > 0 ? timeout : ToMillis(timeout_);
    const auto deadline = Clock::now() + limit;
    for (const std::string& key : keys) {
      const auto left =
          std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
      absl::StatusOr<std::string> v = kv_->Get(prefix_ + key, absl::FromChrono(left));
      if (!v.ok()) Fail(v.status());
    }
  }
  // The store error behind the last exception this store threw (OK if none).
  const absl::Status& error() const { return error_; }

 private:
  [[noreturn]] void Fail(absl::Status s) {
    error_ = std::move(s);
    throw gloo::IoException(std::string(error_.message()));
  }

  KvStore* kv_;
  std::string prefix_;
  absl::Duration timeout_;
  absl::Status error_;
};

// ---- waiting with a deadline, without Gloo's own timeout ----
//
// When Gloo's waitSend/waitRecv time out they close every connection of the context, so the
// peers see "connection closed" from a rank that merely gave up, and blame it. Instead the
// waits here are cut short at their deadline by this thread (abortWaitSend/abortWaitRecv),
// which leaves the connections alone; Gloo's timeout stays a backstop a minute later.
class Watchdog {
 public:
  Watchdog() : thread_([this] { Run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // true: the pending send (or recv) of buf completed; false: deadline passed first. Throws
  // what Gloo throws when the connection failed.
  bool Wait(gloo::transport::UnboundBuffer* buf, bool send, Clock::time_point deadline) {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id = next_id_++;
      entries_[id] = Entry{buf, send, deadline, false};
    }
    cv_.notify_all();
    const Millis backstop =
        std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now())) +
        std::chrono::minutes(1);
    bool done = false;
    std::exception_ptr error;
    try {
      done = send ? buf->waitSend(nullptr, backstop) : buf->waitRecv(nullptr, backstop);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      entries_.erase(id);
    }
    if (error) std::rethrow_exception(error);
    return done;
  }

 private:
  struct Entry {
    gloo::transport::UnboundBuffer* buf;
    bool send;
    Clock::time_point deadline;
    bool fired;
  };

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      auto next = Clock::time_point::max();
      const auto now = Clock::now();
      for (auto& [id, e] : entries_) {
        if (e.fired) continue;
        if (e.deadline <= now) {
          // The waiting thread removes the entry (under mu_) before the buffer can go away.
          try {
            if (e.send) {
              e.buf->abortWaitSend();
            } else {
              e.buf->abortWaitRecv();
            }
          } catch (...) {
          }
          e.fired = true;
        } else {
          next = std::min(next, e.deadline);
        }
      }
      if (next == Clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, next);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is initialised
};

// What one communicator's Works share.
struct Shared {
  Shared(int r, int n) : rank(r), size(n) {}
  const int rank;
  const int size;
  std::shared_ptr<gloo::Context> context;  // null for a group of one
  Watchdog watchdog;
  std::mutex mu;
  absl::Status broken;  // set by the first failed operation

  void Break(const absl::Status& cause) {
    std::lock_guard<std::mutex> lock(mu);
    if (broken.ok()) {
      broken = absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " of ", size, ": this Gloo communicator failed earlier and cannot be ",
          "used any more (make a new one); the first error: ", cause.message()));
    }
  }
  absl::Status Broken() {
    std::lock_guard<std::mutex> lock(mu);
    return broken;
  }
};

// The transfers of one operation, posted when it is issued.
class GlooWork : public Work {
 public:
  GlooWork(std::shared_ptr<Shared> shared, std::string what, absl::Duration timeout)
      : shared_(std::move(shared)), what_(std::move(what)), timeout_(timeout) {}
  ~GlooWork() override {
    if (!waited_) (void)Wait();  // the transfers still use our buffers
  }

  bool failed() const { return !status_.ok(); }
  void Fail(absl::Status s) { status_ = std::move(s); }
  std::vector<char>& scratch() { return scratch_; }
  void set_finish(std::function<void()> f) { finish_ = std::move(f); }

  // Posts a send of (or a receive into) ptr[0, bytes) to/from peer on slot.
  void Post(int peer, bool send, void* ptr, size_t bytes, uint64_t slot) {
    static char empty;
    if (bytes == 0) ptr = &empty;
    Transfer t;
    t.peer = peer;
    t.send = send;
    try {
      t.buf = shared_->context->createUnboundBuffer(ptr, bytes);
      if (send) {
        t.buf->send(peer, slot, 0, bytes);
      } else {
        t.buf->recv(peer, slot, 0, bytes);
      }
      t.posted = true;
    } catch (...) {
      t.error = ExceptionText();  // the connection to peer is already gone
    }
    transfers_.push_back(std::move(t));
  }

  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    if (!status_.ok()) return status_;
    // After one operation failed, the others (and the destructors of Works never waited for)
    // give up at once instead of each waiting out its own timeout. Gloo holds only weak
    // references to our buffers, so dropping them with transfers pending is safe.
    if (absl::Status broken = shared_->Broken(); !broken.ok()) return status_ = broken;
    const auto deadline = Clock::now() + ToMillis(timeout_);
    std::vector<int> late, lost;
    std::string lost_detail;
    bool timed_out = false;
    for (Transfer& t : transfers_) {
      if (!t.posted) {
        lost.push_back(t.peer);
        lost_detail = t.error;
        continue;
      }
      // Once one transfer ran out of time, only look whether the others are done.
      const auto until = timed_out ? Clock::now() + Millis(1) : deadline;
      try {
        if (!shared_->watchdog.Wait(t.buf.get(), t.send, until)) {
          timed_out = true;
          late.push_back(t.peer);
        }
      } catch (...) {
        const std::string text = ExceptionText();
        if (Clock::now() >= deadline) {
          late.push_back(t.peer);  // it failed after we had given up on it
        } else {
          lost.push_back(t.peer);
          lost_detail = text;
        }
      }
    }
    if (late.empty() && lost.empty()) {
      if (finish_) finish_();
      return status_;
    }
    auto unique = [](std::vector<int>& v) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    };
    unique(lost);
    unique(late);
    late.erase(std::remove_if(late.begin(), late.end(),
                              [&](int p) { return std::count(lost.begin(), lost.end(), p) > 0; }),
               late.end());
    if (!lost.empty()) {
      status_ = absl::UnavailableError(absl::StrCat(
          what_, " failed: lost the connection to rank", lost.size() > 1 ? "s " : " ",
          absl::StrJoin(lost, ", "), " (", lost_detail, ")",
          late.empty() ? ""
                       : absl::StrCat("; ranks that never arrived: ", absl::StrJoin(late, ", "))));
    } else {
      status_ = absl::DeadlineExceededError(
          absl::StrCat(what_, " timed out after ", absl::FormatDuration(timeout_),
                       "; ranks that never arrived: ", absl::StrJoin(late, ", ")));
    }
    shared_->Break(status_);
    return status_;
  }

 private:
  struct Transfer {
    int peer = -1;
    bool send = false;
    bool posted = false;
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    std::string error;
  };

  std::shared_ptr<Shared> shared_;
  std::string what_;
  absl::Duration timeout_;
  std::vector<char> scratch_;
  std::vector<Transfer> transfers_;
  std::function<void()> finish_;
  absl::Status status_;
  bool waited_ = false;
};

// Point-to-point messages use slots with this bit set (and the tag below); collectives use
// their sequence number, which is the same on every rank.
constexpr uint64_t kP2pSlot = uint64_t{1} << 62;

absl::StatusOr<std::unique_ptr<Communicator>> Connect(
    int rank, int size, std::shared_ptr<gloo::transport::Device> device,
    std::shared_ptr<KvStore> store, const std::string& ns, absl::Duration timeout);

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Shared> shared, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<KvStore> store, std::string ns)
      : shared_(std::move(shared)),
        device_(std::move(device)),
        store_(std::move(store)),
        ns_(std::move(ns)) {}

  int rank() const override { return shared_->rank; }
  int size() const override { return shared_->size; }

  std::unique_ptr<Work> AllReduce(void* data, size_t count, DType d, ReduceOp op,
                                  const CollectiveOptions& o) override {
    SATDAR_CHECK(RankOrderReducible(d)) << "reductions of " << core::DTypeName(d) << " are not supported";
    const size_t bytes = count * core::DTypeSize(d);
    uint64_t slot;
    auto w = Start("AllReduce", o, &slot);
    if (w->failed()) return w;
    // Gather every contribution, then add in rank order (identical on every rank).
    char* all = Scratch(w.get(), bytes * size());
    std::memcpy(all + rank() * bytes, data, bytes);
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      w->Post(p, true, all + rank() * bytes, bytes, slot);
      w->Post(p, false, all + p * bytes, bytes, slot);
    }
    const int n = size();
    w->set_finish([=] { RankOrderReduce(data, all, n, count, d, op); });
    return w;
  }

  std::unique_ptr<Work> ReduceScatter(const void* in, void* out, size_t count, DType d, ReduceOp op,
                                      const CollectiveOptions& o) override {
    SATDAR_CHECK(RankOrderReducible(d)) << "reductions of " << core::DTypeName(d) << " are not supported";
    const size_t bytes = count * core::DTypeSize(d);
    uint64_t slot;
    auto w = Start("ReduceScatter", o, &slot);
    if (w->failed()) return w;
    // Block p of every rank goes to rank p, which adds them in rank order.
    char* src = const_cast<char*>(static_cast<const char*>(in));
    char* blocks = Scratch(w.get(), bytes * size());
    std::memcpy(blocks + rank() * bytes, src + rank() * bytes, bytes);
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      w->Post(p, true, src + p * bytes, bytes, slot);
      w->Post(p, false, blocks + p * bytes, bytes, slot);
    }
    const int n = size();
    w->set_finish([=] { RankOrderReduce(out, blocks, n, count, d, op); });
    return w;
  }

  std::unique_ptr<Work> AllGather(const void* in, void* out, size_t count, DType d,
                                  const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(d);
    uint64_t slot;
    auto w = Start("AllGather", o, &slot);
    if (w->failed()) return w;
    char* dst = static_cast<char*>(out);
    std::memmove(dst + rank() * bytes, in, bytes);
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      w->Post(p, true, dst + rank() * bytes, bytes, slot);
      w->Post(p, false, dst + p * bytes, bytes, slot);
    }
    return w;
  }

  std::unique_ptr<Work> Broadcast(void* data, size_t count, DType d, int root,
                                  const CollectiveOptions& o) override {
    SATDAR_CHECK(root >= 0 && root < size()) << "Broadcast root " << root << " of " << size();
    const size_t bytes = count * core::DTypeSize(d);
    uint64_t slot;
    auto w = Start("Broadcast", o, &slot);
    if (w->failed()) return w;
    if (rank() == root) {
      for (int p = 0; p < size(); ++p) {
        if (p != root) w->Post(p, true, data, bytes, slot);
      }
    } else {
      w->Post(root, false, data, bytes, slot);
    }
    return w;
  }

  std::unique_ptr<Work> AllToAllV(const void* in, const std::vector<size_t>& send_counts, void* out,
                                  const std::vector<size_t>& recv_counts, DType d,
                                  const CollectiveOptions& o) override {
    SATDAR_CHECK(static_cast<int>(send_counts.size()) == size() &&
                 static_cast<int>(recv_counts.size()) == size())
        << "AllToAllV needs one count per rank";
    const size_t es = core::DTypeSize(d);
    uint64_t slot;
    auto w = Start("AllToAllV", o, &slot);
    if (w->failed()) return w;
    if (send_counts[rank()] != recv_counts[rank()]) {
      w->Fail(absl::InvalidArgumentError(
          absl::StrCat("AllToAllV: rank ", rank(), " sends ", send_counts[rank()],
                       " elements to itself but ", "expects ", recv_counts[rank()])));
      return w;
    }
    char* src = const_cast<char*>(static_cast<const char*>(in));
    char* dst = static_cast<char*>(out);
    size_t so = 0, ro = 0;
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) {
        std::memcpy(dst + ro * es, src + so * es, send_counts[p] * es);
      } else {
        w->Post(p, true, src + so * es, send_counts[p] * es, slot);
        w->Post(p, false, dst + ro * es, recv_counts[p] * es, slot);
      }
      so += send_counts[p];
      ro += recv_counts[p];
    }
    return w;
  }

  std::unique_ptr<Work> Send(const void* data, size_t count, DType d, int peer, int tag,
                             const CollectiveOptions& o) override {
    auto w = std::make_unique<GlooWork>(
        shared_, absl::StrCat("rank ", rank(), ": Send to rank ", peer, " (tag ", tag, ")"),
        o.timeout);
    if (CheckPeer(w.get(), peer)) {
      w->Post(peer, true, const_cast<void*>(data), count * core::DTypeSize(d), P2pSlot(tag));
    }
    return w;
  }

  std::unique_ptr<Work> Recv(void* data, size_t count, DType d, int peer, int tag,
                             const CollectiveOptions& o) override {
    auto w = std::make_unique<GlooWork>(
        shared_, absl::StrCat("rank ", rank(), ": Recv from rank ", peer, " (tag ", tag, ")"),
        o.timeout);
    if (CheckPeer(w.get(), peer)) {
      w->Post(peer, false, data, count * core::DTypeSize(d), P2pSlot(tag));
    }
    return w;
  }

  std::unique_ptr<Work> Barrier(const CollectiveOptions& o) override {
    uint64_t slot;
    auto w = Start("Barrier", o, &slot);
    if (w->failed()) return w;
    char* flags = Scratch(w.get(), size());
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      w->Post(p, true, flags + rank(), 1, slot);
      w->Post(p, false, flags + p, 1, slot);
    }
    return w;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      const CollectiveOptions& o) override {
    // Everyone learns everyone's (color, key); each color then meets in its own namespace of
    // the store, unique to this Split call.
    const int32_t mine[2] = {color, key};
    std::vector<int32_t> all(2 * size());
    SATDAR_RETURN_IF_ERROR(AllGather(mine, all.data(), 2, DType::kI32, o)->Wait());
    std::vector<std::pair<int, int>> members;  // (key, old rank) of this color
    for (int p = 0; p < size(); ++p) {
      if (all[2 * p] == color) members.emplace_back(all[2 * p + 1], p);
    }
    std::sort(members.begin(), members.end());
    int new_rank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank()) new_rank = static_cast<int>(i);
    }
    const int64_t split = splits_++;
    return Connect(new_rank, static_cast<int>(members.size()), device_, store_,
                   absl::StrCat(ns_, "split", split, "/color", color, "/"), o.timeout);
  }

 private:
  // A Work for the next collective; *slot is its slot. Fails at once on a broken communicator.
  std::unique_ptr<GlooWork> Start(const char* name, const CollectiveOptions& o, uint64_t* slot) {
    const uint64_t seq = ++seq_;
    *slot = seq;
    auto w = std::make_unique<GlooWork>(
        shared_, absl::StrCat("rank ", rank(), " of ", size(), ": ", name, " #", seq), o.timeout);
    absl::Status broken = shared_->Broken();
    if (!broken.ok()) w->Fail(broken);
    return w;
  }

  bool CheckPeer(GlooWork* w, int peer) {
    if (peer < 0 || peer >= size() || peer == rank()) {
      w->Fail(absl::InvalidArgumentError(absl::StrCat("rank ", rank(), " of ", size(), ": peer ",
                                                      peer, " is not another rank of this group")));
      return false;
    }
    absl::Status broken = shared_->Broken();
    if (!broken.ok()) {
      w->Fail(broken);
      return false;
    }
    return true;
  }

  static uint64_t P2pSlot(int tag) { return kP2pSlot | static_cast<uint32_t>(tag); }

  static char* Scratch(GlooWork* w, size_t bytes) {
    w->scratch().assign(std::max<size_t>(bytes, 1), 0);
    return w->scratch().data();
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<KvStore> store_;
  std::string ns_;
  uint64_t seq_ = 0;    // collectives issued (the issuing thread only)
  int64_t splits_ = 0;  // Split calls so far
};

// Meets the other `size` ranks under namespace ns of the store and connects to all of them.
absl::StatusOr<std::unique_ptr<Communicator>> Connect(
    int rank, int size, std::shared_ptr<gloo::transport::Device> device,
    std::shared_ptr<KvStore> store, const std::string& ns, absl::Duration timeout) {
  auto shared = std::make_shared<Shared>(rank, size);
  const std::string who = absl::StrCat("rank ", rank, " of ", size);
  if (size > 1) {
    // First everyone says it is here, so that a missing rank is named (Gloo's own rendezvous
    // would only say which key it was waiting for).
    SATDAR_RETURN_IF_ERROR(store->Set(absl::StrCat(ns, "arrived/", rank), "1"));
    const auto deadline = Clock::now() + ToMillis(timeout);
    std::vector<int> missing;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const std::string key = absl::StrCat(ns, "arrived/", p);
      const auto left =
          std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
      absl::StatusOr<std::string> v =
          missing.empty() ? store->Get(key, absl::FromChrono(left)) : store->TryGet(key);
      if (absl::IsDeadlineExceeded(v.status()) || absl::IsNotFound(v.status())) {
        missing.push_back(p);
      } else if (!v.ok()) {
        return absl::UnavailableError(
            absl::StrCat(who, ": the rendezvous store is not reachable: ", v.status().message()));
      }
    }
    if (!missing.empty()) {
      return absl::DeadlineExceededError(absl::StrCat(
          who, ": Gloo rendezvous under '", ns, "' timed out after ", absl::FormatDuration(timeout),
          "; ranks that never arrived: ", absl::StrJoin(missing, ", ")));
    }
    GlooStore gloo_store(store.get(), absl::StrCat(ns, "mesh/"), timeout);
    try {
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(ToMillis(timeout));
      context->connectFullMesh(gloo_store, device);
      shared->context = std::move(context);
    } catch (...) {
      const std::string text = ExceptionText();
      if (absl::IsDeadlineExceeded(gloo_store.error())) {
        return absl::DeadlineExceededError(
            absl::StrCat(who, ": Gloo rendezvous under '", ns, "' timed out: ", text));
      }
      return absl::UnavailableError(
          absl::StrCat(who, ": cannot connect to the other ranks: ", text));
    }
  }
  return std::unique_ptr<Communicator>(std::make_unique<GlooCommunicator>(
      std::move(shared), std::move(device), std::move(store), ns));
}

void IgnoreSigpipe() {
  struct sigaction old;
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO)) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> GlooWorld(const GlooOptions& options) {
  if (options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooWorld: the world size must be at least 1, got ", options.world_size));
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("GlooWorld: rank ", options.rank,
                                                   " is not in 0..", options.world_size - 1,
                                                   " (world size ", options.world_size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("GlooWorld: the timeout must be positive, got ",
                                                   absl::FormatDuration(options.timeout)));
  }
  std::shared_ptr<KvStore> store = options.store;
  if (store == nullptr) {
    if (options.store_dir.empty()) {
      return absl::InvalidArgumentError(
          "GlooWorld: no rendezvous store: set store_dir (SATDAR_RENDEZVOUS_DIR) or store");
    }
    absl::StatusOr<std::unique_ptr<FileKvStore>> file = FileKvStore::Open(options.store_dir);
    if (!file.ok()) {
      return absl::Status(file.status().code(),
                          absl::StrCat("GlooWorld: ", file.status().message()));
    }
    store = std::move(*file);
  }
  IgnoreSigpipe();
  std::shared_ptr<gloo::transport::Device> device;
  const std::string where = options.interface.empty()
                                ? absl::StrCat("host '", options.hostname, "'")
                                : absl::StrCat("interface '", options.interface, "'");
  if (options.interface.empty()) {
    // Gloo's own lookup crashes on a name that does not resolve (it only checks for -1).
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* found = nullptr;
    const int rv = getaddrinfo(options.hostname.c_str(), nullptr, &hints, &found);
    if (rv != 0 || found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("GlooWorld: cannot listen on ", where, ": ",
                                                     rv != 0 ? gai_strerror(rv) : "no address"));
    }
    freeaddrinfo(found);
  }
  try {
    gloo::transport::tcp::attr attr;
    if (options.interface.empty()) {
      attr.hostname = options.hostname;
    } else {
      attr.iface = options.interface;
    }
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (...) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooWorld: cannot listen on ", where, ": ", ExceptionText()));
  }
  return Connect(options.rank, options.world_size, std::move(device), std::move(store),
                 absl::StrCat(options.prefix, "gloo/world/"), options.timeout);
}

absl::StatusOr<GlooOptions> GlooOptionsFromEnv() {
  GlooOptions o;
  auto get = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  auto get_int = [&](const char* name, int* out) -> absl::Status {
    const std::string v = get(name);
    if (v.empty())
      return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, " is not set"));
    if (!absl::SimpleAtoi(v, out)) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, " must be an integer, got '", v, "'"));
    }
    return absl::OkStatus();
  };
  SATDAR_RETURN_IF_ERROR(get_int("SATDAR_RANK", &o.rank));
  SATDAR_RETURN_IF_ERROR(get_int("SATDAR_WORLD_SIZE", &o.world_size));
  o.store_dir = get("SATDAR_RENDEZVOUS_DIR");
  if (o.store_dir.empty()) {
    return absl::InvalidArgumentError("environment variable SATDAR_RENDEZVOUS_DIR is not set");
  }
  o.prefix = get("SATDAR_RENDEZVOUS_PREFIX");
  o.interface = get("SATDAR_GLOO_IFACE");
  if (!get("SATDAR_GLOO_HOST").empty()) o.hostname = get("SATDAR_GLOO_HOST");
  const std::string t = get("SATDAR_TIMEOUT_S");
  if (!t.empty()) {
    double seconds = 0;
    if (!absl::SimpleAtod(t, &seconds) || !(seconds > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable SATDAR_TIMEOUT_S must be a positive number of seconds, got '", t,
          "'"));
    }
    o.timeout = absl::Seconds(seconds);
  }
  return o;
}

}  // namespace satdar::comm
