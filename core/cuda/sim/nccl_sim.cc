// core/cuda/sim/nccl_sim.cc: the NCCL subset of include/nccl.h on the CPU, for the CUDA simulator
// build. Ranks may live in one process (threads) or in several, on one machine or (with
// SATDAR_NCCL_SIM_ADDR set to a reachable IPv4 address of each host) on several.
//
// This file holds the API and the error text of ncclGetLastError; the transport (sockets, ids,
// meshes) is in nccl_sim_transport.cc, the operations on streams (matching, reductions, groups)
// in nccl_sim_collectives.cc, and what they share in nccl_sim_internal.h. The top comment of
// each describes its part.
//
// Non-blocking communicators (config.blocking = 0): init, split and finalize return
// ncclInProgress and finish on a thread; ncclCommGetAsyncError says ncclInProgress until then
// (the parent's too, during a split), and other calls on it meanwhile are ncclInvalidUsage.
// Collectives return ncclSuccess at once. ncclCommDestroy first waits for the queued
// operations (as ncclCommFinalize does).
#include <nccl.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/sim/nccl_sim_collectives.h"
#include "core/cuda/sim/nccl_sim_internal.h"
#include "core/cuda/sim/nccl_sim_transport.h"
#include "core/cuda/sim/sim_runtime.h"

namespace satdar::cuda_sim {
namespace {

// ---------------------------------------------------------------------------------------------
// Errors: the text of ncclGetLastError.

std::mutex g_error_mu;
std::string g_last_error;  // the last error of any thread (background jobs included)
std::atomic<uint64_t> g_error_stamp{0};
thread_local std::string t_last_error;
thread_local uint64_t t_error_stamp = 0;

}  // namespace

ncclResult_t Fail(ncclResult_t r, const std::string& msg) {
  t_last_error = msg;
  t_error_stamp = ++g_error_stamp;
  std::lock_guard<std::mutex> l(g_error_mu);
  g_last_error = msg;
  return r;
}

// Sets the communicator's async error; the first one stays, and none once it is closing.
void SetAsync(CommState* s, ncclResult_t r, const std::string& msg) {
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->closing || (s->async != ncclSuccess && s->async != ncclInProgress)) return;
    Fail(r, msg);
    s->async = r;
    s->error = msg;
    s->error_stamp = t_error_stamp;
  }
  s->cv.notify_all();
}

void SetReady(CommState* s) {
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->async == ncclInProgress) s->async = ncclSuccess;
  }
  s->cv.notify_all();
}

