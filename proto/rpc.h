// proto/rpc.h: what every satdar gRPC peer shares: bearer tokens, channels (plain or TLS),
// and the mapping between absl::Status and grpc::Status.
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
};
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ChannelOptions& options);

// "authorization: Bearer <token>" (nothing when token is empty) and a deadline.
void SetDeadlineAndToken(grpc::ClientContext* context, const std::string& token,
                         absl::Duration timeout);
// The bearer token a call carries, or "".
std::string BearerToken(const grpc::ServerContext& context);
// Equal strings, compared in time that depends only on their lengths.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

// An address "HOST:PORT" (PORT 0..65535); InvalidArgument naming `what` otherwise.
absl::Status CheckAddress(const std::string& address, const std::string& what);

}  // namespace satdar::rpc

#endif  // SATDAR_PROTO_RPC_H_
