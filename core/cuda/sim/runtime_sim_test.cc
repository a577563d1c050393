// Tests of the simulated CUDA runtime (core/cuda/sim/runtime_sim.cc).
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/sim/sim_runtime.h"
#include "gtest/gtest.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace satdar::cuda_sim {
namespace {

// A latch that queued work blocks on until the test opens it.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
  }
  // False if not opened within `ms`.
  bool WaitFor(int ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

cudaStream_t NewStream(unsigned flags = cudaStreamNonBlocking) {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
  return s;
}

cudaEvent_t NewEvent() {
  cudaEvent_t e = nullptr;
  EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  return e;
}

// Queues work that blocks `stream` until `gate` opens.
void Block(cudaStream_t stream, Gate* gate) {
  ASSERT_EQ(Enqueue(stream, [gate] {
              gate->Wait();
              return cudaSuccess;
            }),
            cudaSuccess);
}

// Queues work that stores `value` into `*flag`.
void Store(cudaStream_t stream, std::atomic<int>* flag, int value) {
  ASSERT_EQ(Enqueue(stream, [flag, value] {
              flag->store(value);
              return cudaSuccess;
            }),
            cudaSuccess);
}

TEST(RuntimeSimTest, DevicesAndProperties) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (std::getenv("SATDAR_SIM_DEVICES") == nullptr) {
    EXPECT_EQ(count, 8);  // an 8-GPU node
  }
  ASSERT_GE(count, 2);
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 0);
  ASSERT_EQ(cudaSetDevice(count - 1), cudaSuccess);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, count - 1);
  std::thread([] {  // the current device is per host thread
    int d = -1;
    EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
    EXPECT_EQ(d, 0);
  }).join();
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, count - 1);  // unchanged by the failed calls
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);

  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_STREQ(prop.name, "CUDA simulator (H200 limits)");
  EXPECT_EQ(prop.sharedMemPerBlock, 49152u);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, 232448u);
  EXPECT_EQ(prop.maxThreadsPerBlock, 1024);
  EXPECT_EQ(prop.maxThreadsDim[2], 64);
  EXPECT_EQ(prop.maxGridSize[0], 2147483647);
  EXPECT_EQ(prop.maxGridSize[1], 65535);
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(prop.multiProcessorCount, 132);
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.minor, 0);
  EXPECT_GT(prop.totalGlobalMem, size_t{140} << 30);
  EXPECT_EQ(cudaGetDeviceProperties(&prop, count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetDeviceProperties(nullptr, 0), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST(RuntimeSimTest, MallocAndFree) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1000), cudaSuccess);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_TRUE(IsDeviceRange(p, 1000));
  EXPECT_TRUE(IsDeviceRange(static_cast<char*>(p) + 999, 1));
  EXPECT_FALSE(IsDeviceRange(p, 1001));
  EXPECT_FALSE(IsDeviceRange(static_cast<char*>(p) + 1000, 1));
  int host = 0;
  EXPECT_FALSE(IsDeviceRange(&host, sizeof(host)));
  EXPECT_FALSE(IsDeviceRange(nullptr, 1));
#if defined(__SANITIZE_ADDRESS__)
  // Exactly the requested size: AddressSanitizer flags the first byte past it.
  EXPECT_FALSE(__asan_address_is_poisoned(static_cast<char*>(p) + 999));
  EXPECT_TRUE(__asan_address_is_poisoned(static_cast<char*>(p) + 1000));
#endif

  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  EXPECT_EQ(cudaFree(&host), cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cudaFree(static_cast<char*>(p) + 8), cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_FALSE(IsDeviceRange(p, 1));
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidDevicePointer);  // double free: an error, no crash

  void* zero = &host;
  EXPECT_EQ(cudaMalloc(&zero, 0), cudaSuccess);
  EXPECT_EQ(zero, nullptr);
  EXPECT_EQ(cudaMalloc(nullptr, 16), cudaErrorInvalidValue);

  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  EXPECT_FALSE(IsDeviceRange(pinned, 64));
  EXPECT_EQ(cudaFree(pinned), cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cudaFreeHost(&host), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(nullptr), cudaSuccess);
  cudaGetLastError();
}

