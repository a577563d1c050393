// Tests of the simulated NCCL (nccl_sim.cc) with ranks in separate processes: each test forks
// one child per rank; the children meet through a unique id made before the fork (or sent by
// rank 0 through a pipe) and report through their exit status.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace satdar::cuda_sim {
namespace {

using Clock = std::chrono::steady_clock;

struct Exit {
  bool exited = false;
  int code = -1;   // when exited
  int signal = 0;  // when killed
};

// Runs body(rank) in n forked children and waits for them (killing all after timeout_s).
std::vector<Exit> RunRanks(int n, const std::function<void(int)>& body, int timeout_s = 60) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(timeout_s + 5);  // never outlive the test
      body(r);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(::testing::Test::HasFailure() ? 1 : 0);
    }
    pids.push_back(pid);
  }
  std::vector<Exit> out(n);
  std::vector<bool> done(n, false);
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      int status = 0;
      if (done[r] || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      done[r] = true;
      --left;
      out[r].exited = WIFEXITED(status);
      out[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      out[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    if (left > 0 && Clock::now() > deadline) {
      ADD_FAILURE() << "ranks still running after " << timeout_s << " s (a hang): killing them";
      for (int r = 0; r < n; ++r) {
        if (!done[r]) kill(pids[r], SIGKILL);
      }
      for (int r = 0; r < n; ++r) {
        if (!done[r]) waitpid(pids[r], nullptr, 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

void ExpectAllPassed(const std::vector<Exit>& exits) {
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_TRUE(exits[r].exited && exits[r].code == 0)
        << "rank " << r << ": exit code " << exits[r].code << ", signal " << exits[r].signal;
  }
}

ncclUniqueId NewId() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  return id;
}

// Waits while a non-blocking call is in progress; returns the final result.
ncclResult_t Settle(ncclComm_t comm, ncclResult_t r, int seconds = 30) {
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (r == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    EXPECT_EQ(ncclCommGetAsyncError(comm, &r), ncclSuccess);
  }
  return r;
}

ncclComm_t Join(const ncclUniqueId& id, int n, int rank, bool blocking = true) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &config);
  if (!blocking) {
    EXPECT_EQ(r, ncclInProgress);
    r = Settle(comm, r);
  }
  EXPECT_EQ(r, ncclSuccess) << ncclGetLastError(comm);
  return comm;
}

template <typename T>
T* ToDevice(const std::vector<T>& v, size_t at_least = 0) {
  void* d = nullptr;
  const size_t bytes = std::max(v.size(), at_least) * sizeof(T);
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(bytes, 1)), cudaSuccess);
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return static_cast<T*>(d);
}

