// The NCCL communicator (see the header for how it differs from the others). Without an NCCL
// build (no SATDAR_WITH_NCCL, see tools/cuda_configure.bzl) NcclWorld reports that.
#include "comm/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"

#ifdef SATDAR_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/cuda/check.h"
#endif

namespace satdar::comm {

#ifdef SATDAR_WITH_NCCL

namespace {

using core::DType;
using Clock = std::chrono::steady_clock;

Clock::time_point DeadlineAfter(absl::Duration d) {
  return Clock::now() + absl::ToChronoMilliseconds(
                            std::min(std::max(d, absl::ZeroDuration()), absl::Hours(24 * 365)));
}

void Pause() { std::this_thread::sleep_for(std::chrono::microseconds(50)); }

bool ReduceType(DType d, ncclDataType_t* t) {
  switch (d) {
    case DType::kF32: *t = ncclFloat32; return true;
    case DType::kF64: *t = ncclFloat64; return true;
    case DType::kI32: *t = ncclInt32; return true;
    case DType::kI64: *t = ncclInt64; return true;
    case DType::kBF16: *t = ncclBfloat16; return true;
    case DType::kU16: return false;
  }
  return false;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

ncclConfig_t NonBlocking() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

absl::Status NcclError(ncclResult_t r, ncclComm_t comm, const char* call, int rank) {
  return core::cuda::RankCallError(
      absl::StrCat(ncclGetErrorString(r), " (", ncclGetLastError(comm), ")").c_str(), call,
      __FILE__, __LINE__, rank);
}

// Waits while a non-blocking communicator still works on its last call (ncclInProgress).
// `timed_out` tells a deadline from an NCCL error.
absl::Status Settle(ncclComm_t comm, ncclResult_t result, const char* call, int rank,
                    Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  while (result == ncclInProgress) {
    if (Clock::now() > deadline) {
      *timed_out = true;
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank, ": ", call, " is still in ", "progress at its deadline"));
    }
    Pause();
    ncclResult_t q = ncclCommGetAsyncError(comm, &result);
    if (q != ncclSuccess) result = q;
  }
  if (result != ncclSuccess) return NcclError(result, comm, call, rank);
  return absl::OkStatus();
}

struct Event {
  explicit Event(int d) : device(d) {}
  ~Event() {
    if (event != nullptr) {
      int current = device;
      cudaGetDevice(&current);
      cudaSetDevice(device);
      cudaEventDestroy(event);
      cudaSetDevice(current);
    }
  }
  int device;
  cudaEvent_t event = nullptr;
};

// The outcome of one issued operation: an issue-time error, or the event that marks its end.
struct Completion {
  bool issued = false;  // false: a Send/Recv still waiting for the next group to be enqueued
  absl::Status status;
  std::shared_ptr<Event> event;
};

// One NCCL communicator with its stream; shared by the Communicator and its Works.
struct State {
  State(int r, int n, int d) : rank(r), size(n), device(d) {}
  ~State() {
    cudaSetDevice(device);
    if (comm != nullptr) {
      bool clean = broken.ok() && Flush().ok();
      if (clean) {
        // Let the issued operations finish, but never wait forever for a dead peer.
        bool timed_out = false;
        clean = Settle(comm, ncclCommFinalize(comm), "ncclCommFinalize", rank,
                       DeadlineAfter(absl::Seconds(60)), &timed_out)
                    .ok();
      }
      if (clean) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
      comm = nullptr;
    }
    if (barrier != nullptr) cudaFree(barrier);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  absl::Status Init(ncclComm_t c) {
    comm = c;
    SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMalloc(&barrier, sizeof(int32_t)));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(barrier, 0, sizeof(int32_t), stream));
    return absl::OkStatus();
  }

