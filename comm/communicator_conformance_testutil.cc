#include "comm/communicator_conformance_testutil.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <thread>

#include "absl/strings/str_cat.h"
#include "core/cuda/runtime.h"
#include "gtest/gtest.h"
#include "comm/mesh.h"

namespace satdar::comm {
namespace {

using core::DType;

// A buffer the communicator can use (host memory, or the memory the options describe) with a
// host copy the checks read and write.
template <typename T>
class Buf {
 public:
  Buf(const ConformanceMemory& memory, std::vector<T> values)
      : host(std::move(values)), memory_(memory) {
    if (memory_.alloc) {
      device_ = memory_.alloc(std::max<size_t>(bytes(), sizeof(T)));
      Upload();
    }
  }
  Buf(const ConformanceMemory& memory, size_t n) : Buf(memory, std::vector<T>(n)) {}
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (device_ != nullptr) memory_.free(device_);
  }

  T* ptr() { return device_ != nullptr ? static_cast<T*>(device_) : host.data(); }
  void Upload() {
    if (device_ != nullptr && bytes() > 0) memory_.to_device(device_, host.data(), bytes());
  }
  // The communicator's result, copied to `host` if needed.
  const std::vector<T>& Download() {
    if (device_ != nullptr && bytes() > 0) memory_.to_host(host.data(), device_, bytes());
    return host;
  }
  size_t bytes() const { return host.size() * sizeof(T); }

  std::vector<T> host;

 private:
  const ConformanceMemory& memory_;
  void* device_ = nullptr;
};

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Everything a check needs.
struct Ctx {
  Communicator* comm;
  int rank;
  int size;
  const ConformanceOptions& o;
  CollectiveOptions ops;  // a generous timeout: a failing rank must not hang the others long
};

#define SATDAR_WAIT_OK(ctx, work)                                                                  \
  do {                                                                                             \
    absl::Status satdar_wait_status_ = (work)->Wait();                                             \
    ASSERT_TRUE(satdar_wait_status_.ok()) << "rank " << (ctx).rank << ": " << satdar_wait_status_; \
  } while (0)

// The float input of rank r at element i of the reduction checks: values whose sums round
// differently in different orders.
float FloatInput(int r, int i) {
  return 0.1f * (r + 1) + 1e-7f * r + 0.013f * i * (r % 2 ? -1 : 1);
}

void CheckAllReduce(Ctx& c) {
  const int n = c.size, r = c.rank;
  Buf<double> sum(c.o.memory, std::vector<double>{static_cast<double>(r), 1.0, -0.5 * r});
  SATDAR_WAIT_OK(c, c.comm->AllReduce(sum.ptr(), 3, DType::kF64, ReduceOp::kSum, c.ops));
  EXPECT_EQ(sum.Download(), (std::vector<double>{n * (n - 1) / 2.0, 1.0 * n, -0.25 * n * (n - 1)}));
  Buf<int64_t> mx(c.o.memory, std::vector<int64_t>{r * 10, -r});
  SATDAR_WAIT_OK(c, c.comm->AllReduce(mx.ptr(), 2, DType::kI64, ReduceOp::kMax, c.ops));
  EXPECT_EQ(mx.Download(), (std::vector<int64_t>{(n - 1) * 10, 0}));
  Buf<int32_t> mn(c.o.memory, std::vector<int32_t>{r + 5, -r});
  SATDAR_WAIT_OK(c, c.comm->AllReduce(mn.ptr(), 2, DType::kI32, ReduceOp::kMin, c.ops));
  EXPECT_EQ(mn.Download(), (std::vector<int32_t>{5, 1 - n}));
  Buf<float> avg(c.o.memory, std::vector<float>{static_cast<float>(r)});
  SATDAR_WAIT_OK(c, c.comm->AllReduce(avg.ptr(), 1, DType::kF32, ReduceOp::kAvg, c.ops));
  EXPECT_FLOAT_EQ(avg.Download()[0], (n - 1) / 2.0f);
  Buf<int64_t> empty(c.o.memory, size_t{0});
  SATDAR_WAIT_OK(c, c.comm->AllReduce(empty.ptr(), 0, DType::kI64, ReduceOp::kSum, c.ops));
}

// Float sums and averages: every rank gets the same bits (checked by gathering them), and with
// rank-order reductions exactly the sum taken in rank order.
void CheckFloatReductionsIdentical(Ctx& c) {
  const int n = c.size, r = c.rank, count = 257;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    std::vector<float> x(count), expect(count);
    for (int i = 0; i < count; ++i) {
      x[i] = FloatInput(r, i);
      float acc = FloatInput(0, i);
      for (int p = 1; p < n; ++p) acc += FloatInput(p, i);
      if (op == ReduceOp::kAvg) acc /= static_cast<float>(n);
      expect[i] = acc;
    }
    Buf<float> v(c.o.memory, x);
    SATDAR_WAIT_OK(c, c.comm->AllReduce(v.ptr(), count, DType::kF32, op, c.ops));
    const std::vector<float> got = v.Download();
    for (int i = 0; i < count; ++i) {
      if (c.o.rank_order_reductions) {
        ASSERT_TRUE(SameBits(got[i], expect[i]))
            << "rank " << r << " element " << i << ": " << got[i] << " is not the rank-order sum "
            << expect[i];
      } else {
        ASSERT_NEAR(got[i], expect[i], 1e-5f * (1 + std::fabs(expect[i]))) << "element " << i;
      }
    }
    Buf<float> all(c.o.memory, static_cast<size_t>(n) * count);
    SATDAR_WAIT_OK(c, c.comm->AllGather(v.ptr(), all.ptr(), count, DType::kF32, c.ops));
    const std::vector<float>& everyone = all.Download();
    for (int p = 0; p < n; ++p) {
      for (int i = 0; i < count; ++i) {
        ASSERT_TRUE(SameBits(everyone[p * count + i], got[i]))
            << "rank " << p << " and rank " << r << " disagree at element " << i;
      }
    }
  }
  // ReduceScatter of floats: block b of rank r holds FloatInput(r, b * 3 + i).
  std::vector<float> in(3 * n), expect(3);
  for (int b = 0; b < n; ++b) {
    for (int i = 0; i < 3; ++i) in[b * 3 + i] = FloatInput(r, b * 3 + i);
  }
  for (int i = 0; i < 3; ++i) {
    float acc = FloatInput(0, r * 3 + i);
    for (int p = 1; p < n; ++p) acc += FloatInput(p, r * 3 + i);
    expect[i] = acc;
  }
  Buf<float> rs_in(c.o.memory, in), rs_out(c.o.memory, size_t{3});
  SATDAR_WAIT_OK(
      c, c.comm->ReduceScatter(rs_in.ptr(), rs_out.ptr(), 3, DType::kF32, ReduceOp::kSum, c.ops));
  for (int i = 0; i < 3; ++i) {
    if (c.o.rank_order_reductions) {
      EXPECT_TRUE(SameBits(rs_out.Download()[i], expect[i])) << "element " << i;
    } else {
      EXPECT_NEAR(rs_out.Download()[i], expect[i], 1e-5f * (1 + std::fabs(expect[i])));
    }
  }
}

