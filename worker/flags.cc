#include "worker/flags.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace satdar::worker {

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
    if (values_.count(arg)) {
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
    if (vals.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("satdar ", command_, ": flag ", arg, " needs a value"));
    }
    values_[arg] = vals;
  }
  for (const std::string& name : order_) {
    const Flag& flag = flags_[name];
    if (!flag.choices.empty() && values_.count(name)) {
      const std::string& v = values_[name].front();
      if (std::find(flag.choices.begin(), flag.choices.end(), v) == flag.choices.end()) {
        // "must be a, b or c"
        std::vector<std::string> head(flag.choices.begin(), flag.choices.end() - 1);
        const std::string choices =
            head.empty() ? flag.choices.back()
                         : absl::StrCat(absl::StrJoin(head, ", "), " or ", flag.choices.back());
        return absl::InvalidArgumentError(absl::StrCat("satdar ", command_, ": flag ", name,
                                                       " must be ", choices, ", got '", v, "'"));
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
  std::string text = Get(name);
  int64_t v;
  if (!absl::SimpleAtoi(text, &v)) {
    const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
    const bool digits = text.size() > sign &&
                        text.find_first_not_of("0123456789", sign) == std::string::npos;
    return absl::InvalidArgumentError(absl::StrCat(
        "satdar ", command_, ": flag ", name,
        digits ? " is out of range (" : " must be an integer, got '",
        digits ? absl::StrCat(min_value, " to ", max_value, "), got ", text)
               : absl::StrCat(text, "'")));
  }
  if (v < min_value || v > max_value) {
    return absl::InvalidArgumentError(absl::StrCat("satdar ", command_, ": flag ", name,
                                                   v < min_value ? " must be >= " : " must be <= ",
                                                   v < min_value ? min_value : max_value,
                                                   ", got ", v));
  }
  return v;
}

absl::StatusOr<double> FlagSet::GetDouble(const std::string& name, double min_value,
                                          bool min_inclusive, double max_value) const {
  std::string text = Get(name);
  double v;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("satdar ", command_, ": flag ", name,
                                                   " must be a finite number, got '", text, "'"));
  }
  if (min_inclusive ? v < min_value : v <= min_value) {
    return absl::InvalidArgumentError(absl::StrCat("satdar ", command_, ": flag ", name,
                                                   " must be ", min_inclusive ? ">= " : "> ",
                                                   min_value, ", got ", text));
  }
  if (v > max_value) {
    return absl::InvalidArgumentError(absl::StrCat("satdar ", command_, ": flag ", name,
                                                   " must be <= ", max_value, ", got ", text));
  }
  return v;
}

std::string FlagSet::UsageLine() const {
  return absl::StrCat("usage: satdar ", command_, arguments_.empty() ? "" : " ", arguments_,
                      " [flags]");
}

std::string FlagSet::Usage() const {
  std::string out = UsageLine() + "\n";
  for (const std::string& name : order_) {
    const Flag& f = flags_.at(name);
    const std::string value =
        f.is_bool ? "" : f.choices.empty() ? " VALUE" : absl::StrCat(" ", absl::StrJoin(f.choices, "|"));
    absl::StrAppend(&out, "  ", name, value, "  ", f.help,
                    f.required ? " (required)" : "",
                    f.default_value.empty() ? "" : absl::StrCat(" [default ", f.default_value, "]"),
                    "\n");
  }
  return out;
}

}  // namespace satdar::worker