  // Aborts the NCCL communicator after `cause`; every later call fails with FailedPrecondition.
  void Abort(const absl::Status& cause) {
    if (!broken.ok()) return;
    broken = absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " of ", size, ": this NCCL communicator was aborted and cannot be used ",
        "(make a new one); the first error: ", cause.message()));
    if (comm != nullptr) {
      cudaSetDevice(device);
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  // Runs enqueue (NCCL calls on `stream`), settles it and records an event after it.
  absl::StatusOr<std::shared_ptr<Event>> Enqueue(const std::function<ncclResult_t()>& enqueue,
                                                 const char* call, absl::Duration timeout) {
    if (!broken.ok()) return broken;
    SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    bool timed_out = false;
    absl::Status s = Settle(comm, enqueue(), call, rank, DeadlineAfter(timeout), &timed_out);
    if (!s.ok()) {
      Abort(s);
      return s;
    }
    auto event = std::make_shared<Event>(device);
    SATDAR_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event->event, cudaEventDisableTiming));
    SATDAR_CUDA_RETURN_IF_ERROR(cudaEventRecord(event->event, stream));
    return event;
  }

  // Enqueues the pending Send/Recv calls as one NCCL group.
  absl::Status Flush() {
    if (pending.empty()) return absl::OkStatus();
    std::vector<P2p> ops = std::move(pending);
    pending.clear();
    absl::Duration timeout = absl::ZeroDuration();
    for (const P2p& op : ops) timeout = std::max(timeout, op.timeout);
    auto event = Enqueue(
        [&] {
          ncclResult_t first = ncclGroupStart();
          if (first != ncclSuccess) return first;
          for (const P2p& op : ops) {
            ncclResult_t r = op.send
                                 ? ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm, stream)
                                 : ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm, stream);
            if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
          }
          ncclResult_t end = ncclGroupEnd();
          return first != ncclSuccess ? first : end;
        },
        "ncclGroupEnd (Send/Recv)", timeout);
    for (P2p& op : ops) {
      op.done->issued = true;
      if (event.ok()) {
        op.done->event = *event;
      } else {
        op.done->status = event.status();
      }
    }
    return event.status();
  }

  // Waits for the event up to timeout; at the timeout (or an NCCL error) aborts.
  absl::Status WaitFor(const Event& event, const std::string& what, absl::Duration timeout) {
    cudaSetDevice(device);
    const auto deadline = DeadlineAfter(timeout);
    for (;;) {
      // Broken first: once another operation's failure aborted the communicator, the aborted
      // operations' events complete too, with their outputs untouched (found by the CUDA
      // simulator: a later Wait returned OK over garbage).
      if (!broken.ok()) return broken;
      cudaError_t e = cudaEventQuery(event.event);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) {
        absl::Status s = absl::InternalError(
            absl::StrCat(what, " failed: CUDA reports ", cudaGetErrorString(e)));
        Abort(s);
        return s;
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        absl::Status s = absl::UnavailableError(absl::StrCat(
            what, " failed: NCCL reports ", ncclGetErrorString(async), " (", ncclGetLastError(comm),
            "); a peer may have died. The communicator was aborted"));
        Abort(s);
        return s;
      }
      if (Clock::now() > deadline) {
        absl::Status s = absl::DeadlineExceededError(absl::StrCat(
            what, " did not complete within ", absl::FormatDuration(timeout),
            "; the NCCL communicator was aborted (ncclCommAbort). NCCL cannot tell which rank is "
            "missing: look for one that died, is stuck, or issued different operations"));
        Abort(s);
        return s;
      }
      Pause();
    }
  }

  struct P2p {
    bool send;
    void* data;
    size_t bytes;
    int peer;
    absl::Duration timeout;
    std::shared_ptr<Completion> done;
  };

  const int rank;
  const int size;
  const int device;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int32_t* barrier = nullptr;  // Barrier all-reduces this one int
  absl::Status broken;
  std::vector<P2p> pending;
};

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<State> state, std::shared_ptr<Completion> done, std::string what,
           absl::Duration timeout)
      : state_(std::move(state)),
        done_(std::move(done)),
        what_(std::move(what)),
        timeout_(timeout) {}

  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    if (!done_->issued) (void)state_->Flush();  // sets done_'s status or event
    if (!done_->status.ok()) return status_ = done_->status;
    return status_ = state_->WaitFor(*done_->event, what_, timeout_);
  }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<Completion> done_;
  std::string what_;
  absl::Duration timeout_;
  absl::Status status_;
  bool waited_ = false;
};

