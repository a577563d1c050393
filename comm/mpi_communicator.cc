#include "comm/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "comm/rank_order_reduce.h"

namespace satdar::comm {

namespace {

using core::DType;

absl::Status MpiError(int code, const char* call, int rank) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return absl::InternalError(absl::StrCat("rank ", rank, ": ", call, " failed: ",
                                          std::string(text, len)));
}

// Buffers of operations that never completed: MPI may still write into them, so they are kept
// until the process ends (it is about to: a timed-out run aborts).
std::vector<std::vector<char>>& Graveyard() {
  static auto* buffers = new std::vector<std::vector<char>>();
  return *buffers;
}

// The first failure of any operation of this process: after it, every other pending or new
// operation (of any communicator: they all share the one MPI job) gives up at once instead of
// waiting out its own timeout. One thread at a time calls MPI (MPI_THREAD_SERIALIZED).
absl::Status& Broken() {
  static auto* broken = new absl::Status();
  return *broken;
}

// Large messages go as chunks of at most this many bytes (MPI counts are ints); both sides
// cut the same byte count the same way, and MPI keeps their order.
constexpr size_t kChunkBytes = size_t{1} << 30;

// One operation: its point-to-point transfers, each with the peer it talks to, so a timeout
// names the ranks that never answered. `finish` runs once all completed (local reductions).
class MpiWork : public Work {
 public:
  MpiWork(int rank, const char* name, absl::Duration timeout)
      : rank_(rank), name_(name), timeout_(timeout) {}
  ~MpiWork() override {
    if (waited_) return;
    if (Broken().ok()) {
      (void)Wait();  // the transfers still use our buffers
    } else {
      Graveyard().push_back(std::move(buffer_));
    }
  }
  std::vector<char>& buffer() { return buffer_; }
  void set_finish(std::function<void()> f) { finish_ = std::move(f); }

  // Posts a send of (or a receive into) data[0, bytes) to or from peer, in chunks. A post that
  // fails breaks the communicators: the peers would match this operation's messages wrongly.
  void Post(bool send, const void* data, size_t bytes, int peer, int tag, MPI_Comm comm) {
    if (!status_.ok()) return;
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    do {
      const size_t n = std::min(bytes - done, kChunkBytes);
      transfers_.push_back(Transfer{MPI_REQUEST_NULL, peer});
      MPI_Request* r = &transfers_.back().request;
      void* at = const_cast<char*>(p + done);
      const int count = static_cast<int>(n);
      const int rc = send ? MPI_Isend(at, count, MPI_BYTE, peer, tag, comm, r)
                          : MPI_Irecv(at, count, MPI_BYTE, peer, tag, comm, r);
      if (rc != MPI_SUCCESS) {
        (void)Break(MpiError(rc, send ? "MPI_Isend" : "MPI_Irecv", rank_));
        return;
      }
      done += n;
    } while (done < bytes);
  }

  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    if (!status_.ok()) {
      Graveyard().push_back(std::move(buffer_));
      return status_;
    }
    if (!Broken().ok()) {
      Graveyard().push_back(std::move(buffer_));
      return status_ = Broken();
    }
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout_);
    for (;;) {
      bool all = true;
      for (Transfer& t : transfers_) {
        if (t.request == MPI_REQUEST_NULL) continue;
        int done = 0;
        const int rc = MPI_Test(&t.request, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return Break(MpiError(rc, name_, rank_));
        all &= done != 0;
      }
      if (all) break;
      if (std::chrono::steady_clock::now() > deadline) {
        std::vector<int> late;
        for (const Transfer& t : transfers_) {
          if (t.request != MPI_REQUEST_NULL) late.push_back(t.peer);
        }
        std::sort(late.begin(), late.end());
        late.erase(std::unique(late.begin(), late.end()), late.end());
        Graveyard().push_back(std::move(buffer_));
        return Break(absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank_, ": ", name_, " timed out after ",
            absl::FormatDuration(timeout_), "; ranks that never arrived: ",
            absl::StrJoin(late, ", "), " (stopped, stuck or dead)")));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (finish_) finish_();
    return status_;
  }

 private:
  struct Transfer {
    MPI_Request request;
    int peer;
  };
  absl::Status Break(absl::Status s) {
    if (Broken().ok()) Broken() = s;
    return status_ = std::move(s);
  }

  int rank_;
  const char* name_;
  absl::Duration timeout_;
  std::deque<Transfer> transfers_;  // stable addresses for the MPI_Request handles
  absl::Status status_;
  std::vector<char> buffer_;
  std::function<void()> finish_;
  bool waited_ = false;
};

