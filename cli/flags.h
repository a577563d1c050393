// cli/flags.h: a small command-line flag parser for the satdar subcommands.
//
//   FlagSet flags("train");
//   flags.Define("--steps", "optimizer steps", /*required=*/true);
//   flags.DefineBool("--resume", "continue from the newest checkpoint");
//   SATDAR_RETURN_IF_ERROR(flags.Parse(args));
//   flags.DefineEnum("--dtype", "precision", {"f32", "f64"}, "f32");
//   SATDAR_RETURN_IF_ERROR(flags.Parse(args));
//   SATDAR_ASSIGN_OR_RETURN(int64_t steps, flags.GetInt("--steps", 1, kMaxSteps));
//
// Accepts "--name value" and "--name=value". Unknown flags, missing values, missing required
// flags, values of an enum flag outside its choices (checked by Parse, whether or not the
// command reads the flag), malformed numbers, integers outside [min, max] (parsed as 64-bit
// with overflow detection, so 4294967298 is never read as 2) and non-finite floats are
// InvalidArgument errors that name the flag.
#ifndef SATDAR_CLI_FLAGS_H_
#define SATDAR_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace satdar::cli {

class FlagSet {
 public:
  // `arguments`: what the command takes besides flags, for its usage line ("JOB" gives
  // "usage: satdar status JOB [flags]").
  explicit FlagSet(std::string command, std::string arguments = "")
      : command_(std::move(command)), arguments_(std::move(arguments)) {}

  void Define(const std::string& name, const std::string& help, bool required = false,
              const std::string& default_value = "");
  void DefineBool(const std::string& name, const std::string& help);
  void DefineEnum(const std::string& name, const std::string& help,
                  std::vector<std::string> choices, const std::string& default_value);
  // For flags that take several values (--input a b c): all values up to the next flag.
  void DefineList(const std::string& name, const std::string& help, bool required = false);
  // A list flag that may also be given several times (--task a --task b, or --task a b): the
  // values of every occurrence, in order.
  void DefineRepeatedList(const std::string& name, const std::string& help);
  // A flag whose value may be left out (--json, or --json FILE): the next argument is its value
  // unless it starts with "--". Has() is true either way; Get() is "" when bare (as is
  // "--json=").
  void DefineOptionalValue(const std::string& name, const std::string& help);

  absl::Status Parse(const std::vector<std::string>& args);

  bool Has(const std::string& name) const;  // given on the command line
  bool Knows(const std::string& name) const { return flags_.count(name) > 0; }  // defined
  bool IsBool(const std::string& name) const {
    auto it = flags_.find(name);
    return it != flags_.end() && it->second.is_bool;
  }
  std::string Get(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  std::vector<std::string> GetList(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t min_value,
                                 int64_t max_value) const;
  // A finite number >= min_value (> with min_inclusive false) and <= max_value.
  absl::StatusOr<double> GetDouble(const std::string& name, double min_value,
                                   bool min_inclusive = true,
                                   double max_value = 1e300) const;

  const std::string& command() const { return command_; }  // "train" for `satdar train`
  std::string UsageLine() const;  // "usage: satdar CMD [ARGS] [flags]"
  std::string Usage() const;      // the usage line, then every flag

 private:
  struct Flag {
    std::string help;
    bool required = false;
    bool is_bool = false;
    bool is_list = false;
    std::string default_value;
    std::vector<std::string> choices;  // enum flags
    bool repeatable = false;           // DefineRepeatedList
    bool optional_value = false;       // DefineOptionalValue
  };
  std::string command_;
  std::string arguments_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, std::vector<std::string>> values_;
};

}  // namespace satdar::cli

#endif  // SATDAR_CLI_FLAGS_H_