template <typename T>
std::vector<T> FromDevice(const T* d, size_t n) {
  std::vector<T> v(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

cudaStream_t NewStream() {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t ToBf16(float f) {  // round to nearest even
  uint32_t u = Bits(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float Bf16(uint16_t b) { return FromBits(uint32_t{b} << 16); }

// Values whose sums round differently in different orders.
float Input(int r, int i) { return 0.1f * (r + 1) + 1e-7f * r + 0.013f * i * (r % 2 ? -1 : 1); }

// ---------------------------------------------------------------------------------------------

class NcclSimRanks : public ::testing::TestWithParam<int> {};

// f32 and bf16 sums are the rank-order sums, bit for bit, on every rank (out of place and in
// place), and the other ops and types give their closed forms.
TEST_P(NcclSimRanks, AllReduceInRankOrder) {
  const int n = GetParam(), count = 1000;
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(n, [&](int r) {
    ncclComm_t comm = Join(id, n, r);
    cudaStream_t s = NewStream();
    std::vector<float> x(count);
    std::vector<uint16_t> xb(count);
    for (int i = 0; i < count; ++i) {
      x[i] = Input(r, i);
      xb[i] = ToBf16(Input(r, i) * 3.7f);
    }
    float* in = ToDevice(x);
    float* out = ToDevice(std::vector<float>(count));
    uint16_t* b = ToDevice(xb);
    ASSERT_EQ(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, s), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(b, b, count, ncclBfloat16, ncclSum, comm, s), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(in, in, count, ncclFloat32, ncclAvg, comm, s), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const std::vector<float> got = FromDevice(out, count), avg = FromDevice(in, count);
    const std::vector<uint16_t> gotb = FromDevice(b, count);
    for (int i = 0; i < count; ++i) {
      float acc = Input(0, i);
      uint16_t accb = ToBf16(Input(0, i) * 3.7f);
      for (int p = 1; p < n; ++p) {
        acc += Input(p, i);
        accb = ToBf16(Bf16(accb) + Bf16(ToBf16(Input(p, i) * 3.7f)));
      }
      ASSERT_EQ(Bits(got[i]), Bits(acc)) << "f32 element " << i;
      ASSERT_EQ(gotb[i], accb) << "bf16 element " << i;
      ASSERT_EQ(Bits(avg[i]), Bits(acc / n)) << "avg element " << i;
    }
    std::vector<int64_t> iv = {r * 10, -r, int64_t{1} << 40};
    int64_t* id64 = ToDevice(iv);
    ASSERT_EQ(ncclAllReduce(id64, id64, 3, ncclInt64, ncclMax, comm, s), ncclSuccess);
    double* d = ToDevice(std::vector<double>{1.5 * r});
    ASSERT_EQ(ncclAllReduce(d, d, 1, ncclFloat64, ncclMin, comm, s), ncclSuccess);
    int32_t* i32 = ToDevice(std::vector<int32_t>{r + 1});
    ASSERT_EQ(ncclAllReduce(i32, i32, 1, ncclInt32, ncclProd, comm, s), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(i32, i32, 0, ncclInt32, ncclSum, comm, s), ncclSuccess);  // empty
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(FromDevice(id64, 3), (std::vector<int64_t>{(n - 1) * 10, 0, int64_t{1} << 40}));
    EXPECT_EQ(FromDevice(d, 1)[0], 0.0);
    int32_t fact = 1;
    for (int p = 1; p <= n; ++p) fact *= p;
    EXPECT_EQ(FromDevice(i32, 1)[0], fact);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }));
}

// Broadcast, AllGather and ReduceScatter, out of place and in place.
TEST_P(NcclSimRanks, BroadcastAllGatherReduceScatter) {
  const int n = GetParam(), count = 5;
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(n, [&](int r) {
    ncclComm_t comm = Join(id, n, r, /*blocking=*/false);
    cudaStream_t s = NewStream();
    const int root = n - 1;
    double* bc = ToDevice(std::vector<double>(count, r == root ? 42.5 : -1.0));
    ASSERT_EQ(ncclBroadcast(bc, bc, count, ncclFloat64, root, comm, s), ncclSuccess);
    std::vector<int32_t> mine(count);
    for (int i = 0; i < count; ++i) mine[i] = 100 * r + i;
    int32_t* src = ToDevice(mine);
    int32_t* all = ToDevice(std::vector<int32_t>(n * count));
    ASSERT_EQ(ncclAllGather(src, all, count, ncclInt32, comm, s), ncclSuccess);
    std::vector<int32_t> inplace(n * count, -7);
    for (int i = 0; i < count; ++i) inplace[r * count + i] = 100 * r + i;
    int32_t* ip = ToDevice(inplace);
    ASSERT_EQ(ncclAllGather(ip + r * count, ip, count, ncclInt32, comm, s), ncclSuccess);
    std::vector<float> rs(n * count);
    for (int b = 0; b < n; ++b) {
      for (int i = 0; i < count; ++i) rs[b * count + i] = Input(r, b * count + i);
    }
    float* rs_in = ToDevice(rs);
    float* rs_out = ToDevice(std::vector<float>(count));
    ASSERT_EQ(ncclReduceScatter(rs_in, rs_out, count, ncclFloat32, ncclSum, comm, s), ncclSuccess);
    ASSERT_EQ(ncclReduceScatter(rs_in, rs_in + r * count, count, ncclFloat32, ncclSum, comm, s),
              ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(FromDevice(bc, count), std::vector<double>(count, 42.5));
    std::vector<int32_t> want;
    for (int p = 0; p < n; ++p) {
      for (int i = 0; i < count; ++i) want.push_back(100 * p + i);
    }
    EXPECT_EQ(FromDevice(all, n * count), want);
    EXPECT_EQ(FromDevice(ip, n * count), want);
    const std::vector<float> got = FromDevice(rs_out, count);
    const std::vector<float> got_inplace = FromDevice(rs_in + r * count, count);
    for (int i = 0; i < count; ++i) {
      float acc = Input(0, r * count + i);
      for (int p = 1; p < n; ++p) acc += Input(p, r * count + i);
      EXPECT_EQ(Bits(got[i]), Bits(acc)) << i;
      EXPECT_EQ(Bits(got_inplace[i]), Bits(acc)) << i;
    }
    ASSERT_EQ(Settle(comm, ncclCommFinalize(comm)), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }));
}

// A ring of Send-then-Recv in a group, an all-to-all with self messages, and messages that
// arrive in issue order.
TEST_P(NcclSimRanks, SendRecvInGroups) {
  const int n = GetParam();
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(n, [&](int r) {
    ncclComm_t comm = Join(id, n, r);
    cudaStream_t s = NewStream();
    int64_t* token = ToDevice(std::vector<int64_t>{r, 2 * r});
    int64_t* got = ToDevice(std::vector<int64_t>(2));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(token, 2, ncclInt64, (r + 1) % n, comm, s), ncclSuccess);
    ASSERT_EQ(ncclRecv(got, 2, ncclInt64, (r + n - 1) % n, comm, s), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    std::vector<int32_t> in;
    for (int p = 0; p < n; ++p) in.push_back(10 * r + p);
    int32_t* a = ToDevice(in);
    int32_t* b = ToDevice(std::vector<int32_t>(n));
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int p = 0; p < n; ++p) {
      ASSERT_EQ(ncclSend(a + p, 1, ncclInt32, p, comm, s), ncclSuccess);
      ASSERT_EQ(ncclRecv(b + p, 1, ncclInt32, p, comm, s), ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    // Three messages 0 -> 1, received in one group in issue order.
    uint8_t* m = ToDevice(std::vector<uint8_t>{1, 2, 3});
    if (r == 0) {
      for (int k = 0; k < 3; ++k) ASSERT_EQ(ncclSend(m + k, 1, ncclUint8, 1, comm, s), ncclSuccess);
    } else if (r == 1) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int k = 2; k >= 0; --k)
        ASSERT_EQ(ncclRecv(m + k, 1, ncclUint8, 0, comm, s), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const int prev = (r + n - 1) % n;
    EXPECT_EQ(FromDevice(got, 2), (std::vector<int64_t>{prev, 2 * prev}));
    std::vector<int32_t> want;
    for (int p = 0; p < n; ++p) want.push_back(10 * p + r);
    EXPECT_EQ(FromDevice(b, n), want);
    if (r == 1) {
      EXPECT_EQ(FromDevice(m, 3), (std::vector<uint8_t>{3, 2, 1}));
    }
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }));
}

// Colors by parity with keys reversed (blocking), then a non-blocking split in which the last
// rank takes no part (NCCL_SPLIT_NOCOLOR).
TEST_P(NcclSimRanks, Split) {
  const int n = GetParam();
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(n, [&](int r) {
    ncclComm_t comm = Join(id, n, r);
    cudaStream_t s = NewStream();
    ncclComm_t half = nullptr;
    ASSERT_EQ(ncclCommSplit(comm, r % 2, -r, &half, nullptr), ncclSuccess);
    int sub_rank = -1, sub_size = -1;
    ASSERT_EQ(ncclCommUserRank(half, &sub_rank), ncclSuccess);
    ASSERT_EQ(ncclCommCount(half, &sub_size), ncclSuccess);
    std::vector<int32_t> members;
    for (int p = n - 1; p >= 0; --p) {
      if (p % 2 == r % 2) members.push_back(p);
    }
    EXPECT_EQ(sub_size, static_cast<int>(members.size()));
    EXPECT_EQ(members[sub_rank], r);
    int32_t* v = ToDevice(std::vector<int32_t>{r});
    int32_t* order = ToDevice(std::vector<int32_t>(members.size()));
    ASSERT_EQ(ncclAllGather(v, order, 1, ncclInt32, half, s), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(FromDevice(order, members.size()), members);

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t most = nullptr;
    const int color = r == n - 1 ? NCCL_SPLIT_NOCOLOR : 3;
    ncclResult_t res = ncclCommSplit(comm, color, 0, &most, &config);
    EXPECT_EQ(res, ncclInProgress);
    if (r == n - 1) {
      EXPECT_EQ(most, nullptr);
      ASSERT_EQ(Settle(comm, res), ncclSuccess);
    } else {
      ASSERT_NE(most, nullptr);
      ASSERT_EQ(Settle(most, res), ncclSuccess) << ncclGetLastError(most);
      int size = 0;
      ASSERT_EQ(ncclCommCount(most, &size), ncclSuccess);
      EXPECT_EQ(size, n - 1);
      int32_t* one = ToDevice(std::vector<int32_t>{1});
      ASSERT_EQ(ncclAllReduce(one, one, 1, ncclInt32, ncclSum, most, s), ncclSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(FromDevice(one, 1)[0], n - 1);
      ASSERT_EQ(Settle(most, ncclCommFinalize(most)), ncclSuccess);
      EXPECT_EQ(ncclCommDestroy(most), ncclSuccess);
    }
    EXPECT_EQ(ncclCommDestroy(half), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclSimRanks, ::testing::Values(2, 3, 4));

// Rank 0 makes the id and hands it to the others through a pipe, as a store would.
TEST(NcclSim, IdFromRankZero) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int n = 3;
  ExpectAllPassed(RunRanks(n, [&](int r) {
    ncclUniqueId id;
    if (r == 0) {
      id = NewId();
      for (int p = 1; p < n; ++p) ASSERT_EQ(write(fds[1], &id, sizeof(id)), ssize_t{sizeof(id)});
    } else {
      ASSERT_EQ(read(fds[0], &id, sizeof(id)), ssize_t{sizeof(id)});
    }
    ncclComm_t comm = Join(id, n, r, false);
    cudaStream_t s = NewStream();
    int64_t* v = ToDevice(std::vector<int64_t>{r});
    ASSERT_EQ(ncclAllReduce(v, v, 1, ncclInt64, ncclSum, comm, s), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(FromDevice(v, 1)[0], 3);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }));
  close(fds[0]);
  close(fds[1]);
}

// Ranks as threads of one process (as satdar's nccl_communicator_test runs them).
TEST(NcclSim, RanksAsThreads) {
  const int n = 3;
  ExpectAllPassed(RunRanks(1, [&](int) {
    const ncclUniqueId id = NewId();
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        ncclComm_t comm = Join(id, n, r, false);
        cudaStream_t s = NewStream();
        float* v = ToDevice(std::vector<float>{1.0f * r});
        EXPECT_EQ(ncclAllReduce(v, v, 1, ncclFloat32, ncclSum, comm, s), ncclSuccess);
        EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        EXPECT_EQ(FromDevice(v, 1)[0], 3.0f);
        EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
      });
    }
    for (auto& t : threads) t.join();
  }));
}

// nranks that disagree, ranks out of range, host buffers, an unset config, a stray GroupEnd.
TEST(NcclSim, InvalidArguments) {
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(2, [&](int r) {
    ncclComm_t comm = nullptr;
    EXPECT_EQ(ncclCommInitRankConfig(&comm, r == 0 ? 2 : 3, id, r, nullptr), ncclInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("nranks"), std::string::npos)
        << ncclGetLastError(nullptr);
  }));
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 2, id, 2, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 0, id, 0, nullptr), ncclInvalidArgument);
  ncclConfig_t unset;
  std::memset(&unset, 0, sizeof(unset));
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, NewId(), 0, &unset), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);

  const ncclUniqueId solo = NewId();
  ExpectAllPassed(RunRanks(1, [&](int) {
    ncclComm_t c = Join(solo, 1, 0);
    cudaStream_t s = NewStream();
    std::vector<float> host(4);
    float* dev = ToDevice(std::vector<float>(4));
    EXPECT_EQ(ncclAllReduce(host.data(), dev, 4, ncclFloat32, ncclSum, c, s), ncclInvalidArgument);
    // Bytes passed where elements are meant: the buffer is too small.
    EXPECT_EQ(ncclAllReduce(dev, dev, 16, ncclFloat32, ncclSum, c, s), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(dev, dev, 4, ncclFloat16, ncclSum, c, s), ncclInvalidArgument);
    EXPECT_EQ(ncclBroadcast(dev, dev, 4, ncclFloat32, 1, c, s), ncclInvalidArgument);
    // A failed call inside a group fails the group; nothing of it runs.
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclSend(dev, 4, ncclFloat32, 0, c, s), ncclSuccess);
    EXPECT_EQ(ncclRecv(dev, 4, ncclFloat32, 3, c, s), ncclInvalidArgument);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    // A self Send/Recv pair in a group works.
    float* other = ToDevice(std::vector<float>{1, 2, 3, 4});
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclSend(other, 4, ncclFloat32, 0, c, s), ncclSuccess);
    EXPECT_EQ(ncclRecv(dev, 4, ncclFloat32, 0, c, s), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(FromDevice(dev, 4), (std::vector<float>{1, 2, 3, 4}));
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }));
}

// A non-blocking init whose peers never come stays ncclInProgress until ncclCommAbort.
TEST(NcclSim, AbortDuringInit) {
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(1, [&](int) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInProgress);
    ASSERT_NE(comm, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclInProgress);
    cudaStream_t s = NewStream();
    float* v = ToDevice(std::vector<float>{1});
    EXPECT_EQ(ncclAllReduce(v, v, 1, ncclFloat32, ncclSum, comm, s), ncclInvalidUsage);
    const auto start = Clock::now();
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  }));
}

