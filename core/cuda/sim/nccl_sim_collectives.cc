// core/cuda/sim/nccl_sim_collectives.cc: the NCCL simulator's operations on streams: matching,
// data movement and reductions of the collectives and of Send/Recv, and groups (the transport is
// nccl_sim_transport.cc, the API nccl_sim.cc).
//
// Semantics. Every operation is queued on its cudaStream_t (Enqueue) and moves data when the
// stream reaches it. Collectives and point-to-point calls are matched by issue order, as NCCL's
// are (collective n of a rank meets collective n of every other; the k-th Send from a to b
// meets the k-th Recv on b from a) and the simulator checks that the matched calls agree
// (operation, type, count, op, root; bytes for Send/Recv): a mismatch is ncclInvalidUsage,
// reported with Report. A Send completes only once its Recv is posted (as NCCL's do), so a
// ring of Send-then-Recv outside a group hangs as it would on GPUs, and inside a group does
// not. Reductions are computed by every rank from all contributions in rank order:
//   acc = x_0; acc = op(acc, x_1); ...; acc = op(acc, x_{n-1}); for ncclAvg then acc / n,
// in the type itself (wrapping for integers; bf16: each step in f32, rounded to nearest even
// to bf16), so every rank gets the same bits. (NCCL's own ring/tree order differs; ncclAvg of
// floats on NCCL pre-multiplies by 1/n.) As on NCCL, an operation that cannot complete (a dead
// or missing peer, a mismatch) does not finish on its stream until the communicator is aborted
// (ncclCommAbort) or destroyed; the error shows in ncclCommGetAsyncError. An aborted or
// destroyed communicator says goodbye to its peers, so a peer's abort is no error on the others
// (their operations that needed it wait, as on NCCL); only a connection that closes without one
// is.
//
// Groups: the operations of a group (or a lone call) on one (communicator, stream) become one
// stream item that posts its receives, then sends, then receives. A call that fails inside a
// group fails the group: ncclGroupEnd returns its error and queues nothing.
// Cost: every rank sends its whole contribution to every other (n (n - 1) messages per
// collective) and each message is copied through the reader: meant for tests, not speed.
#include "core/cuda/sim/nccl_sim_collectives.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda/sim/nccl_sim_internal.h"
#include "core/cuda/sim/nccl_sim_transport.h"
#include "core/cuda/sim/sim_runtime.h"

