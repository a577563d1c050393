#include "agent/grpc_kv_store.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "proto/satdar/v1/control.grpc.pb.h"

namespace satdar::agent {

namespace {

namespace v1 = satdar::v1;

class CoordinatorStore : public comm::KvStore {
 public:
  CoordinatorStore(CoordinatorStoreOptions o, std::shared_ptr<grpc::Channel> channel)
      : o_(std::move(o)), stub_(v1::WorkerService::NewStub(channel)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    v1::KvSetRequest req;
    req.set_job_id(o_.job_id);
    req.set_attempt(o_.attempt);
    req.set_key(key);
    req.set_value(value);
    // The coordinator may be restarting: retry for a while.
    absl::Status last;
    for (int i = 0; i < 30; ++i) {
      grpc::ClientContext ctx;
      rpc::SetDeadlineAndToken(&ctx, o_.token, absl::Seconds(10));
      rpc::SetWorkerSession(&ctx, o_.session);
      v1::Ack ack;
      last = rpc::FromGrpc(stub_->KvSet(&ctx, req, &ack));
      if (last.ok() || !absl::IsUnavailable(last)) break;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return Named(last, key);
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      v1::KvGetRequest req;
      req.set_job_id(o_.job_id);
      req.set_attempt(o_.attempt);
      req.set_key(key);
      req.set_wait_ms(static_cast<int>(std::clamp<int64_t>(left.count(), 0, 30000)));
      grpc::ClientContext ctx;
      rpc::SetDeadlineAndToken(&ctx, o_.token, absl::Milliseconds(req.wait_ms() + 10000));
      rpc::SetWorkerSession(&ctx, o_.session);
      v1::KvGetResponse resp;
      absl::Status s = rpc::FromGrpc(stub_->KvGet(&ctx, req, &resp));
      if (s.ok() && resp.found()) return resp.value();
      if (!s.ok() && !absl::IsUnavailable(s)) return Named(s, key);
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "key '", key, "' did not appear in the coordinator's store for ", o_.job_id,
            " attempt ", o_.attempt, " within ", absl::FormatDuration(timeout)));
      }
      if (!s.ok()) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }

  absl::StatusOr<std::string> TryGet(const std::string& key) override {
    v1::KvGetRequest req;
    req.set_job_id(o_.job_id);
    req.set_attempt(o_.attempt);
    req.set_key(key);
    grpc::ClientContext ctx;
    rpc::SetDeadlineAndToken(&ctx, o_.token, absl::Seconds(10));
    rpc::SetWorkerSession(&ctx, o_.session);
    v1::KvGetResponse resp;
    absl::Status s = rpc::FromGrpc(stub_->KvGet(&ctx, req, &resp));
    if (!s.ok()) return Named(s, key);
    if (!resp.found()) return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
    return resp.value();
  }

 private:
  absl::Status Named(const absl::Status& s, const std::string& key) const {
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("coordinator store ", o_.address, " (", o_.job_id,
                                               " attempt ", o_.attempt, ", key '", key, "'): ",
                                               s.message()));
  }
  CoordinatorStoreOptions o_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<comm::KvStore>> OpenCoordinatorStore(
    const CoordinatorStoreOptions& options) {
  SATDAR_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                          rpc::MakeChannel(options.address, options.channel));
  return std::unique_ptr<comm::KvStore>(std::make_unique<CoordinatorStore>(options, channel));
}

}  // namespace satdar::agent