// Ranks that issue different collectives get ncclInvalidUsage as the async error (NCCL would
// hang or corrupt data); the stream waits until the communicator is aborted.
TEST(NcclSim, MismatchedCollectives) {
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(2, [&](int r) {
    ncclComm_t comm = Join(id, 2, r);
    cudaStream_t s = NewStream();
    float* v = ToDevice(std::vector<float>(8));
    ASSERT_EQ(ncclAllReduce(v, v, r == 0 ? 4 : 8, ncclFloat32, ncclSum, comm, s), ncclSuccess);
    ncclResult_t async = ncclSuccess;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (async == ncclSuccess && Clock::now() < deadline) {
      ASSERT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(async, ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("count 4"), std::string::npos)
        << ncclGetLastError(comm);
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
    EXPECT_EQ(ncclAllReduce(v, v, 4, ncclFloat32, ncclSum, comm, s), ncclInvalidUsage);
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }));
}

// A Recv whose Send never comes waits (as on NCCL) until ncclCommAbort releases it; the peer
// that aborted does not make the other rank's wait fail.
TEST(NcclSim, AbortUnblocksPendingRecv) {
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(2, [&](int r) {
    ncclComm_t comm = Join(id, 2, r);
    cudaStream_t s = NewStream();
    int64_t* v = ToDevice(std::vector<int64_t>{-1});
    ASSERT_EQ(ncclRecv(v, 1, ncclInt64, 1 - r, comm, s), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(r == 0 ? 300 : 800));
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
    ncclResult_t async = ncclInProgress;
    EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess) << "rank " << r << ": " << ncclGetLastError(comm);
    const auto start = Clock::now();
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
    EXPECT_EQ(FromDevice(v, 1)[0], -1);
  }));
}