void CheckReduceScatterAllGatherBroadcast(Ctx& c) {
  const int n = c.size, r = c.rank;
  // Block b of rank r holds r + 100 b; rank r receives sum_p (p + 100 r).
  std::vector<int32_t> in(2 * n);
  for (int b = 0; b < n; ++b) in[2 * b] = in[2 * b + 1] = r + 100 * b;
  Buf<int32_t> rs_in(c.o.memory, in), rs_out(c.o.memory, size_t{2});
  SATDAR_WAIT_OK(
      c, c.comm->ReduceScatter(rs_in.ptr(), rs_out.ptr(), 2, DType::kI32, ReduceOp::kSum, c.ops));
  const int32_t want = n * (n - 1) / 2 + 100 * r * n;
  EXPECT_EQ(rs_out.Download(), (std::vector<int32_t>{want, want}));
  Buf<int64_t> rs_max_in(c.o.memory, std::vector<int64_t>(n, r)), rs_max(c.o.memory, size_t{1});
  SATDAR_WAIT_OK(c, c.comm->ReduceScatter(rs_max_in.ptr(), rs_max.ptr(), 1, DType::kI64,
                                          ReduceOp::kMax, c.ops));
  EXPECT_EQ(rs_max.Download()[0], n - 1);

  Buf<int32_t> mine(c.o.memory, std::vector<int32_t>{r, -r}), all(c.o.memory, size_t(2 * n));
  SATDAR_WAIT_OK(c, c.comm->AllGather(mine.ptr(), all.ptr(), 2, DType::kI32, c.ops));
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(all.Download()[2 * p], p);
    EXPECT_EQ(all.Download()[2 * p + 1], -p);
  }
  for (int root = 0; root < n; ++root) {
    Buf<double> v(c.o.memory, std::vector<double>{r == root ? 42.0 + root : -1.0, r * 1.0});
    SATDAR_WAIT_OK(c, c.comm->Broadcast(v.ptr(), 2, DType::kF64, root, c.ops));
    EXPECT_EQ(v.Download(), (std::vector<double>{42.0 + root, root * 1.0})) << "root " << root;
  }
}

