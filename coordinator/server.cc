#include "coordinator/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/control_state.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/http_api.h"
#include "metrics/http_server.h"
#include "coordinator/store.h"
#include "core/address.h"
#include "core/check.h"
#include "core/timestamp.h"
#include "core/file_util.h"
#include "nlohmann/json.hpp"
#include "proto/rpc.h"
#include "proto/satdar/v1/control.grpc.pb.h"

namespace satdar::coordinator {

namespace v1 = satdar::v1;

namespace {

enum class Role { kClient, kWorker };

// Who may call: the token of the role the service is for. A known token of the other role is
// PERMISSION_DENIED; anything else UNAUTHENTICATED. Nothing changes on either.
class Auth {
 public:
  Auth(std::string client, std::string worker)
      : client_(std::move(client)), worker_(std::move(worker)) {}
  grpc::Status Check(const grpc::ServerContext& ctx, Role role) const {
    const std::string& want = role == Role::kClient ? client_ : worker_;
    const std::string& other = role == Role::kClient ? worker_ : client_;
    if (want.empty()) return grpc::Status::OK;
    const std::string token = rpc::BearerToken(ctx);
    if (token.empty()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "this call needs a bearer token (the caller's token file)");
    }
    if (rpc::ConstantTimeEquals(token, want)) return grpc::Status::OK;
    if (!other.empty() && rpc::ConstantTimeEquals(token, other)) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          role == Role::kClient ? "a worker token cannot call the job service"
                                                : "a client token cannot call the worker service");
    }
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the token is not valid");
  }

 private:
  std::string client_, worker_;
};