TEST(RuntimeSimTest, CopiesCheckSizesAndDirections) {
  constexpr size_t kN = 64;
  char* d = nullptr;
  char* d2 = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), kN), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d2), kN), cudaSuccess);
  std::vector<char> in(kN), out(kN + 8, 0);
  for (size_t i = 0; i < kN; ++i) in[i] = static_cast<char>(i + 1);

  EXPECT_EQ(cudaMemcpy(d, in.data(), kN, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d2, d, kN, cudaMemcpyDeviceToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.data(), d2, kN, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(out.data(), in.data(), kN), 0);

  // Wrong directions.
  EXPECT_EQ(cudaMemcpy(out.data(), in.data(), kN, cudaMemcpyHostToDevice),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemcpy(d, d2, kN, cudaMemcpyHostToDevice), cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemcpy(d, out.data(), kN, cudaMemcpyDeviceToHost),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemcpy(d, in.data(), kN, cudaMemcpyDeviceToDevice),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemcpy(d, in.data(), kN, cudaMemcpyHostToHost), cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemcpy(d, in.data(), kN, static_cast<cudaMemcpyKind>(7)),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);

  // Ranges past the end: an error and nothing copied.
  std::vector<char> big(kN + 8, 'x');
  EXPECT_EQ(cudaMemcpy(d, big.data(), kN + 1, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d + 1, big.data(), kN, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(out.data(), d, kN + 1, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d2, d + 8, kN, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(d, big.data(), kN + 1, cudaMemcpyHostToDevice, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, nullptr, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  ASSERT_EQ(cudaMemcpy(out.data(), d, kN, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(out.data(), in.data(), kN), 0);  // unchanged
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);

  // A pinned buffer's bounds are checked too.
  char* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 16), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(pinned, d, 17, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(pinned, d, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(pinned[15], in[15]);

  // cudaMemcpyDefault infers the direction; zero bytes are fine.
  std::vector<char> out2(kN, 0);
  EXPECT_EQ(cudaMemcpy(d2, big.data(), kN, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out2.data(), d2, kN, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(out2[3], 'x');
  EXPECT_EQ(cudaMemcpy(d, in.data(), 0, cudaMemcpyHostToDevice), cudaSuccess);
  cudaGetLastError();

  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d2), cudaSuccess);
}

TEST(RuntimeSimTest, AsyncCopiesFollowPinnedAndPageableRules) {
  cudaStream_t s = NewStream();
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)), cudaSuccess);
  Gate gate;
  Block(s, &gate);
  int pageable = 7;  // staged at the call: reusing it at once is fine
  ASSERT_EQ(cudaMemcpyAsync(d, &pageable, sizeof(int), cudaMemcpyHostToDevice, s), cudaSuccess);
  pageable = 8;
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int)), cudaSuccess);
  *pinned = 0;
  ASSERT_EQ(cudaMemcpyAsync(pinned, d, sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(*pinned, 0);  // to pinned memory: queued, not done
  gate.Open();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(*pinned, 7);
  int back = 0;  // to pageable memory: done when the call returns
  ASSERT_EQ(cudaMemcpyAsync(&back, d, sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(back, 7);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(RuntimeSimTest, Memsets) {
  constexpr size_t kN = 100;
  unsigned char* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), kN), cudaSuccess);
  std::vector<unsigned char> out(kN);
  ASSERT_EQ(cudaMemset(d, 0x1ab, kN), cudaSuccess);  // only the low byte counts
  ASSERT_EQ(cudaMemcpy(out.data(), d, kN, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(out[0], 0xab);
  EXPECT_EQ(out[kN - 1], 0xab);
  EXPECT_EQ(cudaMemset(d, 0, kN + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(out.data(), 0, kN), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(d + 1, 0, kN, nullptr), cudaErrorInvalidValue);

  cudaStream_t s = NewStream();
  ASSERT_EQ(cudaMemsetAsync(d, 1, kN, s), cudaSuccess);
  // 2-D: rows of 10 with a pitch of 20, 5 rows: bytes 0..89 span; 10..19 of each row untouched.
  ASSERT_EQ(cudaMemset2DAsync(d, 20, 2, 10, 5, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), d, kN, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < kN; ++i) {
    const bool in_row = i < 90 && i % 20 < 10;
    ASSERT_EQ(out[i], in_row ? 2 : 1) << i;
  }
  EXPECT_EQ(cudaMemset2DAsync(d, 20, 0, 10, 6, s), cudaErrorInvalidValue);  // spans 110 > 100
  EXPECT_EQ(cudaMemset2DAsync(d, 25, 0, 10, 5, s), cudaErrorInvalidValue);  // spans 110
  EXPECT_EQ(cudaMemset2DAsync(d, 20, 0, 21, 5, s), cudaErrorInvalidValue);  // pitch < width
  EXPECT_EQ(cudaMemset2DAsync(d + 1, 22, 3, 10, 5, s), cudaSuccess);        // spans 98: fits
  EXPECT_EQ(cudaMemset2DAsync(nullptr, 20, 0, 10, 5, s), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset2DAsync(d, 20, 0, 0, 5, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  cudaGetLastError();
}

TEST(RuntimeSimTest, StreamRunsItsWorkInOrder) {
  cudaStream_t s = NewStream();
  std::vector<int> order;  // written by the stream's worker only
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(Enqueue(s,
                      [&order, i] {
                        order.push_back(i);
                        return cudaSuccess;
                      }),
              cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(order[i], i);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(Enqueue(s, [] { return cudaSuccess; }), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(Enqueue(cudaStreamPerThread, [] { return cudaSuccess; }),
            cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(nullptr), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

TEST(RuntimeSimTest, StreamsRunConcurrently) {
  cudaStream_t a = NewStream();
  cudaStream_t b = NewStream();
  Gate released;
  std::atomic<bool> a_saw_release{false};
  // a blocks until work on b opens the gate: needs the two streams to run at once.
  ASSERT_EQ(Enqueue(a,
                    [&] {
                      a_saw_release = released.WaitFor(20000);
                      return cudaSuccess;
                    }),
            cudaSuccess);
  ASSERT_EQ(Enqueue(b,
                    [&] {
                      released.Open();
                      return cudaSuccess;
                    }),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
  EXPECT_TRUE(a_saw_release);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(a), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(b), cudaSuccess);
}

TEST(RuntimeSimTest, WaitEventOrdersStreams) {
  cudaStream_t compute = NewStream();
  cudaStream_t comm = NewStream();
  cudaEvent_t done = NewEvent();
  std::atomic<int> flag{0};
  std::atomic<int> seen{-1};

  // Without a wait, comm reads the flag before compute (held by the gate) has written it: the
  // race that a missing cudaStreamWaitEvent causes is observable.
  Gate gate;
  Block(compute, &gate);
  Store(compute, &flag, 1);
  ASSERT_EQ(Enqueue(comm, [&] {
              seen = flag.load();
              return cudaSuccess;
            }),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(comm), cudaSuccess);
  EXPECT_EQ(seen, 0);
  gate.Open();
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);

  // With the wait, comm sees compute's write.
  flag = 0;
  Gate gate2;
  Block(compute, &gate2);
  Store(compute, &flag, 2);
  ASSERT_EQ(cudaEventRecord(done, compute), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamWaitEvent(comm, done, 0), cudaSuccess);
  // The wait captured the position: re-recording later (behind a closed gate) and destroying
  // the event do not change it.
  Gate gate3;
  Block(compute, &gate3);
  Store(compute, &flag, 3);
  ASSERT_EQ(cudaEventRecord(done, compute), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(done), cudaSuccess);
  ASSERT_EQ(Enqueue(comm, [&] {
              seen = flag.load();
              return cudaSuccess;
            }),
            cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(comm), cudaErrorNotReady);
  gate2.Open();
  ASSERT_EQ(cudaStreamSynchronize(comm), cudaSuccess);  // runs while gate3 is still closed
  EXPECT_EQ(seen, 2);
  gate3.Open();
  ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  EXPECT_EQ(flag, 3);
  EXPECT_EQ(cudaStreamDestroy(compute), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(comm), cudaSuccess);
}

// Plain (non-atomic) data handed from one stream to another through an event: the simulator's
// dependency gives ThreadSanitizer the happens-before edge, so this is clean under TSan, while
// the same hand-off without cudaStreamWaitEvent is a data race TSan reports.
TEST(RuntimeSimTest, WaitEventPublishesPlainData) {
  cudaStream_t producer = NewStream();
  cudaStream_t consumer = NewStream();
  cudaEvent_t ready = NewEvent();
  std::vector<int> data(256, 0);
  int64_t sum = 0;
  for (int round = 1; round <= 20; ++round) {
    ASSERT_EQ(Enqueue(producer, [&data, round] {
                for (int& v : data) v = round;
                return cudaSuccess;
              }),
              cudaSuccess);
    ASSERT_EQ(cudaEventRecord(ready, producer), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(consumer, ready, 0), cudaSuccess);
    ASSERT_EQ(Enqueue(consumer, [&data, &sum] {
                for (int v : data) sum += v;
                return cudaSuccess;
              }),
              cudaSuccess);
    // The producer's next round must not overwrite data the consumer still reads.
    ASSERT_EQ(cudaEventRecord(ready, consumer), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(producer, ready, 0), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  EXPECT_EQ(sum, int64_t{256} * (20 * 21 / 2));
  EXPECT_EQ(cudaEventDestroy(ready), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(producer), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(consumer), cudaSuccess);
}

TEST(RuntimeSimTest, EventQueryAndSynchronize) {
  cudaEvent_t e = NewEvent();
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);        // never recorded: complete
  EXPECT_EQ(cudaEventSynchronize(e), cudaSuccess);
  cudaStream_t s = NewStream();
  Gate gate;
  Block(s, &gate);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // NotReady is not an error
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate.Open();
  });
  EXPECT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  opener.join();
  cudaEvent_t bad = nullptr;
  EXPECT_EQ(cudaEventCreateWithFlags(&bad, 0x80), cudaErrorInvalidValue);
  EXPECT_EQ(cudaEventCreateWithFlags(nullptr, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventRecord(e, s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  cudaGetLastError();
}

TEST(RuntimeSimTest, LegacyDefaultStreamOrdersWithBlockingStreams) {
  cudaStream_t blocking = NewStream(cudaStreamDefault);
  cudaStream_t blocking2 = NewStream(cudaStreamDefault);
  cudaStream_t nonblocking = NewStream(cudaStreamNonBlocking);
  std::vector<int> order;
  std::mutex mu;
  auto log = [&](int v) {
    return [&, v] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(v);
      return cudaSuccess;
    };
  };
  Gate gate;
  Block(blocking, &gate);
  ASSERT_EQ(Enqueue(blocking, log(1)), cudaSuccess);
  ASSERT_EQ(Enqueue(nullptr, log(2)), cudaSuccess);           // waits for blocking's work
  ASSERT_EQ(Enqueue(blocking2, log(3)), cudaSuccess);         // waits for the legacy work
  ASSERT_EQ(Enqueue(nonblocking, log(0)), cudaSuccess);       // waits for nothing
  ASSERT_EQ(cudaStreamSynchronize(nonblocking), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(blocking2), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(cudaStreamLegacy), cudaErrorNotReady);
  gate.Open();
  ASSERT_EQ(cudaStreamSynchronize(blocking2), cudaSuccess);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));

  // A non-blocking stream ignores the legacy stream both ways.
  Gate gate2;
  Block(nullptr, &gate2);
  std::atomic<int> flag{0};
  Store(nonblocking, &flag, 1);
  ASSERT_EQ(cudaStreamSynchronize(nonblocking), cudaSuccess);
  EXPECT_EQ(flag, 1);
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);
  gate2.Open();
  // cudaStreamSynchronize(0) also waits for earlier work on blocking streams.
  Gate gate3;
  Block(blocking, &gate3);
  Store(blocking, &flag, 2);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate3.Open();
  });
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(flag, 2);
  opener.join();
  // cudaMemcpy is ordered after earlier work on blocking streams.
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)), cudaSuccess);
  Gate gate4;
  Block(blocking, &gate4);
  ASSERT_EQ(cudaMemsetAsync(d, 0x11, sizeof(int), blocking), cudaSuccess);
  std::thread opener4([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate4.Open();
  });
  int host = 0;
  ASSERT_EQ(cudaMemcpy(&host, d, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 0x11111111);
  opener4.join();
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(blocking2), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(nonblocking), cudaSuccess);
}

TEST(RuntimeSimTest, FailedWorkIsStickyOnItsStream) {
  cudaStream_t s = NewStream();
  cudaStream_t other = NewStream();
  cudaEvent_t before = NewEvent();
  cudaEvent_t after = NewEvent();
  std::atomic<int> flag{0};
  ASSERT_EQ(cudaEventRecord(before, s), cudaSuccess);
  ASSERT_EQ(Enqueue(s, [] { return cudaErrorIllegalAddress; }), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // queued fine
  Store(s, &flag, 1);                          // skipped: the stream has faulted
  ASSERT_EQ(cudaEventRecord(after, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorIllegalAddress);  // sticky
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorIllegalAddress);
  EXPECT_EQ(flag, 0);
  EXPECT_EQ(cudaEventSynchronize(before), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(after), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaEventQuery(after), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  // A stream that waits on the faulted position faults too; it does not run on garbage.
  ASSERT_EQ(cudaStreamWaitEvent(other, after, 0), cudaSuccess);
  Store(other, &flag, 2);
  EXPECT_EQ(cudaStreamSynchronize(other), cudaErrorIllegalAddress);
  EXPECT_EQ(flag, 0);
  // A stream with no dependency on it keeps working.
  cudaStream_t fine = NewStream();
  Store(fine, &flag, 3);
  EXPECT_EQ(cudaStreamSynchronize(fine), cudaSuccess);
  EXPECT_EQ(flag, 3);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the faulted streams are gone
  EXPECT_EQ(cudaStreamDestroy(fine), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(before), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(after), cudaSuccess);
  SetLastError(cudaSuccess);  // does not clear
  SetLastError(cudaErrorLaunchFailure);
  SetLastError(cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(Enqueue(nullptr, std::function<cudaError_t()>()), cudaErrorInvalidValue);
}

// A fault on the legacy default stream reaches every blocking stream of its device through the
// implicit dependencies (as a fault kills the context in CUDA); non-blocking streams and other
// devices go on. Uses the last device so that the other tests' device 0 stays healthy.
TEST(RuntimeSimTest, LegacyStreamFaultReachesBlockingStreams) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(count - 1), cudaSuccess);
  cudaStream_t blocking = NewStream(cudaStreamDefault);
  cudaStream_t nonblocking = NewStream(cudaStreamNonBlocking);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)), cudaSuccess);
  ASSERT_EQ(Enqueue(cudaStreamLegacy, [] { return cudaErrorLaunchFailure; }), cudaSuccess);
  std::atomic<int> flag{0};
  Store(blocking, &flag, 1);
  EXPECT_EQ(cudaStreamSynchronize(blocking), cudaErrorLaunchFailure);
  EXPECT_EQ(flag, 0);
  int host = 0;
  EXPECT_EQ(cudaMemcpy(&host, d, sizeof(int), cudaMemcpyDeviceToHost), cudaErrorLaunchFailure);
  Store(nonblocking, &flag, 2);
  EXPECT_EQ(cudaStreamSynchronize(nonblocking), cudaSuccess);
  EXPECT_EQ(flag, 2);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(nonblocking), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaGetLastError();
}

