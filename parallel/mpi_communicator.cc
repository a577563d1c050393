#include "parallel/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "parallel/rank_order_reduce.h"

namespace satdar::parallel {

namespace {

using core::DType;

MPI_Datatype MpiType(DType d) {
  switch (d) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU16: return MPI_UINT16_T;
    case DType::kBF16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

absl::Status MpiError(int code, const char* call, int rank) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return absl::InternalError(absl::StrCat("rank ", rank, ": ", call, " failed: ",
                                          std::string(text, len)));
}

// A pending non-blocking operation; `finish` runs once it completed (local reductions).
class MpiWork : public Work {
 public:
  MpiWork(int rank, const char* name, absl::Duration timeout)
      : rank_(rank), name_(name), timeout_(timeout) {}
  MPI_Request* request() { return &request_; }
  void set_status(absl::Status s) { status_ = std::move(s); }
  std::vector<char>& buffer() { return buffer_; }
  void set_finish(std::function<void()> f) { finish_ = std::move(f); }

  absl::Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    if (!status_.ok() || request_ == MPI_REQUEST_NULL) return status_;
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout_);
    for (int done = 0;;) {
      int rc = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return status_ = MpiError(rc, name_, rank_);
      if (done) break;
      if (std::chrono::steady_clock::now() > deadline) {
        return status_ = absl::DeadlineExceededError(absl::StrCat(
                   "rank ", rank_, ": ", name_, " did not complete within ",
                   absl::FormatDuration(timeout_), " (a peer is dead or stuck)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (finish_) finish_();
    return status_;
  }

 private:
  int rank_;
  const char* name_;
  absl::Duration timeout_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  absl::Status status_;
  std::vector<char> buffer_;
  std::function<void()> finish_;
  bool waited_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Work> AllReduce(void* data, size_t count, DType d, ReduceOp op,
                                  const CollectiveOptions& o) override {
    // Gather every contribution, then add in rank order (identical on every rank).
    const size_t bytes = count * core::DTypeSize(d);
    auto w = std::make_unique<MpiWork>(rank_, "AllReduce", o.timeout);
    w->buffer().resize(bytes * size_);
    Check(w.get(), MPI_Iallgather(data, static_cast<int>(bytes), MPI_BYTE, w->buffer().data(),
                                  static_cast<int>(bytes), MPI_BYTE, comm_, w->request()),
          "MPI_Iallgather");
    MpiWork* raw = w.get();
    w->set_finish([=] { RankOrderReduce(data, raw->buffer().data(), size_, count, d, op); });
    return w;
  }
  std::unique_ptr<Work> ReduceScatter(const void* in, void* out, size_t count, DType d,
                                      ReduceOp op, const CollectiveOptions& o) override {
    // Block r of every rank goes to rank r, which adds them in rank order.
    const size_t bytes = count * core::DTypeSize(d);
    auto w = std::make_unique<MpiWork>(rank_, "ReduceScatter", o.timeout);
    w->buffer().resize(bytes * size_);
    Check(w.get(), MPI_Ialltoall(in, static_cast<int>(bytes), MPI_BYTE, w->buffer().data(),
                                 static_cast<int>(bytes), MPI_BYTE, comm_, w->request()),
          "MPI_Ialltoall");
    MpiWork* raw = w.get();
    w->set_finish([=] { RankOrderReduce(out, raw->buffer().data(), size_, count, d, op); });
    return w;
  }
  std::unique_ptr<Work> AllGather(const void* in, void* out, size_t count, DType d,
                                  const CollectiveOptions& o) override {
    auto w = std::make_unique<MpiWork>(rank_, "AllGather", o.timeout);
    Check(w.get(), MPI_Iallgather(in, static_cast<int>(count), MpiType(d), out,
                                  static_cast<int>(count), MpiType(d), comm_, w->request()),
          "MPI_Iallgather");
    return w;
  }
  std::unique_ptr<Work> Broadcast(void* data, size_t count, DType d, int root,
                                  const CollectiveOptions& o) override {
    auto w = std::make_unique<MpiWork>(rank_, "Broadcast", o.timeout);
    Check(w.get(), MPI_Ibcast(data, static_cast<int>(count), MpiType(d), root, comm_, w->request()),
          "MPI_Ibcast");
    return w;
  }
  std::unique_ptr<Work> AllToAllV(const void* in, const std::vector<size_t>& send_counts,
                                  void* out, const std::vector<size_t>& recv_counts, DType d,
                                  const CollectiveOptions& o) override {
    auto w = std::make_unique<MpiWork>(rank_, "AllToAllV", o.timeout);
    // Send counts, send displacements, receive counts, receive displacements: they must live
    // until the operation completes, so the Work owns them.
    w->buffer().resize(4 * size_ * sizeof(int));
    int* c = reinterpret_cast<int*>(w->buffer().data());
    for (int p = 0, so = 0, ro = 0; p < size_; ++p) {
      c[p] = static_cast<int>(send_counts[p]);
      c[size_ + p] = so;
      c[2 * size_ + p] = static_cast<int>(recv_counts[p]);
      c[3 * size_ + p] = ro;
      so += c[p];
      ro += c[2 * size_ + p];
    }
    Check(w.get(), MPI_Ialltoallv(in, c, c + size_, MpiType(d), out, c + 2 * size_,
                                  c + 3 * size_, MpiType(d), comm_, w->request()),
          "MPI_Ialltoallv");
    return w;
  }
  std::unique_ptr<Work> Send(const void* data, size_t count, DType d, int peer, int tag,
                             const CollectiveOptions& o) override {
    auto w = std::make_unique<MpiWork>(rank_, "Send", o.timeout);
    Check(w.get(), MPI_Isend(data, static_cast<int>(count), MpiType(d), peer, tag, comm_, w->request()),
          "MPI_Isend");
    return w;
  }
  std::unique_ptr<Work> Recv(void* data, size_t count, DType d, int peer, int tag,
                             const CollectiveOptions& o) override {
    auto w = std::make_unique<MpiWork>(rank_, "Recv", o.timeout);
    Check(w.get(), MPI_Irecv(data, static_cast<int>(count), MpiType(d), peer, tag, comm_, w->request()),
          "MPI_Irecv");
    return w;
  }
  std::unique_ptr<Work> Barrier(const CollectiveOptions& o) override {
    auto w = std::make_unique<MpiWork>(rank_, "Barrier", o.timeout);
    Check(w.get(), MPI_Ibarrier(comm_, w->request()), "MPI_Ibarrier");
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
  void Check(MpiWork* w, int rc, const char* call) {
    if (rc != MPI_SUCCESS) w->set_status(MpiError(rc, call, rank_));
  }
  MPI_Comm comm_;
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

void MpiFinalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace satdar::parallel
