#include "comm/staged_communicator.h"

#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/cuda/runtime.h"

namespace satdar::comm {

namespace {

// A Work that has already ended (a copy failed before the host collective was issued).
class DoneWork : public Work {
 public:
  explicit DoneWork(absl::Status s) : s_(std::move(s)) {}
  absl::Status Wait() override { return s_; }

 private:
  absl::Status s_;
};

// Waits for the host collective, then copies its result (if any) back to device memory. The
// host buffers live here until then.
class StagedWork : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, const DeviceCopier* copier, std::vector<char> in,
             std::vector<char> out, void* device_out)
      : inner_(std::move(inner)), copier_(copier), in_(std::move(in)), out_(std::move(out)),
        device_out_(device_out) {}

  // A Work dropped without Wait: the host collective still uses the buffers held here.
  ~StagedWork() override {
    if (!done_) (void)inner_->Wait();
  }

  absl::Status Wait() override {
    if (done_) return status_;
    done_ = true;
    status_ = inner_->Wait();
    if (status_.ok() && device_out_ != nullptr && !out_.empty()) {
      status_ = copier_->to_device(device_out_, out_.data(), out_.size());
    }
    in_.clear();
    out_.clear();
    return status_;
  }

 private:
  std::unique_ptr<Work> inner_;
  const DeviceCopier* copier_;
  std::vector<char> in_, out_;
  void* device_out_;
  bool done_ = false;
  absl::Status status_;
};

