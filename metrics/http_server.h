// metrics/http_server.h: a small HTTP/1.1 server over civetweb's C API (Debian
// libcivetweb-dev) for pages and JSON: exact paths and path prefixes map to handlers; anything
// else is 404, a method other than GET or HEAD is 405. Handlers run on civetweb's worker
// threads (several at once) and must be thread-safe.
//
//   HttpServer server;
//   server.Handle("/metrics", [&](const HttpRequest&) { return HttpResponse::Text(...); });
//   server.HandlePrefix("/api/jobs/", ...);
//   SATDAR_RETURN_IF_ERROR(server.Start("127.0.0.1:0"));
//   server.address();  // the address actually bound
#ifndef SATDAR_METRICS_HTTP_SERVER_H_
#define SATDAR_METRICS_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"

struct mg_context;
struct mg_connection;

namespace satdar::metrics {

struct HttpRequest {
  std::string path;   // decoded, without the query
  std::string query;  // after '?', raw
  // The value of ?name=... ("" when absent).
  std::string Param(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  static HttpResponse Text(std::string body, std::string content_type);
  static HttpResponse Json(std::string body);
  static HttpResponse Error(int status, std::string message);
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  HttpServer() = default;
  ~HttpServer();  // stops serving; waits for the requests in flight
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Before Start.
  void Handle(const std::string& path, HttpHandler handler);
  void HandlePrefix(const std::string& prefix, HttpHandler handler);

  // listen: HOST:PORT, port 0 picks a free one. InvalidArgument for a malformed address,
  // Unavailable when it cannot be bound.
  absl::Status Start(const std::string& listen, int threads = 64);
  void Stop();
  const std::string& address() const { return address_; }

 private:
  static int Dispatch(mg_connection* conn, void* self);
  HttpResponse Route(const HttpRequest& request) const;

  std::map<std::string, HttpHandler> exact_, prefix_;
  mg_context* ctx_ = nullptr;
  std::string address_;
};

// A GET of http://ADDRESS/PATH for tests and tools: the status and body, or Unavailable.
absl::StatusOr<HttpResponse> HttpGet(const std::string& address, const std::string& path,
                                     int timeout_ms = 5000);

}  // namespace satdar::metrics

#endif  // SATDAR_METRICS_HTTP_SERVER_H_
