// The Gloo communicator on real processes without mpirun: the test forks one child per rank,
// and the children meet through a FileKvStore under $TEST_TMPDIR. Each child reports through
// its exit code (gtest failures inside it print and make it exit 1).
#include "comm/gloo_communicator.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"
#include "comm/communicator_conformance_testutil.h"
#include "comm/kv_store.h"

namespace satdar::comm {
namespace {

using core::DType;

// How a child ended: its exit code, or 128 + the signal that killed it.
using Outcome = int;

// Runs body(rank) in one child process per rank listed in `ranks`, all at once; children still
// running after `limit` are killed (a hang is a failure, not a stuck test).
std::vector<Outcome> RunRanks(const std::vector<int>& ranks, absl::Duration limit,
                              const std::function<void(int)>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r : ranks) {
    pid_t pid = ::fork();
    if (pid == 0) {
      body(r);
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(::testing::Test::HasFailure() ? 1 : 0);
    }
    pids.push_back(pid);
  }
  std::vector<Outcome> out(pids.size(), -1);
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(limit);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (out[i] != -1) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        out[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (out[i] != -1) continue;
        ADD_FAILURE() << "rank " << ranks[i] << " (pid " << pids[i] << ") still running after "
                      << limit << "; killing it";
        ::kill(pids[i], SIGKILL);
        int status = 0;
        ::waitpid(pids[i], &status, 0);
        out[i] = 128 + SIGKILL;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::string FreshDir(const std::string& name) {
  return core::testing::TestTmpDir(absl::StrCat(name, "_", ::getpid()));
}

GlooOptions Options(const std::string& dir, int rank, int n, absl::Duration timeout) {
  GlooOptions o;
  o.rank = rank;
  o.world_size = n;
  o.store_dir = dir;
  o.timeout = timeout;
  return o;
}

// Everyone in `ranks` reaches this point (through the store, not the communicator, which may
// be broken) before anyone goes on; so nobody closes its connections while others still wait.
void StoreBarrier(const std::string& dir, const std::string& name, int rank,
                  const std::vector<int>& ranks) {
  auto store = FileKvStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set(absl::StrCat(name, "/", rank), "").ok());
  for (int p : ranks) {
    auto v = (*store)->Get(absl::StrCat(name, "/", p), absl::Seconds(60));
    ASSERT_TRUE(v.ok()) << v.status();
  }
}

float Input(int r, int i) { return 0.3f * (r + 1) + 1e-7f * r + 0.017f * i * (r % 2 ? -1 : 1); }

TEST(GlooWorld, RejectsBadArguments) {
  const std::string dir = FreshDir("gloo_bad_arguments");
  struct Case {
    GlooOptions options;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({Options(dir, 0, 0, absl::Seconds(1)), absl::StatusCode::kInvalidArgument,
                   "world size must be at least 1, got 0"});
  cases.push_back({Options(dir, -1, 2, absl::Seconds(1)), absl::StatusCode::kInvalidArgument,
                   "rank -1 is not in 0..1"});
  cases.push_back({Options(dir, 3, 3, absl::Seconds(1)), absl::StatusCode::kInvalidArgument,
                   "rank 3 is not in 0..2"});
  cases.push_back({Options("", 0, 2, absl::Seconds(1)), absl::StatusCode::kInvalidArgument,
                   "no rendezvous store"});
  cases.push_back({Options(dir, 0, 2, absl::ZeroDuration()), absl::StatusCode::kInvalidArgument,
                   "timeout must be positive"});
  cases.push_back({Options("/nonexistent-satdar-dir/store", 0, 2, absl::Seconds(1)),
                   absl::StatusCode::kUnavailable,
                   "rendezvous store /nonexistent-satdar-dir/store is not reachable"});
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/a_file", "x").ok());
  cases.push_back({Options(dir + "/a_file", 0, 2, absl::Seconds(1)), absl::StatusCode::kUnavailable,
                   "not a directory"});
  GlooOptions bad_host = Options(dir, 0, 2, absl::Seconds(1));
  bad_host.hostname = "no-such-host.invalid";
  cases.push_back({bad_host, absl::StatusCode::kInvalidArgument,
                   "cannot listen on host 'no-such-host.invalid'"});
  GlooOptions bad_iface = Options(dir, 0, 2, absl::Seconds(1));
  bad_iface.interface = "nosuchif0";
  cases.push_back(
      {bad_iface, absl::StatusCode::kInvalidArgument, "cannot listen on interface 'nosuchif0'"});
  for (const Case& c : cases) {
    auto world = GlooWorld(c.options);
    ASSERT_FALSE(world.ok());
    EXPECT_EQ(world.status().code(), c.code) << world.status();
    EXPECT_NE(world.status().message().find(c.message), std::string::npos) << world.status();
  }
}

TEST(GlooWorld, OptionsFromEnvironment) {
  ::unsetenv("SATDAR_RANK");
  auto missing = GlooOptionsFromEnv();
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("SATDAR_RANK is not set"), std::string::npos);
  ::setenv("SATDAR_RANK", "2", 1);
  ::setenv("SATDAR_WORLD_SIZE", "x", 1);
  auto bad = GlooOptionsFromEnv();
  EXPECT_NE(bad.status().message().find("SATDAR_WORLD_SIZE must be an integer, got 'x'"),
            std::string::npos)
      << bad.status();
  ::setenv("SATDAR_WORLD_SIZE", "4", 1);
  ::setenv("SATDAR_RENDEZVOUS_DIR", "/shared/job", 1);
  ::setenv("SATDAR_GLOO_IFACE", "lo", 1);
  ::setenv("SATDAR_TIMEOUT_S", "2.5", 1);
  auto o = GlooOptionsFromEnv();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->world_size, 4);
  EXPECT_EQ(o->store_dir, "/shared/job");
  EXPECT_EQ(o->interface, "lo");
  EXPECT_EQ(o->timeout, absl::Milliseconds(2500));
  for (const char* v : {"SATDAR_RANK", "SATDAR_WORLD_SIZE", "SATDAR_RENDEZVOUS_DIR",
                        "SATDAR_GLOO_IFACE", "SATDAR_TIMEOUT_S"}) {
    ::unsetenv(v);
  }
}

// Every rank of worlds of 1 to 4 processes passes the conformance checks, and a float sum is
// bit-identical on every rank and equal to the rank-order sum.
TEST(GlooCommunicator, ConformanceOnProcesses) {
  const int count = 1000;
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat(n, " ranks"));
    const std::string dir = FreshDir(absl::StrCat("gloo_conformance", n));
    auto outcomes = RunRanks(Iota(n), absl::Seconds(120), [&](int r) {
      GlooOptions o = Options(dir + "/store", r, n, absl::Seconds(30));
      if (n == 2) o.interface = "lo";  // by interface name rather than by address
      auto world = GlooWorld(o);
      ASSERT_TRUE(world.ok()) << world.status();
      std::vector<float> x(count);
      for (int i = 0; i < count; ++i) x[i] = Input(r, i);
      ASSERT_TRUE(
          (*world)->AllReduce(x.data(), count, DType::kF32, ReduceOp::kSum, {})->Wait().ok());
      ASSERT_TRUE(core::WriteFileAtomically(
                      absl::StrCat(dir, "/sum.", r),
                      std::string(reinterpret_cast<const char*>(x.data()), count * sizeof(float)))
                      .ok());
      RunCommunicatorConformance(world->get(), r, n);
      StoreBarrier(dir + "/store", "exit", r, Iota(n));
    });
    for (int r = 0; r < n; ++r) EXPECT_EQ(outcomes[r], 0) << "rank " << r;
    std::vector<float> expect(count);
    for (int i = 0; i < count; ++i) {
      float acc = Input(0, i);
      for (int p = 1; p < n; ++p) acc += Input(p, i);
      expect[i] = acc;
    }
    const std::string want(reinterpret_cast<const char*>(expect.data()), count * sizeof(float));
    for (int r = 0; r < n; ++r) {
      auto got = core::ReadFileToString(absl::StrCat(dir, "/sum.", r), core::kMaxSmallFileBytes);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(*got == want) << "rank " << r
                                << "'s sum is not bit-identical to the rank-order sum";
    }
  }
}