void CheckAllToAllV(Ctx& c) {
  const int n = c.size, r = c.rank;
  {
    // Rank r sends p + 1 copies of (10 r + p) to rank p.
    std::vector<size_t> send(n), recv(n);
    std::vector<int32_t> in;
    for (int p = 0; p < n; ++p) {
      send[p] = p + 1;
      recv[p] = r + 1;
      for (int k = 0; k <= p; ++k) in.push_back(10 * r + p);
    }
    Buf<int32_t> a(c.o.memory, in), b(c.o.memory, size_t(n * (r + 1)));
    SATDAR_WAIT_OK(c, c.comm->AllToAllV(a.ptr(), send, b.ptr(), recv, DType::kI32, c.ops));
    const std::vector<int32_t>& out = b.Download();
    for (int p = 0; p < n; ++p) {
      for (int k = 0; k <= r; ++k) EXPECT_EQ(out[p * (r + 1) + k], 10 * p + r) << "from " << p;
    }
  }
  {
    // (r + p) % 3 elements between r and p in both directions: some blocks are empty.
    std::vector<size_t> counts(n);
    std::vector<int64_t> in;
    size_t total = 0;
    for (int p = 0; p < n; ++p) {
      counts[p] = (r + p) % 3;
      total += counts[p];
      for (size_t k = 0; k < counts[p]; ++k)
        in.push_back(1000 * r + 10 * p + static_cast<int64_t>(k));
    }
    Buf<int64_t> a(c.o.memory, in), b(c.o.memory, total);
    SATDAR_WAIT_OK(c, c.comm->AllToAllV(a.ptr(), counts, b.ptr(), counts, DType::kI64, c.ops));
    std::vector<int64_t> want;
    for (int p = 0; p < n; ++p) {
      for (size_t k = 0; k < counts[p]; ++k)
        want.push_back(1000 * p + 10 * r + static_cast<int64_t>(k));
    }
    EXPECT_EQ(b.Download(), want);
  }
}

// Several operations in flight at once, waited in the reverse of the order they were issued.
void CheckOutOfOrderWaits(Ctx& c) {
  const int n = c.size, r = c.rank;
  Buf<int64_t> sum(c.o.memory, std::vector<int64_t>{r + 1});
  Buf<int32_t> sq(c.o.memory, std::vector<int32_t>{r * r}), sqs(c.o.memory, size_t(n));
  Buf<double> b(c.o.memory, std::vector<double>{r == n - 1 ? 7.5 : 0.0});
  auto w1 = c.comm->AllReduce(sum.ptr(), 1, DType::kI64, ReduceOp::kSum, c.ops);
  auto w2 = c.comm->AllGather(sq.ptr(), sqs.ptr(), 1, DType::kI32, c.ops);
  auto w3 = c.comm->Broadcast(b.ptr(), 1, DType::kF64, n - 1, c.ops);
  auto w4 = c.comm->Barrier(c.ops);
  SATDAR_WAIT_OK(c, w4);
  SATDAR_WAIT_OK(c, w3);
  SATDAR_WAIT_OK(c, w2);
  SATDAR_WAIT_OK(c, w1);
  EXPECT_EQ(sum.Download()[0], n * (n + 1) / 2);
  for (int p = 0; p < n; ++p) EXPECT_EQ(sqs.Download()[p], p * p);
  EXPECT_EQ(b.Download()[0], 7.5);
}

