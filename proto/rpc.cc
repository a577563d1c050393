#include "proto/rpc.h"

#include "core/address.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"

namespace satdar::rpc {

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  auto text = core::ReadFileToString(path, 64 << 10);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("token file: ", text.status().message()));
  std::string t = *text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  size_t start = 0;
  while (start < t.size() && std::isspace(static_cast<unsigned char>(t[start]))) ++start;
  t = t.substr(start);
  if (t.size() < 8 || t.size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": a token must be 8 to 4096 characters, got ", t.size()));
  }
  for (unsigned char c : t) {
    if (!std::isgraph(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file ", path, ": the token must be one line of printable characters"));
    }
  }
  return t;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ChannelOptions& options) {
  SATDAR_RETURN_IF_ERROR(CheckAddress(address, "coordinator address"));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.ca_file.empty()) {
    auto pem = core::ReadFileToString(options.ca_file, 1 << 20);
    if (!pem.ok()) return absl::InvalidArgumentError(absl::StrCat("TLS CA: ", pem.status().message()));
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *pem;
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Reconnect quickly: a coordinator that restarts must find its workers heartbeating again
  // well within their lease (gRPC's default backoff grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, creds, args);
}

void SetDeadlineAndToken(grpc::ClientContext* context, const std::string& token,
                         absl::Duration timeout) {
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

std::string BearerToken(const grpc::ServerContext& context) {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return "";
  const std::string value(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  return value.rfind(prefix, 0) == 0 ? value.substr(prefix.size()) : "";
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::Status CheckAddress(const std::string& address, const std::string& what) {
  return core::SplitHostPort(address, what, nullptr, nullptr);
}

}  // namespace satdar::rpc
