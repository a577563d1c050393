#include "proto/rpc.h"

#include <fcntl.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>

#include "core/address.h"

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

namespace {

// A PEM file a TLS flag names, read with a limit.
absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& file) {
  auto text = core::ReadFileToString(file, 1 << 20);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", text.status().message()));
  return *text;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM text, or null. OpenSSL's error queue is left empty (gRPC
// shares it on this thread).
std::unique_ptr<X509, X509Free> FirstCertificate(const std::string& pem) {
  auto bio = MemoryBio(pem);
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return cert;
}

// An encrypted key is refused, never prompted for.
int NoPassword(char*, int, int, void*) { return 0; }

}  // namespace

absl::StatusOr<TlsKeyPair> LoadTlsKeyPair(const std::string& cert_file,
                                          const std::string& key_file) {
  TlsKeyPair pair;
  SATDAR_ASSIGN_OR_RETURN(pair.cert_pem, ReadPem("tls_cert", cert_file));
  SATDAR_ASSIGN_OR_RETURN(pair.key_pem, ReadPem("tls_key", key_file));
  auto cert = FirstCertificate(pair.cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls_cert: ", cert_file, " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  auto bio = MemoryBio(pair.key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls_key: ", key_file,
        " holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)"));
  }
  const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return absl::InvalidArgumentError(absl::StrCat("tls_key: ", key_file,
                                                   " is not the key of the certificate in ",
                                                   cert_file, " (tls_cert)"));
  }
  return pair;
}

absl::StatusOr<std::string> LoadTlsRoots(const std::string& ca_file, const std::string& name) {
  SATDAR_ASSIGN_OR_RETURN(std::string pem, ReadPem(name, ca_file));
  if (FirstCertificate(pem) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", ca_file, " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  return pem;
}

namespace {

// A TCP connection to host:port within timeout_ms, then blocking with that timeout on every
// read and write; -1 when none could be made.
int ConnectWithTimeout(const std::string& address, int timeout_ms) {
  std::string host;
  int port = 0;
  if (!core::SplitHostPort(address, "address", &host, &port).ok()) return -1;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof(error);
      connected = ::poll(&p, 1, timeout_ms) == 1 &&
                  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    }
    if (!connected) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) return -1;
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

// "" when the server's certificate is for the host of `address` as gRPC checks it (an IP
// against the IP names; a DNS name against the DNS names, or the common name when the
// certificate has no alternative names at all); else why not.
std::string NameMismatch(SSL* ssl, const std::string& address) {
  std::string host;
  if (!core::SplitHostPort(address, "address", &host, nullptr).ok()) return "";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::unique_ptr<X509, X509Free> peer(SSL_get1_peer_certificate(ssl));
  if (peer == nullptr) return "it presents no certificate";
  bool matches;
  unsigned char ip[16];
  const bool is_ip = ::inet_pton(AF_INET, host.c_str(), ip) == 1 || ::inet_pton(AF_INET6, host.c_str(), ip) == 1;
  if (is_ip) {
    matches = X509_check_ip_asc(peer.get(), host.c_str(), 0) == 1;
  } else {
    const int has_names = X509_get_ext_by_NID(peer.get(), NID_subject_alt_name, -1) >= 0;
    matches = X509_check_host(peer.get(), host.c_str(), host.size(),
                              has_names ? X509_CHECK_FLAG_NEVER_CHECK_SUBJECT : 0, nullptr) == 1;
  }
  ERR_clear_error();
  return matches ? "" : absl::StrCat("it is not for ", host);
}

}  // namespace

