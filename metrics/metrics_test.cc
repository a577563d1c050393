#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"
#include "metrics/http_server.h"
#include "metrics/rank_exporter.h"
#include "metrics/train_metrics.h"

namespace satdar::metrics {
namespace {

using Json = nlohmann::json;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool HavePromtool() { return std::system("command -v promtool >/dev/null 2>&1") == 0; }

// promtool's verdict on an exposition: "" when it parses and passes the lint (naming, units).
std::string PromtoolComplaints(const std::string& text, const std::string& name) {
  const std::string path = core::testing::TestTmpDir(name) + "/metrics.txt";
  std::ofstream(path) << text;
  const std::string cmd = "promtool check metrics < " + path + " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "cannot run promtool";
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  if (pclose(p) != 0 && out.empty()) out = "promtool failed";
  return out;
}

// A step record as the trainer logs it, with every optional part.
Json FullLine() {
  return Json::parse(R"({
    "step": 3, "loss": 5.5, "lr": 0.001, "grad_norm": 1.25, "tokens": 96,
    "tokens_per_second": 1000, "step_seconds": 0.032, "mfu": 0.25,
    "phase_seconds": {"data": 0.001, "compute": 0.02, "comm_wait": 0.005,
                      "pipeline_bubble": 0.004, "optimizer": 0.002},
    "comm_bytes": {"data": 4096, "pp": 128},
    "pp_boundary_bytes": [[1000, 2000]],
    "device_bytes": {"allocated": 10, "reserved": 20, "peak": 30},
    "stats": {"satformer_gate_mean": [[0.5, 0.25]],
              "satformer_gate_zero_fraction": [[0.1, 0.75]],
              "dar_depth_weights": [[[1.0], [1.0]], [[0.5, 0.5], [0.9, 0.1]]],
              "attnres_depth_weights": [[1.0], [0.25, 0.75]],
              "moe_expert_load": [[3, 0, 5]], "moe_dropped_tokens": 2}
  })");
}

TEST(TrainMetrics, EveryFieldOfTheStepRecordBecomesItsMetric) {
  TrainMetrics m("job-1", 3);
  m.SetInfo("dar+satformer+moe", "cpu", "dp=1 tp=1 pp=2 ep=1", 1e11, 10);
  m.ObserveStep(FullLine(), 96);
  m.ObservePhase(Phase::kCheckpoint, 0.5);
  const std::string text = m.Serialize();
  const std::string l = "job_id=\"job-1\",rank=\"3\"";
  for (const std::string& want : {
           "satdar_train_tokens_total{" + l + "} 96",
           "satdar_train_steps_total{" + l + "} 1",
           "satdar_train_loss{" + l + "} 5.5",
           "satdar_train_mfu_ratio{" + l + "} 0.25",
           "satdar_train_tokens_per_second{" + l + "} 1000",
           "satdar_train_step_seconds_count{" + l + "} 1",
           "satdar_train_step_seconds_bucket{" + l + ",le=\"0.05\"} 1",
           "satdar_train_phase_seconds_total{" + l + ",phase=\"checkpoint\"} 0.5",
           "satdar_train_phase_seconds_total{" + l + ",phase=\"pipeline_bubble\"} 0.004",
           "satdar_comm_bytes_total{" + l + ",group=\"data\"} 4096",
           "satdar_pipeline_boundary_bytes_total{" + l + ",boundary=\"0\",direction=\"backward\"} 2000",
           "satdar_device_memory_bytes{" + l + ",kind=\"reserved\"} 20",
           "satdar_satformer_gate_mean{" + l + ",head=\"1\",layer=\"1\"} 0.25",
           "satdar_satformer_gate_zero_ratio{" + l + ",head=\"1\",layer=\"1\"} 0.75",
           "satdar_depth_weight_max_ratio{" + l + ",design=\"dar\",stream=\"1\",sublayer=\"1\"} 0.9",
           "satdar_depth_weight_max_ratio{" + l + ",design=\"attnres\",stream=\"0\",sublayer=\"1\"} 0.75",
           "satdar_moe_expert_tokens_total{" + l + ",expert=\"2\",layer=\"0\"} 5",
           "satdar_moe_dropped_tokens_total{" + l + "} 2",
           "satdar_train_info{" + l + ",design=\"dar+satformer+moe\",device=\"cpu\",layout=\"dp=1 tp=1 pp=2 ep=1\"} 1",
       }) {
    EXPECT_TRUE(Contains(text, want)) << want << "\nin\n" << text;
  }
  // Entropy of (0.5, 0.5) is ln 2.
  EXPECT_TRUE(Contains(text, "design=\"dar\",stream=\"0\",sublayer=\"1\"} 0.693147")) << text;
  // Counters add up over steps; expert 1 (0 tokens) exists with 0.
  m.ObserveStep(FullLine(), 96);
  const std::string again = m.Serialize();
  EXPECT_TRUE(Contains(again, "satdar_train_tokens_total{" + l + "} 192"));
  EXPECT_TRUE(Contains(again, "satdar_moe_expert_tokens_total{" + l + ",expert=\"1\",layer=\"0\"} 0"));
  EXPECT_TRUE(Contains(again, "satdar_moe_expert_tokens_total{" + l + ",expert=\"2\",layer=\"0\"} 10"));
}

TEST(TrainMetrics, NanAndInfAreWrittenTheWayPrometheusReadsThem) {
  TrainMetrics m("j", 0);
  Json line = {{"step", 1}, {"loss", std::numeric_limits<double>::quiet_NaN()},
               {"grad_norm", std::numeric_limits<double>::infinity()}};
  // nlohmann stores NaN as a number: the gauges see it as it is.
  m.ObserveStep(line, 0);
  const std::string text = m.Serialize();
  // prometheus-cpp spells NaN "Nan"; Prometheus parses special values case-insensitively
  // (Go's ParseFloat), which promtool, the server's own parser, confirms below.
  EXPECT_TRUE(Contains(text, "satdar_train_loss{job_id=\"j\",rank=\"0\"} Nan")) << text;
  EXPECT_TRUE(Contains(text, "satdar_train_grad_norm{job_id=\"j\",rank=\"0\"} +Inf")) << text;
  if (HavePromtool()) {
    EXPECT_EQ(PromtoolComplaints(text, "metrics_nan"), "");
  }
}

TEST(TrainMetrics, LabelValuesAreEscaped) {
  TrainMetrics m("a\"b\\c\nd", 0);
  m.ObserveStep({{"step", 1}}, 1);
  EXPECT_TRUE(Contains(m.Serialize(), "job_id=\"a\\\"b\\\\c\\nd\"")) << m.Serialize();
}

TEST(TrainMetrics, WrongTypesAreSkippedNotFatal) {
  TrainMetrics m("j", 0);
  m.ObserveStep(Json::parse(R"({"step": "x", "loss": [1], "phase_seconds": 3,
      "stats": {"satformer_gate_mean": [["a", 0.5]], "dar_depth_weights": 7,
                "moe_expert_load": [[1, "b"]]}, "pp_boundary_bytes": [[1]]})"),
                1);
  const std::string text = m.Serialize();
  EXPECT_TRUE(Contains(text, "satdar_satformer_gate_mean{head=\"1\",job_id=\"j\",layer=\"1\",rank=\"0\"} 0.5") ||
              Contains(text, "head=\"1\"")) << text;
  EXPECT_TRUE(Contains(text, "satdar_train_steps_total{job_id=\"j\",rank=\"0\"} 1"));
}

