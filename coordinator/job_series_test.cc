#include "coordinator/job_series.h"

#include <cmath>

#include "gtest/gtest.h"

namespace satdar::coordinator {
namespace {

using Json = nlohmann::json;

Json Record(int64_t step, double loss) { return {{"step", step}, {"loss", loss}}; }

TEST(JobSeries, KeepsEveryStepUntilFullThenDecimatesWithinTheBound) {
  JobSeries s;
  for (int64_t step = 1; step <= 100; ++step) ASSERT_TRUE(s.Add(Record(step, 1.0 / step), step));
  EXPECT_EQ(s.size(), 100u);
  EXPECT_EQ(s.stride(), 1);
  for (int64_t step = 101; step <= 20000; ++step) s.Add(Record(step, 1.0 / step), step);
  EXPECT_LE(s.size(), static_cast<size_t>(JobSeries::kMaxPoints) + 1);
  EXPECT_GE(s.size(), static_cast<size_t>(JobSeries::kMaxPoints) / 2);
  const Json j = s.ToJson();
  const Json& points = j["points"];
  // Evenly spaced by the stride, ascending, ending at the newest step.
  for (size_t i = 0; i + 1 < points.size(); ++i) {
    EXPECT_EQ(points[i][0].get<int64_t>() % s.stride(), 0);
    EXPECT_LT(points[i][0].get<double>(), points[i + 1][0].get<double>());
  }
  EXPECT_EQ(points.back()[0].get<int64_t>(), 20000);
  EXPECT_DOUBLE_EQ(points.back()[2].get<double>(), 1.0 / 20000);
}

TEST(JobSeries, AReplayedStepReplacesWhatFollowedIt) {
  JobSeries s;
  for (int64_t step = 1; step <= 10; ++step) s.Add(Record(step, 5), step);
  // A restarted attempt resumes from its step-6 checkpoint and logs step 7 again.
  s.Add(Record(7, 3), 100);
  const Json points = s.ToJson()["points"];
  ASSERT_EQ(points.size(), 7u);
  EXPECT_EQ(points.back()[0], 7.0);
  EXPECT_EQ(points.back()[2], 3.0);
}

TEST(JobSeries, MissingAndNonFiniteValuesAreNull) {
  JobSeries s;
  s.Add({{"step", 1}, {"loss", std::nan("")}, {"phase_seconds", {{"compute", 0.5}}}}, 7);
  const Json p = s.ToJson()["points"][0];
  const auto& f = JobSeries::Fields();
  auto at = [&](const char* name) { return p[std::find(f.begin(), f.end(), name) - f.begin()]; };
  EXPECT_TRUE(at("loss").is_null());
  EXPECT_TRUE(at("mfu").is_null());
  EXPECT_EQ(at("phase_compute"), 0.5);
  EXPECT_EQ(at("time_ms"), 7.0);
}

TEST(JobSeries, RejectsWhatIsNotAStepRecord) {
  JobSeries s;
  EXPECT_FALSE(s.Add(Json::array(), 0));
  EXPECT_FALSE(s.Add({{"loss", 1}}, 0));
  EXPECT_FALSE(s.Add({{"step", "3"}}, 0));
  EXPECT_FALSE(s.Add({{"step", 0}}, 0));
  EXPECT_FALSE(s.Add({{"step", int64_t{1} << 60}}, 0));  // beyond what a double holds exactly
  EXPECT_EQ(s.size(), 0u);
}

TEST(JobSeries, StatisticsKeepTheLatestSnapshotWithDepthEntropy) {
  JobSeries s;
  s.Add({{"step", 2},
         {"stats",
          {{"dar_depth_weights", Json::parse("[[[1.0],[1.0]],[[0.5,0.5],[1.0,0.0]]]")},
           {"moe_expert_load", Json::parse("[[1,2,3]]")}}}},
        0);
  const Json st = s.ToJson()["stats"];
  EXPECT_EQ(st["depth_design"], "dar");
  EXPECT_NEAR(st["depth_entropy"][1][0].get<double>(), std::log(2.0), 1e-12);
  EXPECT_EQ(st["depth_max"][1][1], 1.0);
  EXPECT_EQ(st["expert_load"][0][2], 3);
  EXPECT_EQ(s.ToJson()["stats_step"], 2);
}

TEST(JobSeries, StatisticsOfAnotherShapeAreNotKept) {
  JobSeries s;
  s.Add({{"step", 1},
         {"stats",
          {{"satformer_gate_mean", Json::parse(R"([[0.5, "x"]])")},
           {"moe_expert_load", Json::parse("[[[1]]]")},
           {"dar_depth_weights", Json::parse("[[1.0]]")},
           {"satformer_gate_zero_fraction", Json::parse("[[0.25]]")}}}},
        0);
  const Json st = s.ToJson()["stats"];
  EXPECT_FALSE(st.contains("gate_mean"));
  EXPECT_FALSE(st.contains("expert_load"));
  EXPECT_FALSE(st.contains("depth_entropy"));
  EXPECT_EQ(st["gate_zero"][0][0], 0.25);
}

TEST(JobSeries, RoundTripsThroughJsonAndRefusesOtherText) {
  JobSeries s;
  for (int64_t step = 1; step <= 3000; ++step) s.Add(Record(step, step), step);
  s.Add({{"step", 3001}, {"stats", {{"satformer_gate_mean", Json::parse("[[0.5]]")}}}}, 3001);
  auto back = JobSeries::FromJson(s.ToJson().dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), s.ToJson());
  back->Add(Record(3002, 1), 3002);  // and it goes on from there
  EXPECT_EQ(back->ToJson()["points"].back()[0], 3002.0);
  for (const char* bad : {"", "[]", R"({"fields": ["x"], "stride": 1, "points": []})",
                          R"({"fields": null})"}) {
    EXPECT_EQ(JobSeries::FromJson(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace satdar::coordinator
