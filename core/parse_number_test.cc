#include "core/parse_number.h"

#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace satdar::core {
namespace {

std::string Error(const absl::StatusOr<int64_t>& v) {
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(v.status().message());
}
std::string Error(const absl::StatusOr<double>& v) {
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(v.status().message());
}

TEST(ParseBoundedInt, AcceptsTheBoundsAndASign) {
  EXPECT_EQ(*ParseBoundedInt("x", "1", 1, 5), 1);
  EXPECT_EQ(*ParseBoundedInt("x", "5", 1, 5), 5);
  EXPECT_EQ(*ParseBoundedInt("x", "+3", 1, 5), 3);
  EXPECT_EQ(*ParseBoundedInt("x", "-2", -2, 5), -2);
}

TEST(ParseBoundedInt, NamesTheSubjectAndWhatIsWrong) {
  EXPECT_EQ(Error(ParseBoundedInt("flag --steps", "0", 1, 9)), "flag --steps must be >= 1, got 0");
  EXPECT_EQ(Error(ParseBoundedInt("train.steps", "10", 1, 9)), "train.steps must be <= 9, got 10");
  EXPECT_EQ(Error(ParseBoundedInt("s", "ten", 1, 9)), "s must be an integer, got 'ten'");
  EXPECT_EQ(Error(ParseBoundedInt("s", "", 1, 9)), "s must be an integer, got ''");
  EXPECT_EQ(Error(ParseBoundedInt("s", "-", 1, 9)), "s must be an integer, got '-'");
  EXPECT_EQ(Error(ParseBoundedInt("s", "1.5", 1, 9)), "s must be an integer, got '1.5'");
  EXPECT_EQ(Error(ParseBoundedInt("s", "99999999999999999999", 1, 9)),
            "s is out of range (1 to 9), got 99999999999999999999");
  EXPECT_EQ(Error(ParseBoundedInt("s", "-99999999999999999999", 1, 9)),
            "s is out of range (1 to 9), got -99999999999999999999");
}

TEST(ParseBoundedDouble, BoundsAreInclusiveOrNotAsAsked) {
  EXPECT_EQ(*ParseBoundedDouble("x", "0", 0.0, true, 1.0), 0.0);
  EXPECT_EQ(*ParseBoundedDouble("x", "1", 0.0, false, 1.0), 1.0);
  EXPECT_EQ(*ParseBoundedDouble("x", "3e-4", 0.0, false, 1.0), 3e-4);
  EXPECT_EQ(Error(ParseBoundedDouble("lr", "0", 0.0, false, 1.0)), "lr must be > 0, got 0");
  EXPECT_EQ(Error(ParseBoundedDouble("wd", "-1", 0.0, true, 1.0)), "wd must be >= 0, got -1");
  EXPECT_EQ(Error(ParseBoundedDouble("b", "2", 0.0, true, 1.0)), "b must be <= 1, got 2");
  EXPECT_EQ(Error(ParseBoundedDouble("b", "nan", 0.0, true, 1.0)),
            "b must be a finite number, got 'nan'");
  EXPECT_EQ(Error(ParseBoundedDouble("b", "inf", 0.0, true, 1.0)),
            "b must be a finite number, got 'inf'");
  EXPECT_EQ(Error(ParseBoundedDouble("b", "x", 0.0, true, 1.0)),
            "b must be a finite number, got 'x'");
}

TEST(JoinChoices, ReadsAsAList) {
  EXPECT_EQ(JoinChoices({"cpu"}), "cpu");
  EXPECT_EQ(JoinChoices({"cpu", "cuda"}), "cpu or cuda");
  EXPECT_EQ(JoinChoices({"auto", "bar", "line"}), "auto, bar or line");
}

}  // namespace
}  // namespace satdar::core