class StagedCommunicator : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> host, DeviceCopier copier)
      : host_(std::move(host)), copier_(std::move(copier)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  std::unique_ptr<Work> AllReduce(void* data, size_t count, core::DType dtype, ReduceOp op,
                                  const CollectiveOptions& options) override {
    std::vector<char> buf;
    if (absl::Status s = Stage(data, count, dtype, options, &buf); !s.ok()) return Failed(s);
    std::unique_ptr<Work> w = host_->AllReduce(buf.data(), count, dtype, op, Host(options));
    return Staged(std::move(w), {}, std::move(buf), data);
  }

  std::unique_ptr<Work> ReduceScatter(const void* in, void* out, size_t count, core::DType dtype,
                                      ReduceOp op, const CollectiveOptions& options) override {
    std::vector<char> hin, hout(count * core::DTypeSize(dtype));
    if (absl::Status s = Stage(in, count * size(), dtype, options, &hin); !s.ok()) {
      return Failed(s);
    }
    std::unique_ptr<Work> w =
        host_->ReduceScatter(hin.data(), hout.data(), count, dtype, op, Host(options));
    return Staged(std::move(w), std::move(hin), std::move(hout), out);
  }

  std::unique_ptr<Work> AllGather(const void* in, void* out, size_t count, core::DType dtype,
                                  const CollectiveOptions& options) override {
    std::vector<char> hin, hout(count * size() * core::DTypeSize(dtype));
    if (absl::Status s = Stage(in, count, dtype, options, &hin); !s.ok()) return Failed(s);
    std::unique_ptr<Work> w = host_->AllGather(hin.data(), hout.data(), count, dtype, Host(options));
    return Staged(std::move(w), std::move(hin), std::move(hout), out);
  }

  std::unique_ptr<Work> Broadcast(void* data, size_t count, core::DType dtype, int root,
                                  const CollectiveOptions& options) override {
    std::vector<char> buf;
    if (absl::Status s = Stage(data, count, dtype, options, &buf); !s.ok()) return Failed(s);
    std::unique_ptr<Work> w = host_->Broadcast(buf.data(), count, dtype, root, Host(options));
    return Staged(std::move(w), {}, std::move(buf), data);
  }

  std::unique_ptr<Work> AllToAllV(const void* in, const std::vector<size_t>& send_counts,
                                  void* out, const std::vector<size_t>& recv_counts,
                                  core::DType dtype, const CollectiveOptions& options) override {
    const size_t sent = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
    const size_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
    std::vector<char> hin, hout(received * core::DTypeSize(dtype));
    if (absl::Status s = Stage(in, sent, dtype, options, &hin); !s.ok()) return Failed(s);
    std::unique_ptr<Work> w = host_->AllToAllV(hin.data(), send_counts, hout.data(), recv_counts,
                                               dtype, Host(options));
    return Staged(std::move(w), std::move(hin), std::move(hout), out);
  }

  std::unique_ptr<Work> Send(const void* data, size_t count, core::DType dtype, int peer, int tag,
                             const CollectiveOptions& options) override {
    std::vector<char> buf;
    if (absl::Status s = Stage(data, count, dtype, options, &buf); !s.ok()) return Failed(s);
    std::unique_ptr<Work> w = host_->Send(buf.data(), count, dtype, peer, tag, Host(options));
    return Staged(std::move(w), std::move(buf), {}, nullptr);
  }

  std::unique_ptr<Work> Recv(void* data, size_t count, core::DType dtype, int peer, int tag,
                             const CollectiveOptions& options) override {
    if (!broken_.ok()) return Failed(broken_);
    std::vector<char> buf(count * core::DTypeSize(dtype));
    std::unique_ptr<Work> w = host_->Recv(buf.data(), count, dtype, peer, tag, Host(options));
    return Staged(std::move(w), {}, std::move(buf), data);
  }

  std::unique_ptr<Work> Barrier(const CollectiveOptions& options) override {
    if (!broken_.ok()) return Failed(broken_);
    return host_->Barrier(Host(options));
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      const CollectiveOptions& options) override {
    SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> part,
                            host_->Split(color, key, Host(options)));
    return StageThroughHost(std::move(part), copier_);
  }

 private:
  // The host communicator never sees the CUDA event.
  static CollectiveOptions Host(const CollectiveOptions& o) {
    CollectiveOptions h = o;
    h.ready_event = nullptr;
    return h;
  }
  // After a failed copy this rank has skipped a collective its peers issued, so every later
  // call fails at once (the peers time out naming this rank) instead of pairing with the
  // wrong operation.
  std::unique_ptr<Work> Failed(const absl::Status& s) {
    if (broken_.ok()) {
      broken_ = absl::Status(
          s.code(), absl::StrCat("rank ", rank(), ": staging a device buffer: ", s.message()));
    }
    return std::make_unique<DoneWork>(broken_);
  }
  std::unique_ptr<Work> Staged(std::unique_ptr<Work> w, std::vector<char> in, std::vector<char> out,
                               void* device_out) {
    return std::make_unique<StagedWork>(std::move(w), &copier_, std::move(in), std::move(out),
                                        device_out);
  }
  // *host = the count elements at device (after the ready event).
  absl::Status Stage(const void* device, size_t count, core::DType dtype,
                     const CollectiveOptions& options, std::vector<char>* host) {
    if (!broken_.ok()) return broken_;
    if (options.ready_event != nullptr && copier_.wait_event) {
      if (absl::Status s = copier_.wait_event(options.ready_event); !s.ok()) return s;
    }
    host->resize(count * core::DTypeSize(dtype));
    if (host->empty()) return absl::OkStatus();
    return copier_.to_host(host->data(), device, host->size());
  }

  std::unique_ptr<Communicator> host_;
  const DeviceCopier copier_;
  absl::Status broken_;
};

}  // namespace

DeviceCopier HostCopier() {
  DeviceCopier c;
  c.to_host = [](void* host, const void* device, size_t bytes) {
    std::memcpy(host, device, bytes);
    return absl::OkStatus();
  };
  c.to_device = [](void* device, const void* host, size_t bytes) {
    std::memcpy(device, host, bytes);
    return absl::OkStatus();
  };
  return c;
}

DeviceCopier CudaCopier() {
  DeviceCopier c;
  c.to_host = [](void* host, const void* device, size_t bytes) {
    return core::cuda::CopyToHost(host, device, bytes);
  };
  c.to_device = [](void* device, const void* host, size_t bytes) {
    SATDAR_RETURN_IF_ERROR(core::cuda::CopyToDevice(device, host, bytes));
    return core::cuda::Synchronize();
  };
  c.wait_event = [](void* event) { return core::cuda::WaitEvent(event); };
  return c;
}

std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> host,
                                               DeviceCopier copier) {
  return std::make_unique<StagedCommunicator>(std::move(host), std::move(copier));
}

}  // namespace satdar::comm