absl::StatusOr<std::unique_ptr<Communicator>> Wrap(std::shared_ptr<State> state);

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<State> state) : state_(std::move(state)) {}

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }

  std::unique_ptr<Work> AllReduce(void* data, size_t count, DType d, ReduceOp op,
                                  const CollectiveOptions& o) override {
    ncclDataType_t t;
    SATDAR_CHECK(ReduceType(d, &t))
        << "reductions of " << core::DTypeName(d) << " are not supported";
    State* s = state_.get();
    return Issue("AllReduce", o, [=] {
      return ncclAllReduce(data, data, count, t, NcclOp(op), s->comm, s->stream);
    });
  }
  std::unique_ptr<Work> ReduceScatter(const void* in, void* out, size_t count, DType d, ReduceOp op,
                                      const CollectiveOptions& o) override {
    ncclDataType_t t;
    SATDAR_CHECK(ReduceType(d, &t))
        << "reductions of " << core::DTypeName(d) << " are not supported";
    State* s = state_.get();
    return Issue("ReduceScatter", o, [=] {
      return ncclReduceScatter(in, out, count, t, NcclOp(op), s->comm, s->stream);
    });
  }
  std::unique_ptr<Work> AllGather(const void* in, void* out, size_t count, DType d,
                                  const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(d);
    State* s = state_.get();
    return Issue("AllGather", o,
                 [=] { return ncclAllGather(in, out, bytes, ncclUint8, s->comm, s->stream); });
  }
  std::unique_ptr<Work> Broadcast(void* data, size_t count, DType d, int root,
                                  const CollectiveOptions& o) override {
    SATDAR_CHECK(root >= 0 && root < size()) << "Broadcast root " << root << " of " << size();
    const size_t bytes = count * core::DTypeSize(d);
    State* s = state_.get();
    return Issue("Broadcast", o, [=] {
      return ncclBroadcast(data, data, bytes, ncclUint8, root, s->comm, s->stream);
    });
  }
  std::unique_ptr<Work> AllToAllV(const void* in, const std::vector<size_t>& send_counts, void* out,
                                  const std::vector<size_t>& recv_counts, DType d,
                                  const CollectiveOptions& o) override {
    SATDAR_CHECK(static_cast<int>(send_counts.size()) == size() &&
                 static_cast<int>(recv_counts.size()) == size())
        << "AllToAllV needs one count per rank";
    const size_t es = core::DTypeSize(d);
    State* s = state_.get();
    const int n = size();
    return Issue("AllToAllV", o, [=] {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      const char* src = static_cast<const char*>(in);
      char* dst = static_cast<char*>(out);
      for (int p = 0; p < n; ++p) {
        ncclResult_t a = ncclSuccess, b = ncclSuccess;
        if (send_counts[p] > 0)
          a = ncclSend(src, send_counts[p] * es, ncclUint8, p, s->comm, s->stream);
        if (recv_counts[p] > 0)
          b = ncclRecv(dst, recv_counts[p] * es, ncclUint8, p, s->comm, s->stream);
        for (ncclResult_t r : {a, b}) {
          if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
        }
        src += send_counts[p] * es;
        dst += recv_counts[p] * es;
      }
      ncclResult_t end = ncclGroupEnd();
      return first != ncclSuccess ? first : end;
    });
  }
  std::unique_ptr<Work> Send(const void* data, size_t count, DType d, int peer, int tag,
                             const CollectiveOptions& o) override {
    return PointToPoint(true, const_cast<void*>(data), count * core::DTypeSize(d), peer, tag, o);
  }
  std::unique_ptr<Work> Recv(void* data, size_t count, DType d, int peer, int tag,
                             const CollectiveOptions& o) override {
    return PointToPoint(false, data, count * core::DTypeSize(d), peer, tag, o);
  }
  std::unique_ptr<Work> Barrier(const CollectiveOptions& o) override {
    State* s = state_.get();
    return Issue("Barrier", o, [=] {
      return ncclAllReduce(s->barrier, s->barrier, 1, ncclInt32, ncclSum, s->comm, s->stream);
    });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      const CollectiveOptions& o) override {
    State& s = *state_;
    if (!s.broken.ok()) return s.broken;
    if (color < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", s.rank, ": NCCL's Split needs a color >= 0, got ", color));
    }
    SATDAR_RETURN_IF_ERROR(s.Flush());
    SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(s.device));
    const auto deadline = DeadlineAfter(o.timeout);
    ncclConfig_t config = NonBlocking();
    ncclComm_t sub = nullptr;
    bool timed_out = false;
    const ncclResult_t started = ncclCommSplit(s.comm, color, key, &sub, &config);
    absl::Status status = Settle(s.comm, started, "ncclCommSplit", s.rank, deadline, &timed_out);
    if (status.ok() && sub != nullptr) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(sub, &state);
      status = Settle(sub, q != ncclSuccess ? q : state, "ncclCommSplit (new communicator)", s.rank,
                      deadline, &timed_out);
    }
    if (status.ok() && sub == nullptr) {
      status = absl::InternalError(
          absl::StrCat("rank ", s.rank, ": ncclCommSplit gave no communicator"));
    }
    if (!status.ok()) {
      if (sub != nullptr) ncclCommAbort(sub);
      if (timed_out) {
        status = absl::DeadlineExceededError(
            absl::StrCat("rank ", s.rank, " of ", s.size, ": Split did not complete within ",
                         absl::FormatDuration(o.timeout), " (", status.message(),
                         "); the communicator was aborted"));
      }
      s.Abort(status);
      return status;
    }
    int sub_rank = 0, sub_size = 0;
    SATDAR_NCCL_RETURN_IF_ERROR(ncclCommUserRank(sub, &sub_rank), s.rank);
    SATDAR_NCCL_RETURN_IF_ERROR(ncclCommCount(sub, &sub_size), s.rank);
    auto state = std::make_shared<State>(sub_rank, sub_size, s.device);
    SATDAR_RETURN_IF_ERROR(state->Init(sub));
    return Wrap(std::move(state));
  }

 private:
  std::unique_ptr<Work> Issue(const char* name, const CollectiveOptions& o,
                              std::function<ncclResult_t()> enqueue) {
    State& s = *state_;
    auto done = std::make_shared<Completion>();
    done->issued = true;
    auto work = std::make_unique<NcclWork>(
        state_, done, absl::StrCat("rank ", s.rank, " of ", s.size, ": ", name, " #", ++seq_),
        o.timeout);
    absl::Status flushed = s.Flush();  // earlier Send/Recv go first
    if (!flushed.ok()) {
      done->status = flushed;
      return work;
    }
    if (o.ready_event != nullptr) {
      const cudaError_t err =
          cudaStreamWaitEvent(s.stream, static_cast<cudaEvent_t>(o.ready_event), 0);
      if (err != cudaSuccess) {
        done->status = absl::InternalError(
            absl::StrCat("rank ", s.rank, ": cudaStreamWaitEvent (ready_event of ", name,
                         ") failed: ", cudaGetErrorString(err)));
        return work;
      }
    }
    auto event = s.Enqueue(enqueue, name, o.timeout);
    if (event.ok()) {
      done->event = *event;
    } else {
      done->status = event.status();
    }
    return work;
  }

  std::unique_ptr<Work> PointToPoint(bool send, void* data, size_t bytes, int peer, int tag,
                                     const CollectiveOptions& o) {
    State& s = *state_;
    auto done = std::make_shared<Completion>();
    auto work = std::make_unique<NcclWork>(
        state_, done,
        absl::StrCat("rank ", s.rank, ": ", send ? "Send to" : "Recv from", " rank ", peer,
                     " (tag ", tag, ", ignored by NCCL)"),
        o.timeout);
    if (peer < 0 || peer >= s.size) {
      done->issued = true;
      done->status = absl::InvalidArgumentError(absl::StrCat(
          "rank ", s.rank, " of ", s.size, ": peer ", peer, " is not a rank of this group"));
    } else if (!s.broken.ok()) {
      done->issued = true;
      done->status = s.broken;
    } else {
      s.pending.push_back(State::P2p{send, data, bytes, peer, o.timeout, done});
      if (o.enqueue_now) (void)s.Flush();  // a failure is in every flushed call's status
    }
    return work;
  }

  std::shared_ptr<State> state_;
  int64_t seq_ = 0;
};