// Rank 2 never starts: ranks 0 and 1 give up at the rendezvous after the timeout, naming it.
TEST(GlooCommunicator, RankThatNeverArrivesIsNamed) {
  const std::string dir = FreshDir("gloo_never_arrives");
  const absl::Duration timeout = absl::Milliseconds(1500);
  auto outcomes = RunRanks({0, 1}, absl::Seconds(60), [&](int r) {
    const auto start = std::chrono::steady_clock::now();
    auto world = GlooWorld(Options(dir, r, 3, timeout));
    const absl::Duration took = absl::FromChrono(std::chrono::steady_clock::now() - start);
    ASSERT_FALSE(world.ok());
    EXPECT_EQ(world.status().code(), absl::StatusCode::kDeadlineExceeded) << world.status();
    EXPECT_NE(world.status().message().find("ranks that never arrived: 2"), std::string::npos)
        << world.status();
    EXPECT_GE(took, timeout * 0.9);
    EXPECT_LT(took, timeout + absl::Seconds(5));
  });
  EXPECT_EQ(outcomes, (std::vector<Outcome>{0, 0}));
}

// Rank 2 joins but skips a collective: the others time out naming rank 2 (not each other),
// and the communicator refuses later work at once.
TEST(GlooCommunicator, RankThatSkipsACollectiveIsNamed) {
  const std::string dir = FreshDir("gloo_skips");
  auto outcomes = RunRanks(Iota(3), absl::Seconds(60), [&](int r) {
    auto world = GlooWorld(Options(dir, r, 3, absl::Seconds(30)));
    ASSERT_TRUE(world.ok()) << world.status();
    ASSERT_TRUE((*world)->Barrier({})->Wait().ok());
    if (r != 2) {
      CollectiveOptions fast;
      fast.timeout = absl::Seconds(1);
      std::vector<double> x = {1.0 * r};
      const auto start = std::chrono::steady_clock::now();
      absl::Status s = (*world)->AllReduce(x.data(), 1, DType::kF64, ReduceOp::kSum, fast)->Wait();
      const absl::Duration took = absl::FromChrono(std::chrono::steady_clock::now() - start);
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_NE(s.message().find("ranks that never arrived: 2"), std::string::npos) << s;
      EXPECT_LT(took, absl::Seconds(6)) << s;
      absl::Status later = (*world)->Barrier({})->Wait();
      EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
      EXPECT_NE(later.message().find("ranks that never arrived: 2"), std::string::npos) << later;
    }
    StoreBarrier(dir, "exit", r, Iota(3));
  });
  EXPECT_EQ(outcomes, (std::vector<Outcome>{0, 0, 0}));
}