void CheckSendRecv(Ctx& c) {
  const int n = c.size, r = c.rank;
  // Five messages 0 -> 1 with one tag arrive in order; the receiver posts all five first.
  if (r == 0) {
    for (int i = 0; i < 5; ++i) {
      Buf<int64_t> v(c.o.memory, std::vector<int64_t>{i, 100 + i});
      SATDAR_WAIT_OK(c, c.comm->Send(v.ptr(), 2, DType::kI64, 1, 7, c.ops));
    }
  } else if (r == 1) {
    std::vector<std::unique_ptr<Buf<int64_t>>> got;
    std::vector<std::unique_ptr<Work>> works;
    for (int i = 0; i < 5; ++i) {
      got.push_back(std::make_unique<Buf<int64_t>>(c.o.memory, size_t{2}));
      works.push_back(c.comm->Recv(got.back()->ptr(), 2, DType::kI64, 0, 7, c.ops));
    }
    for (auto& w : works) SATDAR_WAIT_OK(c, w);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(got[i]->Download(), (std::vector<int64_t>{i, 100 + i})) << "message " << i;
    }
  }
  // A ring: everyone sends to the next rank and receives from the previous one.
  {
    Buf<int32_t> token(c.o.memory, std::vector<int32_t>{r, 2 * r, 3 * r}),
        got(c.o.memory, size_t{3});
    auto s = c.comm->Send(token.ptr(), 3, DType::kI32, (r + 1) % n, 5, c.ops);
    auto q = c.comm->Recv(got.ptr(), 3, DType::kI32, (r + n - 1) % n, 5, c.ops);
    SATDAR_WAIT_OK(c, q);
    SATDAR_WAIT_OK(c, s);
    const int prev = (r + n - 1) % n;
    EXPECT_EQ(got.Download(), (std::vector<int32_t>{prev, 2 * prev, 3 * prev}));
  }
  // Tags: rank 1 receives tag 2 before tag 1; rank 0 sends tag 1 first.
  if (c.o.tags_match) {
    if (r == 0) {
      Buf<float> one(c.o.memory, std::vector<float>{1.5f}),
          two(c.o.memory, std::vector<float>{2.5f, 3.5f});
      auto s1 = c.comm->Send(one.ptr(), 1, DType::kF32, 1, 1, c.ops);
      auto s2 = c.comm->Send(two.ptr(), 2, DType::kF32, 1, 2, c.ops);
      SATDAR_WAIT_OK(c, s1);
      SATDAR_WAIT_OK(c, s2);
    } else if (r == 1) {
      Buf<float> one(c.o.memory, size_t{1}), two(c.o.memory, size_t{2});
      auto q2 = c.comm->Recv(two.ptr(), 2, DType::kF32, 0, 2, c.ops);
      auto q1 = c.comm->Recv(one.ptr(), 1, DType::kF32, 0, 1, c.ops);
      SATDAR_WAIT_OK(c, q2);
      SATDAR_WAIT_OK(c, q1);
      EXPECT_EQ(one.Download(), (std::vector<float>{1.5f}));
      EXPECT_EQ(two.Download(), (std::vector<float>{2.5f, 3.5f}));
    }
  }
  SATDAR_WAIT_OK(c, c.comm->Barrier(c.ops));
}

// The sum over a sub-communicator of each member's old rank, and the old ranks in its order.
void CheckGroup(Ctx& c, Communicator* sub, const std::vector<int>& members,
                const std::string& what) {
  const int me =
      static_cast<int>(std::find(members.begin(), members.end(), c.rank) - members.begin());
  EXPECT_EQ(sub->size(), static_cast<int>(members.size())) << what;
  EXPECT_EQ(sub->rank(), me) << what;
  if (sub->size() != static_cast<int>(members.size()) || sub->rank() != me) return;
  Buf<int32_t> v(c.o.memory, std::vector<int32_t>{c.rank});
  SATDAR_WAIT_OK(c, sub->AllReduce(v.ptr(), 1, DType::kI32, ReduceOp::kSum, c.ops));
  int32_t want = 0;
  for (int m : members) want += m;
  EXPECT_EQ(v.Download()[0], want) << what;
  Buf<int32_t> order(c.o.memory, members.size());
  Buf<int32_t> mine(c.o.memory, std::vector<int32_t>{c.rank});
  SATDAR_WAIT_OK(c, sub->AllGather(mine.ptr(), order.ptr(), 1, DType::kI32, c.ops));
  EXPECT_EQ(order.Download(), std::vector<int32_t>(members.begin(), members.end())) << what;
  SATDAR_WAIT_OK(c, sub->Barrier(c.ops));
}

