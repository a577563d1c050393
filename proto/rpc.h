// proto/rpc.h: what every satdar gRPC peer shares: bearer tokens, channels (plain or TLS),
// the TLS files' checks, and the mapping between absl::Status and grpc::Status.
//
//   SATDAR_ASSIGN_OR_RETURN(std::string token, ReadTokenFile(path));
//   auto channel = MakeChannel("127.0.0.1:7070", {.ca_file = ""});
//   grpc::ClientContext ctx;
//   SetDeadlineAndToken(&ctx, token, absl::Seconds(10));
#ifndef SATDAR_PROTO_RPC_H_
#define SATDAR_PROTO_RPC_H_

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace satdar::rpc {

// A token file holds one token (surrounding whitespace ignored), 8 to 4096 printable
// characters. InvalidArgument naming the file otherwise.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

struct ChannelOptions {
  std::string ca_file;  // PEM roots for TLS; empty: plaintext
  // What the caller calls ca_file in messages that tell the user what to give or drop
  // (satdar's commands: "--tls-ca").
  std::string ca_name = "ca_file";
};
// InvalidArgument naming ca_name and the file when ca_file cannot be read or holds no PEM
// certificate.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ChannelOptions& options);

// The TLS files, checked before gRPC sees them (it would only fail to serve or to connect):
// InvalidArgument "<flag>: <file> ..." when a file cannot be read, holds no PEM certificate
// (or no unencrypted PEM private key), or the key does not belong to the certificate.
struct TlsKeyPair {
  std::string cert_pem, key_pem;
};
absl::StatusOr<TlsKeyPair> LoadTlsKeyPair(const std::string& cert_file,
                                          const std::string& key_file);
// `name`: what the caller calls the file in messages.
absl::StatusOr<std::string> LoadTlsRoots(const std::string& ca_file,
                                         const std::string& name = "ca_file");

// Whether the server at HOST:PORT speaks TLS: a TCP connection and a TLS handshake within
// `timeout`. With roots_pem, also whether they verify its certificate for HOST as gRPC would
// (kUntrusted, *why set to OpenSSL's reason); without, no certificate is checked.
enum class TlsProbe { kUnreachable, kTls, kNotTls, kUntrusted };
TlsProbe ProbeTls(const std::string& address, absl::Duration timeout,
                  const std::string& roots_pem = "", std::string* why = nullptr);

// `status` of a call that failed with UNAVAILABLE, explained when the reason is that client and
// coordinator disagree about TLS: InvalidArgument "the coordinator at X speaks TLS; give
// --tls-ca ..." for a plaintext channel, "... does not speak TLS; ..." for a TLS one, "...
// presents a certificate that --tls-ca F does not verify (...)" for roots that do not fit.
// Otherwise (and for other codes) `status` unchanged. Probes the server (ProbeTls).
absl::Status ExplainUnavailable(const std::string& address, const ChannelOptions& options,
                                const absl::Status& status);

// "authorization: Bearer <token>" (nothing when token is empty) and a deadline.
void SetDeadlineAndToken(grpc::ClientContext* context, const std::string& token,
                         absl::Duration timeout);
// The bearer token a call carries, or "".
std::string BearerToken(const grpc::ServerContext& context);
// A worker's session (RegisterWorkerResponse.session): every later call of the worker and of
// the ranks it starts carries it as "satdar-worker-session" metadata, which names the caller.
void SetWorkerSession(grpc::ClientContext* context, const std::string& session);
// The session a call carries, or "".
std::string WorkerSession(const grpc::ServerContext& context);
// `bytes` bytes from the system's cryptographic generator (OpenSSL RAND_bytes), as lowercase
// hex: session secrets and identifiers nobody can guess.
std::string RandomHex(int bytes);
// SHA-256 of `text`, lowercase hex: what the coordinator keeps of a session.
std::string Sha256Hex(const std::string& text);
// Equal strings, compared in time that depends only on their lengths.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

// An address "HOST:PORT" (PORT 0..65535); InvalidArgument naming `what` otherwise.
absl::Status CheckAddress(const std::string& address, const std::string& what);

}  // namespace satdar::rpc

#endif  // SATDAR_PROTO_RPC_H_