// Rank 2 is killed after a few collectives: the survivors' next collective fails (it does not
// hang) well within its timeout, naming rank 2.
TEST(GlooCommunicator, KilledRankMakesSurvivorsFail) {
  const std::string dir = FreshDir("gloo_killed");
  const absl::Duration timeout = absl::Seconds(20);
  auto outcomes = RunRanks(Iota(3), absl::Seconds(90), [&](int r) {
    auto world = GlooWorld(Options(dir, r, 3, absl::Seconds(30)));
    ASSERT_TRUE(world.ok()) << world.status();
    std::vector<float> x(1000, 1.0f);
    ASSERT_TRUE(
        (*world)->AllReduce(x.data(), x.size(), DType::kF32, ReduceOp::kSum, {})->Wait().ok());
    ASSERT_TRUE((*world)->Barrier({})->Wait().ok());
    if (r == 2) ::raise(SIGKILL);
    CollectiveOptions o;
    o.timeout = timeout;
    const auto start = std::chrono::steady_clock::now();
    absl::Status s =
        (*world)->AllReduce(x.data(), x.size(), DType::kF32, ReduceOp::kSum, o)->Wait();
    const absl::Duration took = absl::FromChrono(std::chrono::steady_clock::now() - start);
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
    EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s;
    EXPECT_LT(took, timeout) << s;
    StoreBarrier(dir, "exit", r, {0, 1});
  });
  EXPECT_EQ(outcomes, (std::vector<Outcome>{0, 0, 128 + SIGKILL}));
}

}  // namespace
}  // namespace satdar::comm