namespace {

uint64_t Random64() {
  static std::mutex mu;
  static std::mt19937_64 gen;
  static pid_t seeded_for = 0;
  std::lock_guard<std::mutex> l(mu);
  if (seeded_for != getpid()) {  // reseed in a forked child
    seeded_for = getpid();
    std::random_device rd;
    gen.seed((uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(getpid()) ^
             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  }
  return gen();
}

// ---------------------------------------------------------------------------------------------
// Setting communicators up and down.

// Reads `config` (NULL: `dflt`). Only `blocking` is simulated; other fields must be unset.
ncclResult_t ReadConfig(const char* call, const ncclConfig_t* c, bool dflt, bool* blocking) {
  *blocking = dflt;
  if (c == nullptr) return ncclSuccess;
  const std::string where = std::string(call) + ": config";
  if (c->magic != 0xcafebeef || c->size != sizeof(ncclConfig_t)) {
    return Fail(ncclInvalidArgument, where + " was not initialized with NCCL_CONFIG_INITIALIZER");
  }
  if (c->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (c->blocking != 0 && c->blocking != 1) {
      return Fail(ncclInvalidArgument, where + ".blocking must be 0 or 1");
    }
    *blocking = c->blocking == 1;
  }
  const int ints[] = {c->cgaClusterSize,      c->minCTAs,           c->maxCTAs,
                      c->splitShare,          c->trafficClass,      c->collnetEnable,
                      c->CTAPolicy,           c->shrinkShare,       c->nvlsCTAs,
                      c->nChannelsPerNetPeer, c->nvlinkCentricSched};
  for (int v : ints) {
    if (v != NCCL_CONFIG_UNDEF_INT) {
      Report(where +
             " sets a field other than blocking/commName/netName, which the NCCL "
             "simulator does not implement");
      return Fail(ncclInvalidArgument,
                  where + ": only blocking, commName and netName are simulated");
    }
  }
  return ncclSuccess;
}

void AddJob(CommState* s, std::thread t) {
  std::lock_guard<std::mutex> l(s->jobs_mu);
  s->jobs.push_back(std::move(t));
}

// Waits until no operation of `s` is queued (or it failed, or closes).
void Drain(CommState* s) {
  std::unique_lock<std::mutex> l(s->mu);
  s->cv.wait(l, [&] {
    return s->outstanding == 0 || s->closing ||
           (s->async != ncclSuccess && s->async != ncclInProgress);
  });
}

}  // namespace
}  // namespace satdar::cuda_sim

// ---------------------------------------------------------------------------------------------
// The API.

using satdar::cuda_sim::CommState;
namespace sim = satdar::cuda_sim;

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr)
    return sim::Fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  std::string err;
  sim::Listener* l = sim::Listener::Get(&err);
  if (l == nullptr) return sim::Fail(ncclSystemError, "ncclGetUniqueId: " + err);
  sim::IdBody body{sim::kIdMagic, l->ip(), l->port(), 0, sim::Random64()};
  l->AddRoot(body.nonce);
  std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
  std::memcpy(uniqueId->internal, &body, sizeof(body));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  const char* call = "ncclCommInitRankConfig";
  if (comm == nullptr) return sim::Fail(ncclInvalidArgument, std::string(call) + ": comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return sim::Fail(ncclInvalidArgument, std::string(call) + ": rank " + std::to_string(rank) +
                                              " is not in 0..nranks-1 (nranks " +
                                              std::to_string(nranks) + ")");
  }
  sim::IdBody id;
  std::memcpy(&id, commId.internal, sizeof(id));
  if (id.magic != sim::kIdMagic) {
    return sim::Fail(
        ncclInvalidArgument,
        std::string(call) + ": commId was not made by the simulator's ncclGetUniqueId");
  }
  bool blocking = true;
  ncclResult_t r = sim::ReadConfig(call, config, true, &blocking);
  if (r != ncclSuccess) return r;
  std::string err;
  sim::Listener* l = sim::Listener::Get(&err);
  if (l == nullptr) return sim::Fail(ncclSystemError, std::string(call) + ": " + err);
  auto s = std::make_shared<CommState>(blocking);
  s->Setup(rank, nranks);
  s->listener = l;
  s->token = sim::Random64();
  l->AddRoute(s->token, s);
  auto* handle = new ncclComm{s};
  if (!blocking) {
    sim::AddJob(s.get(), std::thread([s, id] { sim::InitJob(s.get(), id); }));
    *comm = handle;
    return ncclInProgress;
  }
  r = sim::InitJob(s.get(), id);
  if (r != ncclSuccess) {
    sim::Close(s.get(), true);
    delete handle;
    return r;
  }
  *comm = handle;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  const char* call = "ncclCommSplit";
  ncclResult_t r = sim::CheckReady(call, comm);
  if (r != ncclSuccess) return r;
  if (newcomm == nullptr)
    return sim::Fail(ncclInvalidArgument, std::string(call) + ": newcomm is NULL");
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return sim::Fail(ncclInvalidArgument, std::string(call) + ": color " + std::to_string(color) +
                                              " is negative and not NCCL_SPLIT_NOCOLOR");
  }
  std::shared_ptr<CommState> parent = comm->s;
  bool blocking = parent->blocking;
  if ((r = sim::ReadConfig(call, config, parent->blocking, &blocking)) != ncclSuccess) return r;
  std::shared_ptr<CommState> child;
  if (color != NCCL_SPLIT_NOCOLOR) {
    child = std::make_shared<CommState>(blocking);
    child->listener = parent->listener;
    child->token = sim::Random64();
    parent->listener->AddRoute(child->token, child);
  }
  uint64_t seq;
  bool in_progress = false;
  {
    std::lock_guard<std::mutex> l(parent->mu);
    seq = parent->ctrl_seq++;
    if (!blocking && parent->async == ncclSuccess) {
      parent->async = ncclInProgress;
      in_progress = true;
    }
  }
  ncclComm* handle = child != nullptr ? new ncclComm{child} : nullptr;
  if (!blocking) {
    std::thread t([=] { sim::SplitJob(parent, child, color, key, seq, in_progress); });
    sim::AddJob(child != nullptr ? child.get() : parent.get(), std::move(t));
    *newcomm = handle;
    return ncclInProgress;
  }
  r = sim::SplitJob(parent, child, color, key, seq, false);
  if (r != ncclSuccess) {
    if (child != nullptr) sim::Close(child.get(), true);
    delete handle;
    return r;
  }
  *newcomm = handle;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return sim::Fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  std::shared_ptr<CommState> s = comm->s;
  {
    std::lock_guard<std::mutex> l(s->mu);
    if (s->async != ncclSuccess) {
      return sim::Fail(s->async == ncclInProgress ? ncclInvalidUsage : s->async,
                       "ncclCommFinalize: the communicator is " +
                           (s->async == ncclInProgress ? std::string("still in progress")
                                                       : "failed: " + s->error));
    }
    s->finalized = true;
    if (!s->blocking) s->async = ncclInProgress;
  }
  if (!s->blocking) {
    sim::AddJob(s.get(), std::thread([s] {
                  sim::Drain(s.get());
                  sim::SetReady(s.get());
                }));
    return ncclInProgress;
  }
  sim::Drain(s.get());
  std::lock_guard<std::mutex> l(s->mu);
  return s->async == ncclInProgress ? ncclSuccess : s->async;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  sim::Drain(comm->s.get());  // NCCL finishes the queued operations first
  sim::Close(comm->s.get(), false);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  sim::Close(comm->s.get(), true);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) {
    return sim::Fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  }
  std::lock_guard<std::mutex> l(comm->s->mu);
  *asyncError = comm->s->async;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) {
    return sim::Fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
  }
  std::lock_guard<std::mutex> l(comm->s->mu);
  if (comm->s->nranks == 0) {
    return sim::Fail(ncclInvalidUsage, "ncclCommCount: the communicator is still being split");
  }
  *count = comm->s->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) {
    return sim::Fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
  }
  std::lock_guard<std::mutex> l(comm->s->mu);
  if (comm->s->nranks == 0) {
    return sim::Fail(ncclInvalidUsage, "ncclCommUserRank: the communicator is still being split");
  }
  *rank = comm->s->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

