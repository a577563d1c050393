#include "metrics/http_server.h"

#include <civetweb.h>

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/address.h"

namespace satdar::metrics {

namespace {

// civetweb's library state is set up once per process and never torn down.
void InitCivetweb() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string UrlDecode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::string HttpRequest::Param(const std::string& name) const {
  for (absl::string_view part : absl::StrSplit(query, '&')) {
    const size_t eq = part.find('=');
    if (eq != absl::string_view::npos && part.substr(0, eq) == name) {
      return UrlDecode(std::string(part.substr(eq + 1)));
    }
  }
  return "";
}

HttpResponse HttpResponse::Text(std::string body, std::string content_type) {
  HttpResponse r;
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}

HttpResponse HttpResponse::Json(std::string body) {
  return Text(std::move(body), "application/json");
}

HttpResponse HttpResponse::Error(int status, std::string message) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(message) + "\n";
  return r;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& path, HttpHandler handler) {
  exact_[path] = std::move(handler);
}

void HttpServer::HandlePrefix(const std::string& prefix, HttpHandler handler) {
  prefix_[prefix] = std::move(handler);
}

absl::Status HttpServer::Start(const std::string& listen, int threads) {
  std::string host;
  int port = 0;
  if (absl::Status s = core::SplitHostPort(listen, "address", &host, &port); !s.ok()) return s;
  InitCivetweb();
  const std::string n = std::to_string(threads);
  // civetweb gives each connection a thread for as long as it stays open: a client that sends
  // its request slowly holds one. Enough threads that a few slow or reconnecting clients leave
  // health probes and scrapes room, and a request that takes longer than 2 s is cut.
  const char* options[] = {"listening_ports", listen.c_str(), "num_threads", n.c_str(),
                           "request_timeout_ms", "2000", nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof callbacks);
  ctx_ = mg_start(&callbacks, nullptr, options);
  if (ctx_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", listen));
  mg_set_request_handler(ctx_, "/", &HttpServer::Dispatch, this);
  mg_server_port ports[4];
  const int n_ports = mg_get_server_ports(ctx_, 4, ports);
  if (n_ports <= 0) {
    Stop();
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", listen));
  }
  address_ = absl::StrCat(host, ":", ports[0].port);
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (ctx_ != nullptr) mg_stop(ctx_);
  ctx_ = nullptr;
}

HttpResponse HttpServer::Route(const HttpRequest& request) const {
  if (auto it = exact_.find(request.path); it != exact_.end()) return it->second(request);
  // The longest matching prefix wins.
  for (auto it = prefix_.rbegin(); it != prefix_.rend(); ++it) {
    if (request.path.compare(0, it->first.size(), it->first) == 0) return it->second(request);
  }
  return HttpResponse::Error(404, absl::StrCat("no page at ", request.path));
}

int HttpServer::Dispatch(mg_connection* conn, void* self) {
  const mg_request_info* info = mg_get_request_info(conn);
  HttpRequest request;
  request.path = info->local_uri != nullptr ? info->local_uri : "/";
  request.query = info->query_string != nullptr ? info->query_string : "";
  const std::string method = info->request_method != nullptr ? info->request_method : "";
  HttpResponse r;
  if (method != "GET" && method != "HEAD") {
    r = HttpResponse::Error(405, "only GET and HEAD are served");
  } else {
    r = static_cast<HttpServer*>(self)->Route(request);
  }
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            r.status, mg_get_response_code_text(conn, r.status), r.content_type.c_str(),
            r.body.size());
  if (method != "HEAD") mg_write(conn, r.body.data(), r.body.size());
  return r.status;  // civetweb: a status code > 0 means handled
}

absl::StatusOr<HttpResponse> HttpGet(const std::string& address, const std::string& path,
                                     int timeout_ms) {
  std::string host;
  int port = 0;
  if (absl::Status s = core::SplitHostPort(address, "address", &host, &port); !s.ok()) return s;
  InitCivetweb();
  char error[256] = "";
  mg_connection* conn = mg_connect_client(host.c_str(), port, 0, error, sizeof error);
  if (conn == nullptr) {
    return absl::UnavailableError(absl::StrCat("GET http://", address, path, ": ", error));
  }
  mg_printf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path.c_str(),
            address.c_str());
  if (mg_get_response(conn, error, sizeof error, timeout_ms) < 0) {
    mg_close_connection(conn);
    return absl::UnavailableError(absl::StrCat("GET http://", address, path, ": ", error));
  }
  const mg_response_info* info = mg_get_response_info(conn);
  HttpResponse r;
  r.status = info->status_code;
  for (int i = 0; i < info->num_headers; ++i) {
    if (strcasecmp(info->http_headers[i].name, "Content-Type") == 0) {
      r.content_type = info->http_headers[i].value;
    }
  }
  r.body.clear();
  char buf[16384];
  for (int n; (n = mg_read(conn, buf, sizeof buf)) > 0;) r.body.append(buf, n);
  mg_close_connection(conn);
  return r;
}

}  // namespace satdar::metrics