// A ring of Send-then-Recv outside a group deadlocks, as it does on GPUs (a Send completes only
// once its Recv is posted).
TEST(NcclSim, UngroupedRingHangsLikeNccl) {
  const ncclUniqueId id = NewId();
  ExpectAllPassed(RunRanks(2, [&](int r) {
    ncclComm_t comm = Join(id, 2, r);
    cudaStream_t s = NewStream();
    int32_t* a = ToDevice(std::vector<int32_t>{r});
    int32_t* b = ToDevice(std::vector<int32_t>{-1});
    ASSERT_EQ(ncclSend(a, 1, ncclInt32, 1 - r, comm, s), ncclSuccess);
    ASSERT_EQ(ncclRecv(b, 1, ncclInt32, 1 - r, comm, s), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }));
}

// A rank killed with SIGKILL: the others' async error becomes ncclRemoteError (no hang), new
// calls fail, and ncclCommAbort releases their streams.
TEST(NcclSim, KilledPeerGivesAsyncError) {
  const int n = 3;
  const ncclUniqueId id = NewId();
  std::vector<Exit> exits = RunRanks(n, [&](int r) {
    ncclComm_t comm = Join(id, n, r);
    cudaStream_t s = NewStream();
    float* v = ToDevice(std::vector<float>{1.0f});
    ASSERT_EQ(ncclAllReduce(v, v, 1, ncclFloat32, ncclSum, comm, s), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    if (r == n - 1) raise(SIGKILL);
    // Issued before or after this rank noticed the death.
    const ncclResult_t issued = ncclAllReduce(v, v, 1, ncclFloat32, ncclSum, comm, s);
    EXPECT_TRUE(issued == ncclSuccess || issued == ncclRemoteError) << issued;
    ncclResult_t async = ncclSuccess;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (async == ncclSuccess && Clock::now() < deadline) {
      ASSERT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(async, ncclRemoteError);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("rank " + std::to_string(n - 1)),
              std::string::npos)
        << ncclGetLastError(comm);
    EXPECT_EQ(ncclAllReduce(v, v, 1, ncclFloat32, ncclSum, comm, s), ncclRemoteError);
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  });
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_TRUE(exits[r].exited && exits[r].code == 0) << "rank " << r;
  }
  EXPECT_EQ(exits[n - 1].signal, SIGKILL);
}

}  // namespace
}  // namespace satdar::cuda_sim
