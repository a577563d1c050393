#include "comm/local_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"

namespace satdar::comm {

namespace {

using core::DType;

// What every rank of one collective posted, and the results shared between them.
struct Round {
  std::vector<std::vector<char>> inputs;  // a copy of each rank's input
  std::vector<bool> present;              // which ranks have posted
  std::vector<std::vector<size_t>> counts;  // AllToAllV: each rank's send counts
  std::vector<int> ints;                  // per-rank small values (split colors and keys)
  int arrived = 0;
  int left = 0;
  std::map<int, std::shared_ptr<struct Group>> split;  // color -> new group
};

struct Group {
  explicit Group(int n) : size(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, Round> rounds;                                // by collective number
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mail;  // (src, dst, tag)
};

template <typename T>
void Reduce(T* out, const std::vector<std::vector<char>>& in, size_t offset, size_t count,
            ReduceOp op) {
  const size_t n = in.size();
  for (size_t i = 0; i < count; ++i) {
    T acc = reinterpret_cast<const T*>(in[0].data())[offset + i];
    for (size_t r = 1; r < n; ++r) {
      const T v = reinterpret_cast<const T*>(in[r].data())[offset + i];
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
      if (op == ReduceOp::kMax) acc = std::max(acc, v);
      if (op == ReduceOp::kMin) acc = std::min(acc, v);
    }
    if (op == ReduceOp::kAvg) acc /= static_cast<T>(n);
    out[i] = acc;
  }
}

void ReduceTyped(void* out, const std::vector<std::vector<char>>& in, size_t offset, size_t count,
                 DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32: return Reduce(static_cast<float*>(out), in, offset, count, op);
    case DType::kF64: return Reduce(static_cast<double*>(out), in, offset, count, op);
    case DType::kI32: return Reduce(static_cast<int32_t*>(out), in, offset, count, op);
    case DType::kI64: return Reduce(static_cast<int64_t*>(out), in, offset, count, op);
    default: SATDAR_CHECK(false) << "reductions of " << core::DTypeName(dtype) << " are not supported";
  }
}

class LocalWork : public Work {
 public:
  absl::Status Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }
  void Finish(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
    done_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
};

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank), thread_([this] { Run(); }) {}
  ~LocalCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  std::unique_ptr<Work> AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                  const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(dtype);
    return Collective("AllReduce", o, data, bytes, [=](Round& r) {
      ReduceTyped(data, r.inputs, 0, count, dtype, op);
      return absl::OkStatus();
    });
  }
  std::unique_ptr<Work> ReduceScatter(const void* in, void* out, size_t count, DType dtype,
                                      ReduceOp op, const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(dtype) * group_->size;
    return Collective("ReduceScatter", o, in, bytes, [=](Round& r) {
      ReduceTyped(out, r.inputs, count * rank_, count, dtype, op);
      return absl::OkStatus();
    });
  }
  std::unique_ptr<Work> AllGather(const void* in, void* out, size_t count, DType dtype,
                                  const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(dtype);
    return Collective("AllGather", o, in, bytes, [=](Round& r) {
      if (bytes == 0) return absl::OkStatus();  // out may be null
      for (int p = 0; p < group_->size; ++p) {
        std::memcpy(static_cast<char*>(out) + p * bytes, r.inputs[p].data(), bytes);
      }
      return absl::OkStatus();
    });
  }
  std::unique_ptr<Work> Broadcast(void* data, size_t count, DType dtype, int root,
                                  const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(dtype);
    return Collective("Broadcast", o, data, bytes, [=](Round& r) {
      if (bytes > 0) std::memcpy(data, r.inputs[root].data(), bytes);
      return absl::OkStatus();
    });
  }
  std::unique_ptr<Work> AllToAllV(const void* in, const std::vector<size_t>& send_counts,
                                  void* out, const std::vector<size_t>& recv_counts, DType dtype,
                                  const CollectiveOptions& o) override {
    SATDAR_CHECK(static_cast<int>(send_counts.size()) == group_->size &&
                 static_cast<int>(recv_counts.size()) == group_->size)
        << "AllToAllV needs one count per rank";
    const size_t es = core::DTypeSize(dtype);
    size_t total = 0;
    for (size_t c : send_counts) total += c;
    return Collective("AllToAllV", o, in, total * es, [=](Round& r) -> absl::Status {
      // Every rank posted its whole send buffer; a rank's counts are recovered from the
      // receivers' recv_counts, which must agree with the senders' send_counts.
      char* dst = static_cast<char*>(out);
      for (int p = 0; p < group_->size; ++p) {
        // Offset of rank_'s block inside rank p's send buffer: sum of p's counts before rank_.
        const std::vector<size_t>& pc = r.counts[p];
        size_t offset = 0;
        for (int q = 0; q < rank_; ++q) offset += pc[q];
        if (pc[rank_] != recv_counts[p]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "AllToAllV: rank ", p, " sends ", pc[rank_], " elements to rank ", rank_,
              ", which expects ", recv_counts[p]));
        }
        if (pc[rank_] == 0) continue;  // dst may be null when nothing is received
        std::memcpy(dst, r.inputs[p].data() + offset * es, pc[rank_] * es);
        dst += pc[rank_] * es;
      }
      return absl::OkStatus();
    }, &send_counts);
  }
  std::unique_ptr<Work> Send(const void* data, size_t count, DType dtype, int peer, int tag,
                             const CollectiveOptions& o) override {
    (void)o;
    const size_t bytes = count * core::DTypeSize(dtype);
    std::vector<char> msg(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    return Enqueue([this, msg = std::move(msg), peer, tag]() mutable {
      std::lock_guard<std::mutex> lock(group_->mu);
      group_->mail[{rank_, peer, tag}].push_back(std::move(msg));
      group_->cv.notify_all();
      return absl::OkStatus();
    });
  }
  std::unique_ptr<Work> Recv(void* data, size_t count, DType dtype, int peer, int tag,
                             const CollectiveOptions& o) override {
    const size_t bytes = count * core::DTypeSize(dtype);
    return Enqueue([=]() -> absl::Status {
      std::unique_lock<std::mutex> lock(group_->mu);
      auto& box = group_->mail[{peer, rank_, tag}];
      if (!group_->cv.wait_for(lock, absl::ToChronoMilliseconds(o.timeout),
                               [&] { return !box.empty(); })) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank_, ": Recv from rank ", peer, " (tag ", tag, ") timed out after ",
            absl::FormatDuration(o.timeout)));
      }
      std::vector<char> msg = std::move(box.front());
      box.pop_front();
      if (msg.size() != bytes) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": Recv from rank ", peer,
                                                       " got ", msg.size(), " bytes, expected ",
                                                       bytes));
      }
      if (bytes > 0) std::memcpy(data, msg.data(), bytes);
      return absl::OkStatus();
    });
  }
  std::unique_ptr<Work> Barrier(const CollectiveOptions& o) override {
    return Collective("Barrier", o, nullptr, 0, [](Round&) { return absl::OkStatus(); });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key,
                                                      const CollectiveOptions& o) override {
    std::shared_ptr<Group> group;
    int new_rank = -1;
    auto work = Collective("Split", o, nullptr, 0, [&](Round& r) {
      // The first rank to get here builds every color's group; the others find it.
      std::lock_guard<std::mutex> lock(group_->mu);
      if (r.split.empty()) {
        std::map<int, int> sizes;
        for (int p = 0; p < group_->size; ++p) ++sizes[r.ints[2 * p]];
        for (const auto& [c, n] : sizes) r.split[c] = std::make_shared<Group>(n);
      }
      group = r.split[color];
      std::vector<std::pair<int, int>> members;  // (key, old rank) of this color
      for (int p = 0; p < group_->size; ++p) {
        if (r.ints[2 * p] == color) members.emplace_back(r.ints[2 * p + 1], p);
      }
      std::sort(members.begin(), members.end());
      for (size_t i = 0; i < members.size(); ++i) {
        if (members[i].second == rank_) new_rank = static_cast<int>(i);
      }
      return absl::OkStatus();
    }, nullptr, {color, key});
    SATDAR_RETURN_IF_ERROR(work->Wait());
    return std::unique_ptr<Communicator>(std::make_unique<LocalCommunicator>(group, new_rank));
  }

 private:
  using Task = std::function<absl::Status()>;

  std::unique_ptr<Work> Enqueue(Task task) {
    auto work = std::make_shared<LocalWork>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(std::move(task), work);
    }
    cv_.notify_all();
    return std::make_unique<WorkRef>(work);
  }

  // Posts a copy of `in` (bytes) to this collective's round, waits for every rank, runs
  // compute on the round, then waits until every rank has computed (their outputs may alias
  // their inputs, so inputs are copies and nobody leaves early).
  std::unique_ptr<Work> Collective(const char* name, const CollectiveOptions& o, const void* in,
                                   size_t bytes, std::function<absl::Status(Round&)> compute,
                                   const std::vector<size_t>* counts = nullptr,
                                   std::vector<int> ints = {}) {
    const int64_t seq = next_seq_++;
    std::vector<char> copy(bytes);
    if (bytes > 0) std::memcpy(copy.data(), in, bytes);
    std::vector<size_t> my_counts = counts ? *counts : std::vector<size_t>();
    return Enqueue([this, name, o, seq, copy = std::move(copy), compute = std::move(compute),
                    my_counts = std::move(my_counts), ints = std::move(ints)]() mutable {
      const int n = group_->size;
      std::unique_lock<std::mutex> lock(group_->mu);
      Round& r = group_->rounds[seq];
      if (r.inputs.empty()) {
        r.inputs.resize(n);
        r.present.assign(n, false);
        r.counts.resize(n);
        r.ints.assign(2 * n, 0);
      }
      r.inputs[rank_] = std::move(copy);
      r.present[rank_] = true;
      r.counts[rank_] = std::move(my_counts);
      if (!ints.empty()) {
        r.ints[2 * rank_] = ints[0];
        r.ints[2 * rank_ + 1] = ints[1];
      }
      ++r.arrived;
      group_->cv.notify_all();
      if (!group_->cv.wait_for(lock, absl::ToChronoMilliseconds(o.timeout),
                               [&] { return r.arrived == n; })) {
        std::vector<int> missing;
        for (int p = 0; p < n; ++p) {
          if (!r.present[p]) missing.push_back(p);
        }
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank_, " of ", n, ": ", name, " #", seq, " timed out after ",
            absl::FormatDuration(o.timeout), "; ranks that never arrived: ",
            absl::StrJoin(missing, ", ")));
      }
      lock.unlock();
      absl::Status s = compute(r);
      lock.lock();
      if (++r.left == n) {
        group_->rounds.erase(seq);
        group_->cv.notify_all();
      } else {
        group_->cv.wait(lock, [&] { return group_->rounds.count(seq) == 0; });
      }
      return s;
    });
  }

  // The handle given to callers; the task holds the other reference.
  class WorkRef : public Work {
   public:
    explicit WorkRef(std::shared_ptr<LocalWork> w) : w_(std::move(w)) {}
    absl::Status Wait() override { return w_->Wait(); }

   private:
    std::shared_ptr<LocalWork> w_;
  };

  void Run() {
    for (;;) {
      std::pair<Task, std::shared_ptr<LocalWork>> item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping with nothing left
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      item.second->Finish(item.first());
    }
  }

  std::shared_ptr<Group> group_;
  const int rank_;
  int64_t next_seq_ = 0;  // used by the issuing thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Task, std::shared_ptr<LocalWork>>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeLocalCommunicators(int size) {
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<LocalCommunicator>(group, r));
  return out;
}

}  // namespace satdar::comm