// Collectives are direct exchanges with every peer, over a duplicate of the communicator
// (so they never match a user's Send/Recv) with one tag: MPI delivers messages between two
// ranks in order, and every rank issues the collectives in the same order.
constexpr int kCollectiveTag = 0;

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_dup(comm_, &collectives_);
    MPI_Comm_set_errhandler(collectives_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    if (!Broken().ok()) return;  // a peer is gone: freeing would wait for it
    MPI_Comm_free(&collectives_);
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Work> AllReduce(void* data, size_t count, DType d, ReduceOp op,
                                  const CollectiveOptions& o) override {
    // Gather every contribution, then add in rank order (identical on every rank).
    const size_t bytes = count * core::DTypeSize(d);
    auto w = NewWork("AllReduce", o);
    w->buffer().resize(bytes * size_);
    char* all = w->buffer().data();
    std::memcpy(all + rank_ * bytes, data, bytes);
    Exchange(w.get(), [&](int p) { return std::pair<const void*, void*>(data, all + p * bytes); },
             bytes);
    MpiWork* raw = w.get();
    w->set_finish([=] { RankOrderReduce(data, raw->buffer().data(), size_, count, d, op); });
    return w;
  }
  std::unique_ptr<Work> ReduceScatter(const void* in, void* out, size_t count, DType d,
                                      ReduceOp op, const CollectiveOptions& o) override {
    // Block r of every rank goes to rank r, which adds them in rank order.
    const size_t bytes = count * core::DTypeSize(d);
    auto w = NewWork("ReduceScatter", o);
    w->buffer().resize(bytes * size_);
    char* all = w->buffer().data();
    const char* src = static_cast<const char*>(in);
    std::memcpy(all + rank_ * bytes, src + rank_ * bytes, bytes);
    Exchange(w.get(),
             [&](int p) { return std::pair<const void*, void*>(src + p * bytes, all + p * bytes); },
             bytes);
    MpiWork* raw = w.get();
    w->set_finish([=] { RankOrderReduce(out, raw->buffer().data(), size_, count, d, op); });
    return w;
  }
  std::unique_ptr<Work> AllGather(const void* in, void* out, size_t count, DType d,
                                  const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(d);
    auto w = NewWork("AllGather", o);
    char* dst = static_cast<char*>(out);
    std::memmove(dst + rank_ * bytes, in, bytes);
    const void* mine = dst + rank_ * bytes;
    Exchange(w.get(), [&](int p) { return std::pair<const void*, void*>(mine, dst + p * bytes); },
             bytes);
    return w;
  }
  std::unique_ptr<Work> Broadcast(void* data, size_t count, DType d, int root,
                                  const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(d);
    auto w = NewWork("Broadcast", o);
    if (rank_ == root) {
      for (int p = 0; p < size_; ++p) {
        if (p != rank_) w->Post(true, data, bytes, p, kCollectiveTag, collectives_);
      }
    } else {
      w->Post(false, data, bytes, root, kCollectiveTag, collectives_);
    }
    return w;
  }
  std::unique_ptr<Work> AllToAllV(const void* in, const std::vector<size_t>& send_counts,
                                  void* out, const std::vector<size_t>& recv_counts, DType d,
                                  const CollectiveOptions& o) override {
    const size_t width = core::DTypeSize(d);
    auto w = NewWork("AllToAllV", o);
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    size_t so = 0, ro = 0;
    for (int p = 0; p < size_; ++p) {
      const size_t sb = send_counts[p] * width, rb = recv_counts[p] * width;
      if (p == rank_) {
        SATDAR_CHECK(sb == rb) << "AllToAllV: " << sb << " bytes to self, " << rb << " expected";
        std::memcpy(dst + ro, src + so, sb);
      } else {
        w->Post(false, dst + ro, rb, p, kCollectiveTag, collectives_);
        w->Post(true, src + so, sb, p, kCollectiveTag, collectives_);
      }
      so += sb;
      ro += rb;
    }
    return w;
  }
  std::unique_ptr<Work> Send(const void* data, size_t count, DType d, int peer, int tag,
                             const CollectiveOptions& o) override {
    auto w = NewWork("Send", o);
    w->Post(true, data, count * core::DTypeSize(d), peer, tag, comm_);
    return w;
  }
  std::unique_ptr<Work> Recv(void* data, size_t count, DType d, int peer, int tag,
                             const CollectiveOptions& o) override {
    auto w = NewWork("Recv", o);
    w->Post(false, data, count * core::DTypeSize(d), peer, tag, comm_);
    return w;
  }
  std::unique_ptr<Work> Barrier(const CollectiveOptions& o) override {
    auto w = NewWork("Barrier", o);
    static char token;
    Exchange(w.get(), [&](int) { return std::pair<const void*, void*>(&token, &token); }, 0);
    return w;
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      const CollectiveOptions& o) override {
    (void)o;
    MPI_Comm sub;
    int rc = MPI_Comm_split(comm_, color, key, &sub);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Comm_split", rank_);
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(sub, true));
  }

 private:
  std::unique_ptr<MpiWork> NewWork(const char* name, const CollectiveOptions& o) {
    return std::make_unique<MpiWork>(rank_, name, o.timeout);
  }
  // For every peer p: receive `bytes` into the second pointer of buffers(p) and send the first.
  template <typename F>
  void Exchange(MpiWork* w, const F& buffers, size_t bytes) {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto [send, recv] = buffers(p);
      w->Post(false, recv, bytes, p, kCollectiveTag, collectives_);
      w->Post(true, send, bytes, p, kCollectiveTag, collectives_);
    }
  }

  MPI_Comm comm_;
  MPI_Comm collectives_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MpiWorld(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      return absl::InternalError("MPI_Init_thread failed");
    }
  }
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false));
}

void MpiAbort(int exit_code) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

void MpiFinalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace satdar::comm
