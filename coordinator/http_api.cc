#include "coordinator/http_api.h"

#include <google/protobuf/util/json_util.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/dashboard_assets.h"
#include "model/config.h"
#include "nlohmann/json.hpp"

namespace satdar::coordinator {

namespace {

namespace v1 = satdar::v1;
using Json = nlohmann::json;
using metrics::HttpRequest;
using metrics::HttpResponse;

Json ToJson(const google::protobuf::Message& m) {
  std::string text;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &text, o);
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : Json::object();
}

// Text from ranks (a failure's reason quotes their output) may not be UTF-8: such bytes are
// replaced rather than failing the page.
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The design with the choices that tell two runs of one topology apart, for the comparison's
// legends: "dar/cross + satformer + moe 4x top2", "hc/4 streams", "attnres/block 4 + resformer".
std::string DesignDetail(const model::ModelConfig& c) {
  std::string d = model::Name(c.residual);
  if (c.residual == model::Residual::kDar) absl::StrAppend(&d, "/", model::Name(c.dar_variant));
  if (c.residual == model::Residual::kHc || c.residual == model::Residual::kMhc) {
    absl::StrAppend(&d, "/", c.hc_streams, " streams");
  }
  // Block forms only (the full form is block_size 0, or 2 for dar and 1 for the others).
  const int full = c.residual == model::Residual::kDar ? 2 : 1;
  const bool blocked = c.residual == model::Residual::kDar ||
                       c.residual == model::Residual::kAttnRes ||
                       c.residual == model::Residual::kTransparent;
  if (blocked && c.block_size > full) absl::StrAppend(&d, "/block ", c.block_size);
  if (c.value_residual != model::ValueResidualKind::kNone) {
    absl::StrAppend(&d, " + ", model::Name(c.value_residual));
    if (c.value_residual == model::ValueResidualKind::kResFormer &&
        c.resformer_mode != model::ResformerMode::kFixed) {
      absl::StrAppend(&d, "/", model::Name(c.resformer_mode));
    }
  }
  if (c.moe.has_value()) absl::StrAppend(&d, " + moe ", c.moe->num_experts, "x top", c.moe->top_k);
  return d;
}

// The public view of a job for the pages (no spec text, no full history).
Json JobSummary(const v1::Job& job) {
  v1::Job brief = job;
  brief.clear_spec();
  brief.clear_history();
  Json j = ToJson(brief);
  j.erase("spec");
  j.erase("history");  // printed empty
  if (!j.contains("job_id")) j["job_id"] = job.job_id();
  if (job.has_spec()) {
    const v1::Layout& l = job.spec().layout();
    j["layout"] = {{"dp", std::max(1, l.dp())}, {"tp", std::max(1, l.tp())},
                   {"pp", std::max(1, l.pp())}, {"ep", std::max(1, l.ep())}};
    j["device"] = job.spec().resources().device().empty() ? "cpu" : job.spec().resources().device();
    // The stored config is canonical (validated at submit): its design is the model's own.
    auto config = model::ParseModelConfig(job.spec().config_json(), "job config");
    if (config.ok()) {
      j["design"] = model::DesignName(*config);
      j["design_detail"] = DesignDetail(*config);
    }
  }
  return j;
}

}  // namespace

void AddHttpHandlers(ControlState* state, CoordinatorMetrics* metrics,
                     metrics::HttpServer* server) {
  server->Handle("/metrics", [=](const HttpRequest&) {
    metrics->SetState(state->Counts());
    return HttpResponse::Text(metrics->Serialize(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server->Handle("/prometheus/targets", [=](const HttpRequest&) {
    Json groups = Json::array();
    for (const MetricsTarget& t : state->MetricsTargets()) {
      groups.push_back({{"targets", {t.address}},
                        {"labels", {{"job_id", t.job_id},
                                    {"rank", std::to_string(t.rank)},
                                    {"worker", t.worker}}}});
    }
    return HttpResponse::Json(Dump(groups));
  });
  server->Handle("/api/jobs", [=](const HttpRequest&) {
    v1::ListJobsRequest req;
    req.set_limit(200);
    Json jobs = Json::array();
    for (const v1::Job& j : state->ListJobs(req)) {
      // The list leaves the spec out; the table shows the design and layout from it.
      auto full = state->GetJob(j.job_id(), true);
      jobs.push_back(JobSummary(full.ok() ? *full : j));
    }
    return HttpResponse::Json(Dump(Json{{"jobs", jobs}}));
  });
  server->HandlePrefix("/api/jobs/", [=](const HttpRequest& r) {
    const std::string id = r.path.substr(std::string("/api/jobs/").size());
    auto job = state->GetJob(id, true);
    if (!job.ok()) return HttpResponse::Error(404, std::string(job.status().message()));
    auto series = state->Series(id);
    if (!series.ok()) return HttpResponse::Error(404, std::string(series.status().message()));
    // NaN has no JSON spelling: the series stores missing values as null already.
    return HttpResponse::Json(Dump(Json{{"job", JobSummary(*job)}, {"series", *series}}));
  });
  server->Handle("/api/workers", [=](const HttpRequest&) {
    Json workers = Json::array();
    for (const v1::Worker& w : state->ListWorkers()) workers.push_back(ToJson(w));
    return HttpResponse::Json(Dump(Json{{"workers", workers}}));
  });
  server->Handle("/healthz", [](const HttpRequest&) { return HttpResponse::Text("ok\n", "text/plain"); });
  for (const DashboardAsset& a : DashboardAssets()) {
    server->Handle(a.path, [&a](const HttpRequest&) { return HttpResponse::Text(a.body, a.content_type); });
  }
}

}  // namespace satdar::coordinator
