#include "agent/rank_lease.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/timestamp.h"
#include "proto/satdar/v1/control.grpc.pb.h"

namespace satdar::agent {

namespace v1 = satdar::v1;
using Clock = std::chrono::steady_clock;

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct RankLease::Impl {
  RankLeaseOptions o;
  std::unique_ptr<v1::WorkerService::Stub> stub;
  std::atomic<int64_t> valid_until_ms{0};
  int64_t lease_ms = 0;
  std::mutex mu;
  std::condition_variable wake;
  bool stop = false;

  std::string Who() const {
    return absl::StrCat("rank ", o.rank, " of ", o.coordinator.job_id, " attempt ",
                        o.coordinator.attempt);
  }
  // One renewal; the status of the answer.
  absl::Status Renew(int64_t deadline_ms) {
    v1::RankLeaseRequest req;
    req.set_job_id(o.coordinator.job_id);
    req.set_attempt(o.coordinator.attempt);
    req.set_rank(o.rank);
    grpc::ClientContext ctx;
    rpc::SetDeadlineAndToken(&ctx, o.coordinator.token, absl::Milliseconds(deadline_ms));
    rpc::SetWorkerSession(&ctx, o.coordinator.session);
    v1::RankLeaseResponse resp;
    const int64_t sent = NowMs();
    absl::Status s = rpc::FromGrpc(stub->RenewRankLease(&ctx, req, &resp));
    if (s.ok()) {
      lease_ms = std::max<int64_t>(1000, resp.lease_ms());
      valid_until_ms.store(sent + lease_ms);  // counted from the request: never longer
    }
    return s;
  }
  [[noreturn]] void Stop(const std::string& why) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s satdar train: error: %s: %s; stopping\n",
                 core::UtcTimestamp().c_str(), Who().c_str(), why.c_str());
    std::fflush(stderr);
    ::_exit(1);
  }
};

RankLease::RankLease(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<RankLease>> RankLease::Start(const RankLeaseOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  SATDAR_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                          rpc::MakeChannel(options.coordinator.address, options.coordinator.channel));
  impl->stub = v1::WorkerService::NewStub(channel);
  // The coordinator may be restarting: try for a while before giving up.
  absl::Status s;
  for (int i = 0; i < 10; ++i) {
    s = impl->Renew(5000);
    if (s.ok() || !absl::IsUnavailable(s)) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (!s.ok()) {
    return absl::AbortedError(absl::StrCat(impl->Who(), ": the coordinator at ",
                                           options.coordinator.address,
                                           " does not keep this attempt alive: ", s.message()));
  }
  auto lease = std::unique_ptr<RankLease>(new RankLease(std::move(impl)));
  lease->thread_ = std::thread([raw = lease.get()] { raw->Loop(); });
  return lease;
}

RankLease::~RankLease() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RankLease::Loop() {
  Impl& m = *impl_;
  for (;;) {
    const int64_t period = std::max<int64_t>(250, m.lease_ms / 4);
    {
      std::unique_lock<std::mutex> lock(m.mu);
      if (m.wake.wait_for(lock, std::chrono::milliseconds(period), [&] { return m.stop; })) return;
    }
    const absl::Status s = m.Renew(std::max<int64_t>(500, m.lease_ms / 4));
    if (s.ok()) continue;
    if (absl::IsFailedPrecondition(s) || absl::IsNotFound(s) || absl::IsInvalidArgument(s) ||
        absl::IsPermissionDenied(s)) {
      m.Stop(absl::StrCat("the coordinator fenced this attempt (", s.message(), ")"));
    }
    if (NowMs() >= m.valid_until_ms.load()) {
      m.Stop(absl::StrCat("lost its lease: no answer from the coordinator for ", m.lease_ms / 1000.0,
                          " s (", s.message(), ")"));
    }
  }
}

absl::Status RankLease::MayWrite() const {
  if (NowMs() < impl_->valid_until_ms.load()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(impl_->Who(),
                                         ": its lease ran out; a fenced attempt writes nothing"));
}

}  // namespace satdar::agent
