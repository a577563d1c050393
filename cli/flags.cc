#include "cli/flags.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/parse_number.h"

namespace satdar::cli {

void FlagSet::Define(const std::string& name, const std::string& help, bool required,
                     const std::string& default_value) {
  order_.push_back(name);
  flags_[name] = Flag{help, required, false, false, default_value, {}};
}

void FlagSet::DefineBool(const std::string& name, const std::string& help) {
  order_.push_back(name);
  flags_[name] = Flag{help, false, true, false, "", {}};
}

void FlagSet::DefineEnum(const std::string& name, const std::string& help,
                         std::vector<std::string> choices, const std::string& default_value) {
  order_.push_back(name);
  flags_[name] = Flag{help, false, false, false, default_value, std::move(choices)};
}

void FlagSet::DefineList(const std::string& name, const std::string& help, bool required) {
  order_.push_back(name);
  flags_[name] = Flag{help, required, false, true, "", {}};
}

void FlagSet::DefineRepeatedList(const std::string& name, const std::string& help) {
  order_.push_back(name);
  Flag f{help, false, false, true, "", {}};
  f.repeatable = true;
  flags_[name] = f;
}

void FlagSet::DefineOptionalValue(const std::string& name, const std::string& help) {
  order_.push_back(name);
  Flag f{help, false, false, false, "", {}};
  f.optional_value = true;
  flags_[name] = f;
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("satdar ", command_, ": unexpected argument '", arg, "'"));
    }
    std::string value;
    bool has_inline = false;
    size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    auto it = flags_.find(arg);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("satdar ", command_, ": unknown flag ", arg, " (see satdar ", command_,
                       " --help)"));
    }
    const Flag& flag = it->second;
    if (values_.count(arg) && !flag.repeatable) {
      return absl::InvalidArgumentError(
          absl::StrCat("satdar ", command_, ": flag ", arg, " given twice"));
    }
    if (flag.is_bool) {
      if (has_inline && value != "true" && value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("satdar ", command_, ": flag ", arg, " takes no value or true/false"));
      }
      values_[arg] = {has_inline ? value : "true"};
      continue;
    }
    std::vector<std::string> vals;
    if (has_inline) vals.push_back(value);
    while ((flag.is_list || vals.empty()) && i + 1 < args.size() &&
           args[i + 1].rfind("--", 0) != 0) {
      vals.push_back(args[++i]);
    }
    if (vals.empty() && flag.optional_value) vals.push_back("");
    if (vals.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("satdar ", command_, ": flag ", arg, " needs a value"));
    }
    std::vector<std::string>& to = values_[arg];
    to.insert(to.end(), vals.begin(), vals.end());
  }
  for (const std::string& name : order_) {
    const Flag& flag = flags_[name];
    if (!flag.choices.empty() && values_.count(name)) {
      const std::string& v = values_[name].front();
      if (std::find(flag.choices.begin(), flag.choices.end(), v) == flag.choices.end()) {
        return absl::InvalidArgumentError(absl::StrCat("satdar ", command_, ": flag ", name,
                                                       " must be ", core::JoinChoices(flag.choices),
                                                       ", got '", v, "'"));
      }
    }
    if (flags_[name].required && !values_.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("satdar ", command_, ": missing required flag ", name, " (",
                       flags_[name].help, ")"));
    }
  }
  return absl::OkStatus();
}

bool FlagSet::Has(const std::string& name) const { return values_.count(name) > 0; }

std::string FlagSet::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second.front();
  auto f = flags_.find(name);
  return f == flags_.end() ? "" : f->second.default_value;
}

bool FlagSet::GetBool(const std::string& name) const {
  auto it = values_.find(name);
  return it != values_.end() && it->second.front() == "true";
}

std::vector<std::string> FlagSet::GetList(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> FlagSet::GetInt(const std::string& name, int64_t min_value,
                                        int64_t max_value) const {
  return core::ParseBoundedInt(absl::StrCat("satdar ", command_, ": flag ", name), Get(name),
                               min_value, max_value);
}

absl::StatusOr<double> FlagSet::GetDouble(const std::string& name, double min_value,
                                          bool min_inclusive, double max_value) const {
  return core::ParseBoundedDouble(absl::StrCat("satdar ", command_, ": flag ", name), Get(name),
                                  min_value, min_inclusive, max_value);
}

std::string FlagSet::UsageLine() const {
  return absl::StrCat("usage: satdar ", command_, arguments_.empty() ? "" : " ", arguments_,
                      " [flags]");
}

std::string FlagSet::Usage() const {
  std::string out = UsageLine() + "\n";
  for (const std::string& name : order_) {
    const Flag& f = flags_.at(name);
    const std::string value = f.is_bool          ? ""
                              : f.optional_value ? " [VALUE]"
                              : f.choices.empty() ? (f.repeatable ? " VALUE..." : " VALUE")
                                                  : absl::StrCat(" ", absl::StrJoin(f.choices, "|"));
    absl::StrAppend(&out, "  ", name, value, "  ", f.help,
                    f.required ? " (required)" : "",
                    f.default_value.empty() ? "" : absl::StrCat(" [default ", f.default_value, "]"),
                    "\n");
  }
  return out;
}

}  // namespace satdar::cli