absl::StatusOr<std::unique_ptr<Communicator>> Wrap(std::shared_ptr<State> state) {
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(std::move(state)));
}

}  // namespace

bool NcclBuilt() { return true; }

absl::StatusOr<std::unique_ptr<Communicator>> NcclWorld(const NcclOptions& options) {
  const int rank = options.rank, n = options.world_size;
  if (n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclWorld: the world size must be at least 1, got ", n));
  }
  if (rank < 0 || rank >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclWorld: rank ", rank, " is not in 0..", n - 1, " (world size ", n, ")"));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("NcclWorld: there is no CUDA GPU on this machine");
  }
  const int device = options.device >= 0 ? options.device : rank % devices;
  if (device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclWorld: device ", device, " does not exist (", devices, " visible)"));
  }
  std::shared_ptr<KvStore> store = options.store;
  if (store == nullptr) {
    if (options.store_dir.empty()) {
      return absl::InvalidArgumentError("NcclWorld: no rendezvous store: set store_dir or store");
    }
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<FileKvStore> file,
                            FileKvStore::Open(options.store_dir));
    store = std::move(file);
  }
  SATDAR_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  // Rank 0 makes the unique id and publishes it; the others read it.
  const std::string key = absl::StrCat(options.prefix, "nccl/world/unique_id");
  ncclUniqueId id;
  if (rank == 0) {
    SATDAR_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), rank);
    SATDAR_RETURN_IF_ERROR(store->Set(key, std::string(id.internal, sizeof(id.internal))));
  } else {
    absl::StatusOr<std::string> v = store->Get(key, options.timeout);
    if (absl::IsDeadlineExceeded(v.status())) {
      return absl::DeadlineExceededError(
          absl::StrCat("NcclWorld: rank ", rank, " of ", n,
                       ": rank 0 never published the NCCL unique id (", v.status().message(), ")"));
    }
    if (!v.ok()) return v.status();
    if (v->size() != sizeof(id.internal)) {
      return absl::InvalidArgumentError(absl::StrCat("NcclWorld: the NCCL unique id under '", key,
                                                     "' has ", v->size(), " bytes, not ",
                                                     sizeof(id.internal)));
    }
    std::copy(v->begin(), v->end(), id.internal);
  }
  ncclConfig_t config = NonBlocking();
  ncclComm_t comm = nullptr;
  bool timed_out = false;
  const auto deadline = DeadlineAfter(options.timeout);
  const ncclResult_t started = ncclCommInitRankConfig(&comm, n, id, rank, &config);
  absl::Status s =
      comm == nullptr ? NcclError(started, comm, "ncclCommInitRankConfig", rank)
                      : Settle(comm, started, "ncclCommInitRankConfig", rank, deadline, &timed_out);
  if (!s.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    if (timed_out) {
      return absl::DeadlineExceededError(
          absl::StrCat("NcclWorld: rank ", rank, " of ", n, ": not every rank joined within ",
                       absl::FormatDuration(options.timeout), " (ncclCommInitRank was aborted)"));
    }
    return s;
  }
  auto state = std::make_shared<State>(rank, n, device);
  SATDAR_RETURN_IF_ERROR(state->Init(comm));
  return Wrap(std::move(state));
}

#else  // !SATDAR_WITH_NCCL

bool NcclBuilt() { return false; }

absl::StatusOr<std::unique_ptr<Communicator>> NcclWorld(const NcclOptions&) {
  return absl::FailedPreconditionError(
      "satdar was built without NCCL (no CUDA toolkit with nccl.h and libnccl.so at build time)");
}

#endif  // SATDAR_WITH_NCCL

}  // namespace satdar::comm