TlsProbe ProbeTls(const std::string& address, absl::Duration timeout,
                  const std::string& roots_pem, std::string* why) {
  const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  const int fd = ConnectWithTimeout(address, timeout_ms);
  if (fd < 0) return TlsProbe::kUnreachable;
  // A peer that closes at once must not end this process with SIGPIPE: block it on this
  // thread and discard one raised meanwhile.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  TlsProbe result = TlsProbe::kUnreachable;
  if (ctx != nullptr) {
    // The handshake completes whatever the certificate; its verdict is read afterwards.
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
    if (!roots_pem.empty()) {
      auto bio = MemoryBio(roots_pem);
      STACK_OF(X509_INFO)* infos = PEM_X509_INFO_read_bio(bio.get(), nullptr, nullptr, nullptr);
      if (infos != nullptr) {
        for (int i = 0; i < sk_X509_INFO_num(infos); ++i) {
          X509_INFO* info = sk_X509_INFO_value(infos, i);
          if (info->x509 != nullptr) X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), info->x509);
        }
        sk_X509_INFO_pop_free(infos, X509_INFO_free);
      }
    }
    SSL* ssl = SSL_new(ctx);
    if (ssl != nullptr) {
      static const unsigned char kAlpn[] = {2, 'h', '2'};  // what a gRPC server expects
      SSL_set_alpn_protos(ssl, kAlpn, sizeof(kAlpn));
      SSL_set_fd(ssl, fd);
      errno = 0;
      const int rc = SSL_connect(ssl);
      const int sys = errno;
      const int err = SSL_get_error(ssl, rc);
      if (rc == 1) {
        result = TlsProbe::kTls;
        std::string untrusted;
        const long verdict = SSL_get_verify_result(ssl);
        if (!roots_pem.empty() && verdict != X509_V_OK) {
          untrusted = X509_verify_cert_error_string(verdict);
        } else if (!roots_pem.empty()) {
          untrusted = NameMismatch(ssl, address);
        }
        if (!untrusted.empty()) {
          result = TlsProbe::kUntrusted;
          if (why != nullptr) *why = untrusted;
        }
      } else if (err == SSL_ERROR_SYSCALL && (sys == EAGAIN || sys == EWOULDBLOCK)) {
        result = TlsProbe::kUnreachable;  // no answer in time: a stalled server, not a verdict
      } else {
        result = TlsProbe::kNotTls;  // it answered (or closed), but not with TLS
      }
      SSL_free(ssl);
    }
    SSL_CTX_free(ctx);
  }
  ERR_clear_error();
  ::close(fd);
  const timespec zero = {0, 0};
  while (sigtimedwait(&pipe_set, nullptr, &zero) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  return result;
}

absl::Status ExplainUnavailable(const std::string& address, const ChannelOptions& options,
                                const absl::Status& status) {
  if (!absl::IsUnavailable(status)) return status;
  std::string roots;
  if (!options.ca_file.empty()) {
    auto pem = LoadTlsRoots(options.ca_file, options.ca_name);
    if (pem.ok()) roots = *pem;
  }
  std::string why;
  const TlsProbe probe = ProbeTls(address, absl::Seconds(2), roots, &why);
  if (options.ca_file.empty() && probe == TlsProbe::kTls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the coordinator at ", address,
        " speaks TLS; give ", options.ca_name,
        " FILE (or $SATDAR_TLS_CA) with the PEM roots of its certificate"));
  }
  if (!options.ca_file.empty() && probe == TlsProbe::kNotTls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the coordinator at ", address, " does not speak TLS; drop ", options.ca_name,
        " (and $SATDAR_TLS_CA)"));
  }
  if (probe == TlsProbe::kUntrusted) {
    return absl::InvalidArgumentError(absl::StrCat("the coordinator at ", address,
                                                   " presents a certificate that ", options.ca_name,
                                                   " ", options.ca_file, " does not verify (", why,
                                                   ")"));
  }
  return status;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ChannelOptions& options) {
  SATDAR_RETURN_IF_ERROR(CheckAddress(address, "coordinator address"));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.ca_file.empty()) {
    SATDAR_ASSIGN_OR_RETURN(std::string roots, LoadTlsRoots(options.ca_file, options.ca_name));
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = roots;
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

void SetWorkerSession(grpc::ClientContext* context, const std::string& session) {
  if (!session.empty()) context->AddMetadata("satdar-worker-session", session);
}

std::string WorkerSession(const grpc::ServerContext& context) {
  const auto& md = context.client_metadata();
  auto it = md.find("satdar-worker-session");
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}

namespace {
std::string Hex(const unsigned char* data, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 15]);
  }
  return out;
}
}  // namespace

std::string RandomHex(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  // RAND_bytes fails only when the system's generator cannot be seeded: nothing can go on.
  SATDAR_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) == 1)
      << "the system's random generator failed (OpenSSL RAND_bytes)";
  return Hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

std::string Sha256Hex(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  SATDAR_CHECK(EVP_Digest(text.data(), text.size(), digest, &n, EVP_sha256(), nullptr) == 1)
      << "OpenSSL EVP_Digest(SHA-256) failed";
  return Hex(digest, n);
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