// Observes a call's duration (its method's latency histogram) when it goes out of scope.
class RpcTimer {
 public:
  RpcTimer(CoordinatorMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(std::chrono::steady_clock::now()) {}
  ~RpcTimer() {
    metrics_->ObserveRpc(
        method_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

 private:
  CoordinatorMetrics* metrics_;
  const char* method_;
  std::chrono::steady_clock::time_point start_;
};

template <typename T>
grpc::Status Reply(const absl::StatusOr<T>& v, T* out) {
  if (!v.ok()) return rpc::ToGrpc(v.status());
  *out = *v;
  return grpc::Status::OK;
}

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(ControlState* state, const Auth* auth, CoordinatorMetrics* metrics)
      : state_(state), auth_(auth), metrics_(metrics) {}

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kClient); !a.ok()) return a;
    return Reply(state_->Submit(*req), resp);
  }
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::Job* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kClient); !a.ok()) return a;
    return Reply(state_->GetJob(req->job_id(), true), resp);
  }
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kClient); !a.ok()) return a;
    for (v1::Job& j : state_->ListJobs(*req)) *resp->add_jobs() = std::move(j);
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                         v1::Job* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kClient); !a.ok()) return a;
    return Reply(state_->Cancel(req->job_id()), resp);
  }
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kClient); !a.ok()) return a;
    int64_t after = req->after_sequence();
    for (;;) {
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
      std::vector<v1::JobEvent> events;
      bool final = false;
      absl::Status s = state_->Events(req->job_id(), after, 1000, &events, &final);
      if (!s.ok()) return rpc::ToGrpc(s);
      for (const v1::JobEvent& e : events) {
        if (!writer->Write(e)) return grpc::Status::CANCELLED;  // the client went away
        after = e.sequence();
      }
      if (final) return grpc::Status::OK;
    }
  }
  grpc::Status GetLogs(grpc::ServerContext* ctx, const v1::GetLogsRequest* req,
                       grpc::ServerWriter<v1::LogChunk>* writer) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kClient); !a.ok()) return a;
    int64_t after = 0;
    bool first = true;
    for (;;) {
      if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
      std::vector<v1::LogLine> lines;
      bool final = false;
      const bool tail = first && req->tail() > 0;
      absl::Status s = state_->Logs(req->job_id(), req->rank(), after, tail ? req->tail() : 5000,
                                    tail, first ? 0 : 1000, &lines, &final);
      if (!s.ok()) return rpc::ToGrpc(s);
      first = false;
      if (!lines.empty()) {
        v1::LogChunk chunk;
        for (v1::LogLine& l : lines) *chunk.add_lines() = std::move(l);
        after = chunk.lines(chunk.lines_size() - 1).sequence();
        if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
        if (lines.size() >= 5000) continue;  // more are waiting
      }
      if (!req->follow() || final) return grpc::Status::OK;
    }
  }
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kClient); !a.ok()) return a;
    for (v1::Worker& w : state_->ListWorkers()) *resp->add_workers() = std::move(w);
    return grpc::Status::OK;
  }

 private:
  ControlState* state_;
  const Auth* auth_;
  CoordinatorMetrics* metrics_;
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(ControlState* state, const Auth* auth, CoordinatorMetrics* metrics)
      : state_(state), auth_(auth), metrics_(metrics) {}

  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const v1::RegisterWorkerRequest* req,
                              v1::RegisterWorkerResponse* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kWorker); !a.ok()) return a;
    return Reply(state_->Register(*req), resp);
  }
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kWorker); !a.ok()) return a;
    const std::string session = rpc::WorkerSession(*ctx);
    return Denied(__func__, Reply(state_->Heartbeat(session, *req), resp));
  }
  grpc::Status ReportExit(grpc::ServerContext* ctx, const v1::RankExit* req, v1::Ack*) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kWorker); !a.ok()) return a;
    const std::string session = rpc::WorkerSession(*ctx);
    return Denied(__func__, rpc::ToGrpc(state_->ReportExit(session, *req)));
  }
  grpc::Status UploadLogs(grpc::ServerContext* ctx, const v1::LogUpload* req, v1::Ack*) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kWorker); !a.ok()) return a;
    const std::string session = rpc::WorkerSession(*ctx);
    return Denied(__func__, rpc::ToGrpc(state_->UploadLogs(session, *req)));
  }
  grpc::Status KvSet(grpc::ServerContext* ctx, const v1::KvSetRequest* req, v1::Ack*) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kWorker); !a.ok()) return a;
    const std::string session = rpc::WorkerSession(*ctx);
    return Denied(__func__, rpc::ToGrpc(state_->KvSet(session, *req)));
  }
  grpc::Status KvGet(grpc::ServerContext* ctx, const v1::KvGetRequest* req,
                     v1::KvGetResponse* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kWorker); !a.ok()) return a;
    const std::string session = rpc::WorkerSession(*ctx);
    return Denied(__func__, Reply(state_->KvGet(session, *req), resp));
  }
  grpc::Status RenewRankLease(grpc::ServerContext* ctx, const v1::RankLeaseRequest* req,
                              v1::RankLeaseResponse* resp) override {
    RpcTimer timer(metrics_, __func__);
    if (auto a = auth_->Check(*ctx, Role::kWorker); !a.ok()) return a;
    const std::string session = rpc::WorkerSession(*ctx);
    return Denied(__func__, Reply(state_->RenewRankLease(session, *req), resp));
  }

 private:
  // Counts a call refused PERMISSION_DENIED (satdar_worker_calls_denied_total).
  grpc::Status Denied(const char* method, grpc::Status status) {
    if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) metrics_->CountDenied(method);
    return status;
  }

  ControlState* state_;
  const Auth* auth_;
  CoordinatorMetrics* metrics_;
};

// The errno of binding `listen` here (0: it can be bound), as gRPC binds it (SO_REUSEADDR,
// no SO_REUSEPORT); InvalidArgument when its host does not resolve.
absl::StatusOr<int> BindError(const std::string& listen) {
  std::string host;
  int port = 0;
  SATDAR_RETURN_IF_ERROR(core::SplitHostPort(listen, "listen", &host, &port));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen: cannot serve on ", listen, ": ", ::gai_strerror(rc)));
  }
  int error = 0;
  for (addrinfo* a = found; a != nullptr && error == 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) error = errno;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return error;
}

absl::Status InUse(const std::string& listen) {
  return absl::AlreadyExistsError(absl::StrCat(
      "listen: ", listen, " is already in use (another coordinator, or another program, "
      "serves it); give another port, or 0 for a free one"));
}

// Why gRPC could not bind `listen`: AlreadyExists for a port something else serves (exit code
// 2), Unavailable with the system's reason otherwise.
absl::Status WhyNotBound(const std::string& listen) {
  SATDAR_ASSIGN_OR_RETURN(const int error, BindError(listen));
  if (error == EADDRINUSE) return InUse(listen);
  return absl::UnavailableError(absl::StrCat("listen: cannot serve on ", listen,
                                             error != 0 ? absl::StrCat(": ", std::strerror(error)) : ""));
}