namespace satdar::cuda_sim {

// ---------------------------------------------------------------------------------------------
// Types and reductions.

// 0 for the types the simulator does not implement.
size_t TypeSize(int32_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

namespace {

const char* OpName(int32_t k) {
  switch (k) {
    case kAllReduce: return "ncclAllReduce";
    case kReduceScatter: return "ncclReduceScatter";
    case kAllGather: return "ncclAllGather";
    case kBroadcast: return "ncclBroadcast";
    case kSend: return "ncclSend";
    case kRecv: return "ncclRecv";
  }
  return "?";
}

const char* TypeName(int32_t t) {
  static const char* const kNames[] = {"ncclInt8",     "ncclUint8",      "ncclInt32",
                                       "ncclUint32",   "ncclInt64",      "ncclUint64",
                                       "ncclFloat16",  "ncclFloat32",    "ncclFloat64",
                                       "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return t >= 0 && t < ncclNumTypes ? kNames[t] : "an unknown ncclDataType_t";
}

const char* RedName(int32_t r) {
  static const char* const kNames[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
  return r >= 0 && r < ncclNumOps ? kNames[r] : "an unknown ncclRedOp_t";
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN.
uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <typename T>
T Apply(T a, T b, int32_t op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // integers wrap, as on the GPU
    switch (op) {
      case ncclProd: return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ncclMax: return std::max(a, b);
      case ncclMin: return std::min(a, b);
      default: return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  } else {
    switch (op) {
      case ncclProd: return a * b;
      case ncclMax: return std::fmax(a, b);
      case ncclMin: return std::fmin(a, b);
      default: return a + b;
    }
  }
}

template <typename T>
void CombineT(char* acc, const char* x, size_t n, int32_t op) {
  for (size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, x + i * sizeof(T), sizeof(T));
    a = Apply(a, b, op);
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

void CombineBf16(char* acc, const char* x, size_t n, int32_t op) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, acc + 2 * i, 2);
    std::memcpy(&b, x + 2 * i, 2);
    a = FloatToBf16(Apply(Bf16ToFloat(a), Bf16ToFloat(b), op));
    std::memcpy(acc + 2 * i, &a, 2);
  }
}

// acc = op(acc, x), element by element.
void Combine(char* acc, const char* x, size_t n, int32_t type, int32_t op) {
  switch (type) {
    case ncclInt8: return CombineT<int8_t>(acc, x, n, op);
    case ncclUint8: return CombineT<uint8_t>(acc, x, n, op);
    case ncclInt32: return CombineT<int32_t>(acc, x, n, op);
    case ncclUint32: return CombineT<uint32_t>(acc, x, n, op);
    case ncclInt64: return CombineT<int64_t>(acc, x, n, op);
    case ncclUint64: return CombineT<uint64_t>(acc, x, n, op);
    case ncclFloat32: return CombineT<float>(acc, x, n, op);
    case ncclFloat64: return CombineT<double>(acc, x, n, op);
    case ncclBfloat16: return CombineBf16(acc, x, n, op);
  }
}

template <typename T>
void DivideT(char* acc, size_t n, int nranks) {
  for (size_t i = 0; i < n; ++i) {
    T a;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    a = static_cast<T>(a / static_cast<T>(nranks));
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

// ncclAvg's last step: acc / nranks (integers truncate).
void Divide(char* acc, size_t n, int32_t type, int nranks) {
  switch (type) {
    case ncclInt8: return DivideT<int8_t>(acc, n, nranks);
    case ncclUint8: return DivideT<uint8_t>(acc, n, nranks);
    case ncclInt32: return DivideT<int32_t>(acc, n, nranks);
    case ncclUint32: return DivideT<uint32_t>(acc, n, nranks);
    case ncclInt64: return DivideT<int64_t>(acc, n, nranks);
    case ncclUint64: return DivideT<uint64_t>(acc, n, nranks);
    case ncclFloat32: return DivideT<float>(acc, n, nranks);
    case ncclFloat64: return DivideT<double>(acc, n, nranks);
    case ncclBfloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t a;
        std::memcpy(&a, acc + 2 * i, 2);
        a = FloatToBf16(Bf16ToFloat(a) / static_cast<float>(nranks));
        std::memcpy(acc + 2 * i, &a, 2);
      }
      return;
  }
}

// ---------------------------------------------------------------------------------------------
// Operations on streams.

MsgHeader HeaderOf(const Op& op, uint32_t kind) {
  MsgHeader h;
  h.kind = kind;
  h.seq = op.seq;
  h.op = op.kind;
  h.type = op.type;
  h.red = op.red;
  h.root = op.kind == kBroadcast ? op.peer : 0;
  h.count = op.count;
  h.bytes = kind == kCts ? 0 : op.bytes();
  return h;
}

std::string Describe(int32_t op, int32_t type, int32_t red, int32_t root, uint64_t count) {
  std::string s =
      std::string(OpName(op)) + "(count " + std::to_string(count) + ", " + TypeName(type);
  if (op == kAllReduce || op == kReduceScatter) s += std::string(", ") + RedName(red);
  if (op == kBroadcast) s += ", root " + std::to_string(root);
  return s + ")";
}

// Whether the peer's matched call agrees with ours; reports and sets the async error if not.
bool Matches(const Op& op, const Msg& m, int from) {
  CommState* s = op.comm.get();
  bool same;
  if (op.kind == kRecv) {
    same = m.h.op == kSend && m.h.bytes == op.bytes();
  } else {
    same = m.h.op == op.kind && m.h.type == op.type && m.h.count == op.count &&
           m.h.root == (op.kind == kBroadcast ? op.peer : 0) &&
           (m.h.red == op.red || (op.kind != kAllReduce && op.kind != kReduceScatter));
  }
  if (same) return true;
  const std::string mine = Describe(op.kind, op.type, op.red, op.peer, op.count);
  const std::string theirs = Describe(m.h.op, m.h.type, m.h.red, m.h.root, m.h.count);
  const std::string what =
      "NCCL simulator: rank " + std::to_string(s->rank) + "'s " + mine + " (" +
      (op.kind == kRecv ? "receive" : "collective") + " #" + std::to_string(op.seq) +
      " of this communicator) was matched with rank " + std::to_string(from) + "'s " + theirs +
      (op.kind == kRecv ? " of " + std::to_string(m.h.bytes) + " bytes (the receive expects " +
                              std::to_string(op.bytes()) + ")"
                        : "") +
      ": NCCL needs every rank to issue the same operations in the same order with the same "
      "counts";
  Report(what);
  SetAsync(s, ncclInvalidUsage, what);
  return false;
}

// The first half of an operation: what it sends (it never waits for data, only for a Recv to
// be posted: NCCL's Send does not complete before its Recv is issued).
bool SendPart(const Op& op) {
  CommState* s = op.comm.get();
  const int n = s->nranks, r = s->rank;
  const size_t bytes = op.bytes();
  const char* src = static_cast<const char*>(op.send);
  switch (op.kind) {
    case kAllReduce:
    case kAllGather:
    case kBroadcast:
      if (op.kind == kBroadcast && r != op.peer) return true;
      for (int p = 0; p < n; ++p) {
        if (p != r && !Post(s, p, HeaderOf(op, kColl), src)) return false;
      }
      return true;
    case kReduceScatter:
      for (int p = 0; p < n; ++p) {
        if (p != r && !Post(s, p, HeaderOf(op, kColl), src + p * bytes)) return false;
      }
      return true;
    case kSend: {
      Msg cts;
      return Take(s, op.peer, kCts, op.seq, &cts) && Post(s, op.peer, HeaderOf(op, kP2p), src);
    }
    case kRecv: return true;
  }
  return true;
}

// Reduces every rank's contribution in rank order into `out` (`mine` is this rank's).
bool ReduceInto(const Op& op, const char* mine, void* out) {
  CommState* s = op.comm.get();
  const int n = s->nranks, r = s->rank;
  const size_t bytes = op.bytes();
  std::vector<Msg> got(n);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    if (!Take(s, p, kColl, op.seq, &got[p]) || !Matches(op, got[p], p)) return false;
  }
  auto part = [&](int p) { return p == r ? mine : got[p].data.data(); };
  std::vector<char> acc(part(0), part(0) + bytes);
  for (int p = 1; p < n; ++p) Combine(acc.data(), part(p), op.count, op.type, op.red);
  if (op.red == ncclAvg) Divide(acc.data(), op.count, op.type, n);
  if (bytes > 0) std::memcpy(out, acc.data(), bytes);
  return true;
}

// The second half: what it receives and computes.
bool RecvPart(const Op& op) {
  CommState* s = op.comm.get();
  const int n = s->nranks, r = s->rank;
  const size_t bytes = op.bytes();
  const char* src = static_cast<const char*>(op.send);
  char* dst = static_cast<char*>(op.recv);
  Msg m;
  switch (op.kind) {
    case kAllReduce: return ReduceInto(op, src, dst);
    case kReduceScatter: return ReduceInto(op, src + r * bytes, dst);
    case kAllGather:
      for (int p = 0; p < n; ++p) {
        if (p == r) {
          if (bytes > 0 && dst + p * bytes != src) std::memmove(dst + p * bytes, src, bytes);
          continue;
        }
        if (!Take(s, p, kColl, op.seq, &m) || !Matches(op, m, p)) return false;
        if (bytes > 0) std::memcpy(dst + p * bytes, m.data.data(), bytes);
      }
      return true;
    case kBroadcast:
      if (r == op.peer) {
        if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
        return true;
      }
      if (!Take(s, op.peer, kColl, op.seq, &m) || !Matches(op, m, op.peer)) return false;
      if (bytes > 0) std::memcpy(dst, m.data.data(), bytes);
      return true;
    case kRecv:
      if (!Take(s, op.peer, kP2p, op.seq, &m) || !Matches(op, m, op.peer)) return false;
      if (bytes > 0) std::memcpy(dst, m.data.data(), bytes);
      return true;
    case kSend: return true;
  }
  return true;
}

// Runs the operations one group put on one stream of one communicator: posts its receives,
// sends, then receives, so that matched Send/Recv of a group never wait for each other.
cudaError_t RunBundle(const std::vector<Op>& ops) {
  CommState* s = ops.front().comm.get();
  bool ok = true;
  for (const Op& op : ops) {
    if (ok && op.kind == kRecv) ok = Post(s, op.peer, HeaderOf(op, kCts), nullptr);
  }
  for (const Op& op : ops) ok = ok && SendPart(op);
  for (const Op& op : ops) ok = ok && RecvPart(op);
  if (!ok) HangUntilClosed(s);  // as a GPU's NCCL kernel: the stream waits for ncclCommAbort
  {
    std::lock_guard<std::mutex> l(s->mu);
    --s->outstanding;
  }
  s->cv.notify_all();
  return cudaSuccess;
}

// Fails a call; inside a group the group fails too (ncclGroupEnd returns the error and runs
// none of its operations, as NCCL does).
ncclResult_t Reject(ncclResult_t r, const std::string& msg) {
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = r;
  return Fail(r, msg);
}

ncclResult_t CheckBuffer(const char* call, const char* name, const void* p, size_t bytes) {
  if (bytes == 0 || IsDeviceRange(p, bytes)) return ncclSuccess;
  char ptr[32];
  std::snprintf(ptr, sizeof(ptr), "%p", p);
  const std::string what = std::string("NCCL simulator: ") + call + ": " + name + " " + ptr +
                           " is not device memory of " + std::to_string(bytes) +
                           " bytes (NCCL counts elements, not bytes; buffers must be "
                           "cudaMalloc'd)";
  Report(what);
  return Reject(ncclInvalidArgument, what);
}

}  // namespace

// The calling thread's open group (ncclGroupStart .. ncclGroupEnd).
thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group_ops;
thread_local ncclResult_t t_group_error = ncclSuccess;

// Queues the operations, one stream work per (communicator, stream), in issue order; numbers
// them as the peers will.
ncclResult_t Launch(std::vector<Op> ops) {
  std::vector<std::vector<Op>> bundles;
  for (Op& op : ops) {
    auto it = std::find_if(bundles.begin(), bundles.end(), [&](const std::vector<Op>& b) {
      return b.front().comm == op.comm && b.front().stream == op.stream;
    });
    if (it == bundles.end()) {
      bundles.emplace_back();
      it = bundles.end() - 1;
    }
    it->push_back(std::move(op));
  }
  ncclResult_t result = ncclSuccess;
  for (auto& b : bundles) {
    CommState* s = b.front().comm.get();
    const cudaStream_t stream = b.front().stream;
    {
      std::lock_guard<std::mutex> l(s->mu);
      for (Op& op : b) {
        if (op.kind == kSend) {
          op.seq = s->send_seq[op.peer]++;
        } else if (op.kind == kRecv) {
          op.seq = s->recv_seq[op.peer]++;
        } else {
          op.seq = s->coll_seq++;
        }
      }
      ++s->outstanding;
    }
    auto shared = std::make_shared<std::vector<Op>>(std::move(b));
    const cudaError_t e = Enqueue(stream, [shared] { return RunBundle(*shared); });
    if (e != cudaSuccess) {
      {
        std::lock_guard<std::mutex> l(s->mu);
        --s->outstanding;
      }
      s->cv.notify_all();
      result = Fail(ncclUnhandledCudaError,
                    std::string(OpName(shared->front().kind)) +
                        ": cannot queue on the stream: " + cudaGetErrorString(e));
    }
  }
  return result;
}

// Checks that `comm` can take an operation now.
ncclResult_t CheckReady(const char* call, ncclComm_t comm) {
  if (comm == nullptr) return Reject(ncclInvalidArgument, std::string(call) + ": comm is NULL");
  CommState* s = comm->s.get();
  std::lock_guard<std::mutex> l(s->mu);
  if (s->async == ncclInProgress) {
    return Reject(ncclInvalidUsage,
                  std::string(call) +
                      ": the communicator is still initializing, splitting or finalizing "
                      "(ncclInProgress): wait until ncclCommGetAsyncError gives ncclSuccess");
  }
  if (s->async != ncclSuccess) {
    return Reject(s->async, std::string(call) + ": the communicator has failed: " + s->error);
  }
  if (s->finalized) {
    return Reject(ncclInvalidUsage, std::string(call) + ": the communicator was finalized");
  }
  return ncclSuccess;
}

// Checks and queues (or, inside a group, defers) one operation.
ncclResult_t Submit(const char* call, Op op, ncclComm_t comm) {
  ncclResult_t r = CheckReady(call, comm);
  if (r != ncclSuccess) return r;
  op.comm = comm->s;
  const int n = op.comm->nranks;
  const size_t es = TypeSize(op.type);
  if (es == 0) {
    return Reject(ncclInvalidArgument, std::string(call) + ": " + TypeName(op.type) +
                                           " is not in the simulator's subset");
  }
  if ((op.kind == kAllReduce || op.kind == kReduceScatter) &&
      (op.red < 0 || op.red >= ncclNumOps)) {
    return Reject(ncclInvalidArgument, std::string(call) + ": reduction op " +
                                           std::to_string(op.red) + " is not simulated");
  }
  if ((op.kind == kBroadcast || op.kind == kSend || op.kind == kRecv) &&
      (op.peer < 0 || op.peer >= n)) {
    return Reject(ncclInvalidArgument, std::string(call) + ": " +
                                           (op.kind == kBroadcast ? "root " : "peer ") +
                                           std::to_string(op.peer) + " is not a rank of the " +
                                           std::to_string(n) + " of this communicator");
  }
  if (op.count > (SIZE_MAX / es) / static_cast<size_t>(n)) {
    return Reject(ncclInvalidArgument, std::string(call) + ": count is too large");
  }
  const size_t bytes = op.count * es, all = bytes * n;
  const size_t send_bytes =
      op.kind == kReduceScatter                                                 ? all
      : op.kind == kRecv || (op.kind == kBroadcast && op.peer != op.comm->rank) ? 0
                                                                                : bytes;
  const size_t recv_bytes = op.kind == kAllGather ? all : op.kind == kSend ? 0 : bytes;
  if ((r = CheckBuffer(call, "sendbuff", op.send, send_bytes)) != ncclSuccess) return r;
  if ((r = CheckBuffer(call, "recvbuff", op.recv, recv_bytes)) != ncclSuccess) return r;
  if (t_group_depth > 0) {
    t_group_ops.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<Op> one;
  one.push_back(std::move(op));
  return Launch(std::move(one));
}

}  // namespace satdar::cuda_sim
