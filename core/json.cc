#include "core/json.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace satdar::core {

namespace {

using Json = nlohmann::json;

// nlohmann's DOM builder with checks in front: every event is forwarded unless it breaks a
// rule, in which case parsing stops and error() says why.
class StrictSax {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  explicit StrictSax(Json* root) : dom_(*root, /*allow_exceptions=*/false) {}

  bool null() { return Value() && dom_.null(); }
  bool boolean(bool v) { return Value() && dom_.boolean(v); }
  bool number_integer(number_integer_t v) { return Value() && dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return Value() && dom_.number_unsigned(v); }
  // Numbers outside the double range (1e999) never get here: the lexer refuses them.
  bool number_float(number_float_t v, const string_t& text) {
    return Value() && dom_.number_float(v, text);
  }
  bool string(string_t& v) { return Value() && dom_.string(v); }
  bool binary(binary_t& v) { return Value() && dom_.binary(v); }
  bool start_object(std::size_t n) {
    if (!Value() || !Enter(true)) return false;
    return dom_.start_object(n);
  }
  bool key(string_t& k) {
    Frame& f = frames_.back();
    f.key = k;
    if (!f.keys.insert(k).second) return Fail(absl::StrCat("duplicate key \"", Path(), "\""));
    return dom_.key(k);
  }
  bool end_object() {
    frames_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (!Value() || !Enter(false)) return false;
    return dom_.start_array(n);
  }
  bool end_array() {
    frames_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error ..."
    std::string what = e.what();
    const size_t close = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
      what = what.substr(close + 2);
    }
    return Fail(what);
  }

  const std::string& error() const { return error_; }

 private:
  struct Frame {
    bool object = true;
    std::set<std::string> keys;
    std::string key;   // objects: the key of the current member
    int64_t index = -1;  // arrays: the current element
  };

  // A value starts: in an array it is the next element.
  bool Value() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
    return true;
  }
  bool Enter(bool object) {
    if (static_cast<int>(frames_.size()) >= kMaxJsonDepth) {
      return Fail(absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels at ", Path()));
    }
    frames_.push_back(Frame{object, {}, {}, -1});
    return true;
  }
  // Where the parser is: `moe.top_k`, `shards[3].file`, or `the top level`.
  std::string Path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.object) {
        if (!f.key.empty()) absl::StrAppend(&p, p.empty() ? "" : ".", f.key);
      } else {
        absl::StrAppend(&p, "[", f.index, "]");
      }
    }
    return p.empty() ? "the top level" : p;
  }
  bool Fail(std::string what) {
    if (error_.empty()) error_ = std::move(what);
    return false;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  std::vector<Frame> frames_;
  std::string error_;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text, const std::string& source) {
  Json root;
  StrictSax sax(&root);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &sax);
  if (!ok || !sax.error().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": not valid JSON: ", sax.error().empty() ? "parse error" : sax.error()));
  }
  return root;
}

}  // namespace satdar::core