// The newer of this thread's last error and the communicator's error (any thread's last
// error when neither is set).
const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string text;
  text = sim::t_last_error;
  uint64_t stamp = sim::t_error_stamp;
  if (comm != nullptr) {
    std::lock_guard<std::mutex> l(comm->s->mu);
    if (!comm->s->error.empty() && comm->s->error_stamp >= stamp) text = comm->s->error;
  }
  if (text.empty()) {
    std::lock_guard<std::mutex> l(sim::g_error_mu);
    text = sim::g_last_error;
  }
  return text.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return sim::Submit(
      "ncclAllReduce",
      sim::Op{sim::kAllReduce, nullptr, stream, sendbuff, recvbuff, count, datatype, op, 0}, comm);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return sim::Submit(
      "ncclReduceScatter",
      sim::Op{sim::kReduceScatter, nullptr, stream, sendbuff, recvbuff, recvcount, datatype, op, 0},
      comm);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return sim::Submit("ncclAllGather",
                     sim::Op{sim::kAllGather, nullptr, stream, sendbuff, recvbuff, sendcount,
                             datatype, ncclSum, 0},
                     comm);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return sim::Submit(
      "ncclBroadcast",
      sim::Op{sim::kBroadcast, nullptr, stream, sendbuff, recvbuff, count, datatype, ncclSum, root},
      comm);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return sim::Submit(
      "ncclSend",
      sim::Op{sim::kSend, nullptr, stream, sendbuff, nullptr, count, datatype, ncclSum, peer},
      comm);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return sim::Submit(
      "ncclRecv",
      sim::Op{sim::kRecv, nullptr, stream, nullptr, recvbuff, count, datatype, ncclSum, peer},
      comm);
}

ncclResult_t ncclGroupStart() {
  ++sim::t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (sim::t_group_depth == 0) {
    return sim::Fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  }
  if (--sim::t_group_depth > 0) return ncclSuccess;
  std::vector<sim::Op> ops;
  ops.swap(sim::t_group_ops);
  const ncclResult_t failed = sim::t_group_error;
  sim::t_group_error = ncclSuccess;
  if (failed != ncclSuccess) return failed;  // the failed call's text stays the last error
  if (ops.empty()) return ncclSuccess;
  return sim::Launch(std::move(ops));
}