TEST(TrainMetrics, PassesPromtoolCheckMetrics) {
  if (!HavePromtool()) {
    GTEST_SKIP() << "promtool is not installed (Debian prometheus; scripts/setup.sh installs it)";
  }
  TrainMetrics m("job-1", 0);
  m.SetInfo("transformer", "cpu", "dp=1", 1e11, 5);
  EXPECT_EQ(PromtoolComplaints(m.Serialize(), "metrics_promtool_empty"), "");  // before a step
  m.ObserveStep(FullLine(), 96);
  m.ObservePhase(Phase::kCheckpoint, 0.5);
  EXPECT_EQ(PromtoolComplaints(m.Serialize(), "metrics_promtool"), "");
}

TEST(RankExporter, ServesMetricsAndNothingElse) {
  auto m = std::make_shared<TrainMetrics>("job-1", 0);
  m->ObserveStep({{"step", 1}, {"loss", 2.0}}, 32);
  auto e = RankExporter::Start("127.0.0.1:0", m->registry());
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_NE((*e)->address(), "127.0.0.1:0");
  auto r = HttpGet((*e)->address(), "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(Contains(r->body, "satdar_train_tokens_total{job_id=\"job-1\",rank=\"0\"} 32")) << r->body;
  EXPECT_TRUE(Contains(r->content_type, "text/plain")) << r->content_type;
  auto missing = HttpGet((*e)->address(), "/nothing");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status, 404);
  // The same port twice: Unavailable, naming the address.
  auto twice = RankExporter::Start((*e)->address(), m->registry());
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(std::string(twice.status().message()), (*e)->address()));
  auto bad = RankExporter::Start("no-port", m->registry());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ThreadStack, SmallStackRequestsAreRaisedToOneMebibyte) {
  // What civetweb asks for, and what a thread with ~180 KiB of static TLS cannot start with.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 102400), 0);
  size_t size = 0;
  pthread_attr_getstacksize(&attr, &size);
  EXPECT_EQ(size, size_t{1} << 20);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, size_t{8} << 20), 0);
  pthread_attr_getstacksize(&attr, &size);
  EXPECT_EQ(size, size_t{8} << 20);
  pthread_attr_destroy(&attr);
}