void CheckSplit(Ctx& c) {
  const int n = c.size, r = c.rank;
  {
    // Colors by parity, keys reversed: the highest old rank comes first.
    auto sub = c.comm->Split(r % 2, -r, c.ops);
    ASSERT_TRUE(sub.ok()) << sub.status();
    std::vector<int> members;
    for (int p = n - 1; p >= 0; --p) {
      if (p % 2 == r % 2) members.push_back(p);
    }
    CheckGroup(c, sub->get(), members, "split by parity, keys reversed");
  }
  {
    // One color, equal keys: ties keep the old order. Then split that group again.
    auto all = c.comm->Split(7, 0, c.ops);
    ASSERT_TRUE(all.ok()) << all.status();
    std::vector<int> members;
    for (int p = 0; p < n; ++p) members.push_back(p);
    CheckGroup(c, all->get(), members, "one color");
    auto halves = (*all)->Split(r < n / 2 ? 0 : 1, r, c.ops);
    ASSERT_TRUE(halves.ok()) << halves.status();
    members.clear();
    for (int p = 0; p < n; ++p) {
      if ((p < n / 2) == (r < n / 2)) members.push_back(p);
    }
    CheckGroup(c, halves->get(), members, "nested split");
  }
  if (n == 4) {
    const MeshShape shape{2, 2, 1, 1};  // dp=2 x tp=2: TP groups are {0, 1} and {2, 3}
    SplitKey tp = GroupAlong(shape, r, "tp");
    auto sub = c.comm->Split(tp.color, tp.key, c.ops);
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_EQ((*sub)->rank(), CoordOf(shape, r).tp);
    CheckGroup(c, sub->get(), r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, "mesh tp");
  }
  SATDAR_WAIT_OK(c, c.comm->Barrier(c.ops));
}

// Everyone waits for a message its successor never sends.
void CheckTimeout(Ctx& c) {
  const int n = c.size, r = c.rank;
  const int peer = (r + 1) % n;
  CollectiveOptions fast;
  fast.timeout = c.o.timeout;
  Buf<int64_t> v(c.o.memory, size_t{1});
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = c.comm->Recv(v.ptr(), 1, DType::kI64, peer, 31999, fast)->Wait();
  const absl::Duration took = absl::FromChrono(std::chrono::steady_clock::now() - start);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << "rank " << r << ": " << s;
  if (c.o.timeout_names_peer) {
    EXPECT_NE(s.message().find(absl::StrCat("rank ", peer)), std::string::npos) << s;
  }
  EXPECT_GE(took, c.o.timeout * 0.9) << s;
  EXPECT_LT(took, c.o.timeout + absl::Seconds(10)) << s;
}

}  // namespace

void RunCommunicatorConformance(Communicator* comm, int rank, int size,
                                const ConformanceOptions& options) {
  ASSERT_NE(comm, nullptr);
  ASSERT_EQ(comm->rank(), rank);
  ASSERT_EQ(comm->size(), size);
  Ctx c{comm, rank, size, options, CollectiveOptions{}};
  c.ops.timeout = absl::Seconds(60);
  using Check = void (*)(Ctx&);
  std::vector<std::pair<const char*, Check>> checks = {
      {"AllReduce", CheckAllReduce},
      {"float reductions", CheckFloatReductionsIdentical},
      {"ReduceScatter/AllGather/Broadcast", CheckReduceScatterAllGatherBroadcast},
      {"AllToAllV", CheckAllToAllV},
      {"out-of-order waits", CheckOutOfOrderWaits},
      {"Split", CheckSplit},
  };
  if (size >= 2) checks.emplace_back("Send/Recv", CheckSendRecv);
  if (size >= 2 && options.run_timeout_case) checks.emplace_back("timeout", CheckTimeout);
  for (const auto& [name, check] : checks) {
    SCOPED_TRACE(absl::StrCat("rank ", rank, " of ", size, ": ", name));
    check(c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

ConformanceMemory CudaMemory(int device) {
  ConformanceMemory m;
  m.alloc = [device](size_t bytes) {
    auto p = core::cuda::Malloc(bytes, device);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  };
  m.free = [](void* p) { core::cuda::Free(p); };
  m.to_device = [](void* d, const void* h, size_t n) {
    EXPECT_TRUE(core::cuda::CopyToDevice(d, h, n).ok());
  };
  m.to_host = [](void* h, const void* d, size_t n) {
    EXPECT_TRUE(core::cuda::CopyToHost(h, d, n).ok());
  };
  return m;
}

void OnRanks(std::vector<std::unique_ptr<Communicator>>& comms,
             const std::function<void(int rank, Communicator* comm)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { body(static_cast<int>(r), comms[r].get()); });
  }
  for (auto& t : threads) t.join();
}

}  // namespace satdar::comm