bool IsLoopback(const std::string& listen) {
  std::string host;
  if (!core::SplitHostPort(listen, "listen", &host, nullptr).ok()) return false;
  return host == "localhost" || host == "[::1]" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Tokens are optional for a local, single-user setup; anywhere else they keep strangers from
// submitting jobs (which run on the workers) and from registering workers.
void WarnWithoutTokens(const ServerOptions& o) {
  if (IsLoopback(o.listen)) return;
  if (o.client_token.empty()) {
    std::fprintf(stderr,
                 "%s coordinator: warning: %s is not a loopback address and there is no "
                 "client token: anyone who reaches it can submit and cancel jobs\n",
                 core::UtcTimestamp().c_str(), o.listen.c_str());
  }
  if (o.worker_token.empty()) {
    std::fprintf(stderr,
                 "%s coordinator: warning: %s is not a loopback address and there is no "
                 "worker token: anyone who reaches it can register a worker and take "
                 "jobs' ranks\n",
                 core::UtcTimestamp().c_str(), o.listen.c_str());
  }
}

}  // namespace

absl::Status RunCoordinator(const ServerOptions& o, const std::atomic<bool>* stop) {
  SATDAR_RETURN_IF_ERROR(rpc::CheckAddress(o.listen, "listen"));
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("tls_cert and tls_key go together");
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!o.tls_cert.empty()) {
    SATDAR_ASSIGN_OR_RETURN(rpc::TlsKeyPair pair, rpc::LoadTlsKeyPair(o.tls_cert, o.tls_key));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({pair.key_pem, pair.cert_pem});
    creds = grpc::SslServerCredentials(ssl);
  }
  if (!o.http.empty()) SATDAR_RETURN_IF_ERROR(rpc::CheckAddress(o.http, "http"));
  // A served port is refused before the state folder is touched (and without gRPC's own log
  // of the failed bind); gRPC's bind below, without SO_REUSEPORT, stays the final word.
  SATDAR_ASSIGN_OR_RETURN(const int bind_error, BindError(o.listen));
  if (bind_error == EADDRINUSE) return InUse(o.listen);
  WarnWithoutTokens(o);
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(o.state_dir));
  CoordinatorMetrics metrics;
  ControlOptions co;
  co.heartbeat_ms = o.heartbeat_ms;
  co.lease_ms = o.lease_ms;
  co.on_placed = [&metrics](double seconds) { metrics.ObserveSchedulingDelay(seconds); };
  SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<ControlState> state,
                          ControlState::Create(std::move(store), co));
  Auth auth(o.client_token, o.worker_token);
  JobServiceImpl jobs(state.get(), &auth, &metrics);
  WorkerServiceImpl workers(state.get(), &auth, &metrics);
  metrics::HttpServer http;
  if (!o.http.empty()) {
    AddHttpHandlers(state.get(), &metrics, &http);
    absl::Status s = http.Start(o.http);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("http: ", s.message()));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second coordinator on a served port would
  // start, and the kernel would split the clients between the two.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(o.listen, creds, &port);
  builder.RegisterService(&jobs);
  builder.RegisterService(&workers);
  builder.SetMaxReceiveMessageSize(8 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return WhyNotBound(o.listen);
  const std::string host = o.listen.substr(0, o.listen.rfind(':'));
  const std::string bound = absl::StrCat(host, ":", port);
  nlohmann::json info = {{"grpc", bound},
                         {"http", o.http.empty() ? nlohmann::json(nullptr) : nlohmann::json(http.address())}};
  SATDAR_RETURN_IF_ERROR(core::WriteFileAtomically(o.state_dir + "/coordinator.json", info.dump() + "\n"));
  if (!o.quiet) {
    std::printf("%s coordinator: serving on %s (state in %s)\n", core::UtcTimestamp().c_str(),
                bound.c_str(), o.state_dir.c_str());
    if (!o.http.empty()) {
      std::printf("%s coordinator: dashboard on http://%s/ (metrics /metrics, targets /prometheus/targets)\n",
                  core::UtcTimestamp().c_str(),
                  http.address().c_str());
    }
    std::fflush(stdout);
  }
  while (!stop->load()) {
    state->Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  state->WakeAll();
  http.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  state->Flush();
  return absl::OkStatus();
}

}  // namespace satdar::coordinator