TEST(RuntimeSimTest, DestroyWaitsForPendingWork) {
  cudaStream_t s = NewStream();
  std::atomic<int> flag{0};
  ASSERT_EQ(Enqueue(s, [&] {
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
              flag = 1;
              return cudaSuccess;
            }),
            cudaSuccess);
  Store(s, &flag, 2);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(flag, 2);
}

TEST(RuntimeSimTest, FreeWaitsForQueuedWork) {
  cudaStream_t s = NewStream();
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  Gate gate;
  Block(s, &gate);
  ASSERT_EQ(cudaMemsetAsync(d, 0, 4096, s), cudaSuccess);
  std::atomic<bool> freed{false};
  std::thread freer([&] {
    EXPECT_EQ(cudaFree(d), cudaSuccess);
    freed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(freed);
  gate.Open();
  freer.join();
  EXPECT_TRUE(freed);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(RuntimeSimTest, StreamFlagsAndPriority) {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, 0x10), cudaErrorInvalidValue);
  EXPECT_EQ(cudaStreamCreateWithFlags(nullptr, 0), cudaErrorInvalidValue);
  ASSERT_EQ(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -5), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

TEST(RuntimeSimTest, StreamsBelongToTheirDevice) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s = NewStream();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::atomic<int> seen{-1};
  ASSERT_EQ(Enqueue(s, [&] {
              int d = -1;
              cudaGetDevice(&d);
              seen = d;
              return cudaSuccess;
            }),
            cudaSuccess);
  Gate gate;
  Block(s, &gate);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // device 0: does not wait for device 1
  gate.Open();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(seen, 1);  // the stream's worker has the stream's device current
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(RuntimeSimTest, ErrorStringsAndReport) {
  const cudaError_t all[] = {
      cudaSuccess,           cudaErrorInvalidValue,           cudaErrorMemoryAllocation,
      cudaErrorInitializationError, cudaErrorInvalidConfiguration, cudaErrorInvalidDevicePointer,
      cudaErrorInvalidMemcpyDirection, cudaErrorInvalidResourceHandle, cudaErrorNotReady,
      cudaErrorIllegalAddress, cudaErrorLaunchOutOfResources, cudaErrorLaunchFailure,
      cudaErrorNoDevice,     cudaErrorInvalidDevice,          cudaErrorUnknown};
  for (cudaError_t e : all) {
    EXPECT_EQ(std::string(cudaGetErrorName(e)).rfind("cuda", 0), 0u) << e;
    EXPECT_STRNE(cudaGetErrorString(e), "unrecognized error code") << e;
  }
  EXPECT_STREQ(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
  EXPECT_STREQ(cudaGetErrorString(static_cast<cudaError_t>(12345)), "unrecognized error code");

  static int run = 0;  // messages are reported once per process: new ones for each repeat
  const std::string a = "test message A" + std::to_string(run);
  const std::string b = "test message B" + std::to_string(run++);
  testing::internal::CaptureStderr();
  Report(a);
  Report(a);
  std::thread([&b] { Report(b); }).join();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "satdar cuda simulator: " + a + "\nsatdar cuda simulator: " + b + "\n");
}

TEST(RuntimeSimTest, ManyThreadsEnqueueConcurrently) {
  cudaStream_t s = NewStream();
  std::atomic<int> count{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        EXPECT_EQ(Enqueue(s, [&] {
                    count.fetch_add(1);
                    return cudaSuccess;
                  }),
                  cudaSuccess);
        if (i % 50 == 0) {
          EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(count, 800);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

std::atomic<int> g_exit_flag{0};

TEST(RuntimeSimTest, StreamLeftAtExitIsSafe) {
  // Not destroyed on purpose: the process must exit cleanly with this stream alive, an item
  // still running at exit (given time to finish) and work queued behind it (dropped).
  cudaStream_t s = NewStream();
  ASSERT_EQ(Enqueue(s, [] {
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
              g_exit_flag = 1;
              return cudaSuccess;
            }),
            cudaSuccess);
  Store(s, &g_exit_flag, 2);
  cudaStream_t idle = NewStream(cudaStreamDefault);
  Store(idle, &g_exit_flag, 0);
  ASSERT_EQ(cudaStreamSynchronize(idle), cudaSuccess);
}

}  // namespace
}  // namespace satdar::cuda_sim
