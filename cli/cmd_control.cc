// satdar coordinator and satdar worker: the two servers of the control plane.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/server.h"
#include "core/check.h"
#include "core/file_util.h"
#include "proto/rpc.h"
#include "agent/agent.h"
#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/commands.h"

namespace satdar::cli {

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

// SIGTERM and SIGINT end the server cleanly (its ranks too, for a worker).
void HandleStopSignals() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

absl::StatusOr<std::string> TokenOf(const FlagSet& flags, const std::string& flag,
                                    const char* env) {
  const std::string path = FlagOrEnv(flags, flag, env);
  if (path.empty()) return std::string();
  auto token = rpc::ReadTokenFile(path);
  if (!token.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", token.status().message()));
  return token;
}

}  // namespace

int WorkerExitCodeFor(const absl::Status& status) {
  if (absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status)) return 3;
  return ExitCodeFor(status);
}

absl::Status RunCoordinatorCommand(const std::vector<std::string>& args) {
  FlagSet flags("coordinator");
  flags.Define("--listen", "HOST:PORT to serve gRPC on (port 0: a free one)", true);
  flags.Define("--state-dir", "folder of the coordinator's state (SQLite); all job state lives there",
               true);
  flags.Define("--http", "HOST:PORT for the dashboard, /metrics and service discovery");
  flags.Define("--token-file", "the client token users must present");
  flags.Define("--worker-token-file", "the worker token workers (and their ranks) must present");
  flags.Define("--tls-cert", "PEM certificate for TLS (with --tls-key)");
  flags.Define("--tls-key", "PEM private key for TLS");
  flags.Define("--lease-seconds", "a worker silent this long is lost and its jobs restart", false,
               "10");
  flags.Define("--heartbeat-ms", "how often workers heartbeat", false, "1000");
  flags.DefineBool("--quiet", "no console output");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  coordinator::ServerOptions o;
  o.listen = flags.Get("--listen");
  o.http = flags.Get("--http");
  o.state_dir = flags.Get("--state-dir");
  o.tls_cert = flags.Get("--tls-cert");
  o.tls_key = flags.Get("--tls-key");
  o.quiet = flags.GetBool("--quiet");
  SATDAR_ASSIGN_OR_RETURN(int64_t lease, flags.GetInt("--lease-seconds", 1, 3600));
  SATDAR_ASSIGN_OR_RETURN(o.heartbeat_ms, flags.GetInt("--heartbeat-ms", 50, 60000));
  o.lease_ms = lease * 1000;
  if (o.heartbeat_ms * 2 > o.lease_ms) {
    return absl::InvalidArgumentError("satdar coordinator: --lease-seconds must be at least two "
                                      "heartbeats (--heartbeat-ms)");
  }
  if (absl::Status s = core::MakeDirs(o.state_dir); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--state-dir: ", s.message()));
  }
  SATDAR_RETURN_IF_ERROR(CheckInputs({{"--tls-cert", o.tls_cert},
                                      {"--tls-key", o.tls_key}}));
  SATDAR_ASSIGN_OR_RETURN(o.client_token, TokenOf(flags, "--token-file", "SATDAR_TOKEN_FILE"));
  SATDAR_ASSIGN_OR_RETURN(o.worker_token, TokenOf(flags, "--worker-token-file", "SATDAR_WORKER_TOKEN_FILE"));
  if (!o.client_token.empty() && o.client_token == o.worker_token) {
    return absl::InvalidArgumentError("satdar coordinator: the client and worker tokens must differ");
  }
  HandleStopSignals();
  return coordinator::RunCoordinator(o, &g_stop);
}

absl::Status RunWorkerCommand(const std::vector<std::string>& args) {
  FlagSet flags("worker");
  flags.Define("--coordinator", "HOST:PORT of the coordinator (or $SATDAR_COORDINATOR)");
  flags.Define("--slots", "rank slots (CPU ranks, or GPUs with --device cuda)", true);
  flags.Define("--work-dir", "this worker's own scratch folder", true);
  flags.Define("--shared-dir", "storage every worker shares (checkpoints: <dir>/jobs/<job_id>/)",
               true);
  flags.Define("--data-root", "train.data paths are relative to it [default: the current folder]");
  flags.DefineEnum("--device", "what a slot is", {"cpu", "cuda"}, "cpu");
  flags.Define("--name", "this worker's name [default: host name and pid]");
  flags.Define("--host", "the address this worker's ranks listen on", false, "127.0.0.1");
  flags.Define("--token-file", "the worker token (or $SATDAR_TOKEN_FILE)");
  flags.Define("--tls-ca", "PEM roots to verify the coordinator's TLS certificate (or $SATDAR_TLS_CA)");
  flags.Define("--stop-grace-seconds", "SIGTERM to SIGKILL when a rank is stopped", false, "5");
  flags.DefineBool("--quiet", "no console output");
  if (WantsHelp(args)) return PrintHelp(flags);
  SATDAR_RETURN_IF_ERROR(flags.Parse(args));
  agent::AgentOptions o;
  o.coordinator = FlagOrEnv(flags, "--coordinator", "SATDAR_COORDINATOR");
  if (o.coordinator.empty()) {
    return absl::InvalidArgumentError("satdar worker: give --coordinator HOST:PORT (or $SATDAR_COORDINATOR)");
  }
  SATDAR_ASSIGN_OR_RETURN(int64_t slots, flags.GetInt("--slots", 1, 4096));
  SATDAR_ASSIGN_OR_RETURN(int64_t grace, flags.GetInt("--stop-grace-seconds", 0, 3600));
  o.slots = static_cast<int>(slots);
  o.stop_grace_ms = static_cast<int>(grace * 1000);
  o.work_dir = flags.Get("--work-dir");
  o.shared_dir = flags.Get("--shared-dir");
  o.data_root = flags.Get("--data-root");
  if (o.data_root.empty()) {
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) != nullptr) o.data_root = cwd;
  }
  o.device = flags.Get("--device");
  o.name = flags.Get("--name");
  o.host = flags.Get("--host");
  o.quiet = flags.GetBool("--quiet");
  o.token_file = FlagOrEnv(flags, "--token-file", "SATDAR_TOKEN_FILE");
  o.channel.ca_file = FlagOrEnv(flags, "--tls-ca", "SATDAR_TLS_CA");
  o.channel.ca_name = "--tls-ca";
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return absl::InternalError("satdar worker: cannot find the satdar program");
  o.satdar.assign(self, static_cast<size_t>(n));
  HandleStopSignals();
  return agent::RunWorker(o, &g_stop);
}

}  // namespace satdar::cli