// Connects to ADDRESS (HOST:PORT) and sends `request`; the socket stays open (the caller
// closes it).
int ConnectAndSend(const std::string& address, const std::string& request) {
  const size_t colon = address.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  if (!request.empty()) (void)!write(fd, request.data(), request.size());
  return fd;
}

TEST(RankExporter, StuckScrapersNeverSlowTheSteps) {
  // A page of a few thousand series, so a scraper that never reads fills its socket.
  TrainMetrics m("job-1", 0);
  Json line = FullLine();
  Json load = Json::array();
  for (int l = 0; l < 32; ++l) load.push_back(std::vector<int>(64, 5));
  line["stats"]["moe_expert_load"] = load;
  m.ObserveStep(line, 1);
  auto e = RankExporter::Start("127.0.0.1:0", m.registry());
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<int> stuck;
  // More than civetweb has threads: half a request each, and whole requests never read.
  for (int i = 0; i < 3; ++i) stuck.push_back(ConnectAndSend((*e)->address(), "GET /metr"));
  for (int i = 0; i < 3; ++i) {
    stuck.push_back(ConnectAndSend((*e)->address(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
  }
  for (int fd : stuck) ASSERT_GE(fd, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server takes them up
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) m.ObserveStep(line, 1);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // About 1 ms per statistics step on this machine; a blocked update would hang here.
  EXPECT_LT(seconds, 10.0);
  EXPECT_TRUE(Contains(m.Serialize(), "satdar_train_steps_total{job_id=\"job-1\",rank=\"0\"} 1001"));
  for (int fd : stuck) close(fd);
}

TEST(HttpServer, RoutesExactPathsAndPrefixesAnd404sTheRest) {
  HttpServer s;
  s.Handle("/a", [](const HttpRequest& r) { return HttpResponse::Json("{\"x\":\"" + r.Param("x") + "\"}"); });
  s.HandlePrefix("/p/", [](const HttpRequest& r) { return HttpResponse::Text(r.path, "text/plain"); });
  s.HandlePrefix("/p/long/", [](const HttpRequest&) { return HttpResponse::Text("long", "text/plain"); });
  ASSERT_TRUE(s.Start("127.0.0.1:0").ok());
  auto a = HttpGet(s.address(), "/a?x=hello%20there&y=2");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->status, 200);
  EXPECT_EQ(a->body, "{\"x\":\"hello there\"}");
  EXPECT_EQ(a->content_type, "application/json");
  EXPECT_EQ(HttpGet(s.address(), "/p/q")->body, "/p/q");
  EXPECT_EQ(HttpGet(s.address(), "/p/long/q")->body, "long");
  EXPECT_EQ(HttpGet(s.address(), "/a/b")->status, 404);
  EXPECT_EQ(HttpGet(s.address(), "/")->status, 404);
  HttpServer other;
  absl::Status busy = other.Start(s.address());
  EXPECT_EQ(busy.code(), absl::StatusCode::kUnavailable) << busy;
  EXPECT_EQ(other.Start("host:99999").code(), absl::StatusCode::kInvalidArgument);
  s.Stop();
  EXPECT_EQ(HttpGet(s.address(), "/a").status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace satdar::metrics
