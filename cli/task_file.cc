#include "cli/task_file.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/check.h"
#include "core/file_util.h"
#include "core/json.h"

namespace satdar::cli {

namespace {

using Json = nlohmann::json;

const char* TypeName(runtime::TaskKind kind) {
  switch (kind) {
    case runtime::TaskKind::kChoice: return "choice";
    case runtime::TaskKind::kCloze: return "cloze";
    case runtime::TaskKind::kRecall: return "recall";
  }
  return "?";
}

// The fields of each type, "type" included.
std::vector<std::string> FieldsOf(runtime::TaskKind kind) {
  switch (kind) {
    case runtime::TaskKind::kChoice: return {"type", "context", "choices", "answer"};
    case runtime::TaskKind::kCloze: return {"type", "context", "target"};
    case runtime::TaskKind::kRecall: return {"type", "prompt", "answers"};
  }
  return {};
}

class RecordReader {
 public:
  RecordReader(const std::string& where, const Json& j) : where_(where), j_(j) {}

  absl::Status Bad(const std::string& field, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": field \"", field, "\": ", why));
  }

  absl::StatusOr<std::string> String(const std::string& field, bool may_be_empty) const {
    auto it = j_.find(field);
    if (it == j_.end()) return Bad(field, "missing");
    if (!it->is_string()) return Bad(field, absl::StrCat("must be a string, got ", it->type_name()));
    std::string s = it->get<std::string>();
    if (s.empty() && !may_be_empty) return Bad(field, "is empty");
    return s;
  }

  absl::StatusOr<std::vector<std::string>> Strings(const std::string& field) const {
    auto it = j_.find(field);
    if (it == j_.end()) return Bad(field, "missing");
    if (!it->is_array()) {
      return Bad(field, absl::StrCat("must be an array of strings, got ", it->type_name()));
    }
    if (it->empty()) return Bad(field, "is empty");
    std::vector<std::string> out;
    for (size_t k = 0; k < it->size(); ++k) {
      const Json& v = (*it)[k];
      const std::string name = absl::StrCat(field, "[", k, "]");
      if (!v.is_string()) return Bad(name, absl::StrCat("must be a string, got ", v.type_name()));
      if (v.get<std::string>().empty()) return Bad(name, "is empty");
      out.push_back(v.get<std::string>());
    }
    return out;
  }

  absl::StatusOr<int64_t> Integer(const std::string& field) const {
    auto it = j_.find(field);
    if (it == j_.end()) return Bad(field, "missing");
    if (!it->is_number_integer()) {
      return Bad(field, absl::StrCat("must be an integer, got ", it->dump()));
    }
    if (it->is_number_unsigned()) {
      const uint64_t u = it->get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
    }
    return it->get<int64_t>();
  }

 private:
  const std::string& where_;
  const Json& j_;
};

}  // namespace

std::string TaskNameOf(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') == std::string::npos
                                     ? 0
                                     : path.find_last_of('/') + 1);
  const std::string ext = ".jsonl";
  if (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0) {
    name.resize(name.size() - ext.size());
  }
  return name;
}

absl::StatusOr<TaskFile> ParseTaskFile(const std::string& path, const std::string& text) {
  TaskFile file;
  file.path = path;
  file.name = TaskNameOf(path);
  bool have_kind = false;
  size_t pos = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  for (int line_number = 1; pos < text.size(); ++line_number) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", line_number);
    SATDAR_ASSIGN_OR_RETURN(Json j, core::ParseJson(line, where));
    if (!j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a record must be a JSON object, got ", j.type_name()));
    }
    RecordReader r(where, j);
    SATDAR_ASSIGN_OR_RETURN(std::string type, r.String("type", false));
    runtime::TaskKind kind;
    if (type == "choice") {
      kind = runtime::TaskKind::kChoice;
    } else if (type == "cloze") {
      kind = runtime::TaskKind::kCloze;
    } else if (type == "recall") {
      kind = runtime::TaskKind::kRecall;
    } else {
      return r.Bad("type", absl::StrCat("must be choice, cloze or recall, got \"", type, "\""));
    }
    if (!have_kind) {
      file.kind = kind;
      have_kind = true;
    } else if (kind != file.kind) {
      return r.Bad("type", absl::StrCat("\"", type, "\" in a file of \"", TypeName(file.kind),
                                        "\" records (one type per file)"));
    }
    const std::vector<std::string> fields = FieldsOf(kind);
    for (const auto& [key, unused] : j.items()) {
      if (std::find(fields.begin(), fields.end(), key) == fields.end()) {
        return r.Bad(key, absl::StrCat("unknown in a ", type, " record (its fields are ",
                                       absl::StrJoin(fields, ", "), ")"));
      }
    }
    TaskRecord record;
    record.line = line_number;
    if (kind == runtime::TaskKind::kChoice) {
      SATDAR_ASSIGN_OR_RETURN(record.context, r.String("context", true));
      SATDAR_ASSIGN_OR_RETURN(record.choices, r.Strings("choices"));
      SATDAR_ASSIGN_OR_RETURN(int64_t answer, r.Integer("answer"));
      if (answer < 0 || answer >= static_cast<int64_t>(record.choices.size())) {
        return r.Bad("answer", absl::StrCat(answer, " is not the index of a choice (0 to ",
                                            record.choices.size() - 1, ")"));
      }
      record.answer = static_cast<int>(answer);
    } else if (kind == runtime::TaskKind::kCloze) {
      SATDAR_ASSIGN_OR_RETURN(record.context, r.String("context", true));
      SATDAR_ASSIGN_OR_RETURN(record.target, r.String("target", false));
    } else {
      SATDAR_ASSIGN_OR_RETURN(record.context, r.String("prompt", true));
      SATDAR_ASSIGN_OR_RETURN(record.answers, r.Strings("answers"));
    }
    file.records.push_back(std::move(record));
  }
  if (file.records.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no records (one JSON object per line)"));
  }
  return file;
}

absl::StatusOr<TaskFile> ReadTaskFile(const std::string& path) {
  SATDAR_RETURN_IF_ERROR(core::CheckRegularFile(path));
  SATDAR_ASSIGN_OR_RETURN(std::string text, core::ReadFileToString(path, core::kNoSizeLimit));
  return ParseTaskFile(path, text);
}

absl::StatusOr<runtime::Task> TokenizeTaskFile(const TaskFile& file, const Encoder& encode) {
  runtime::Task task;
  task.name = file.name;
  task.kind = file.kind;
  for (const TaskRecord& record : file.records) {
    const std::string where = absl::StrCat(file.path, ":", record.line);
    auto failed = [&where](const std::string& field, const absl::Status& s) {
      return absl::Status(s.code(), absl::StrCat(where, ": field \"", field, "\": ", s.message()));
    };
    absl::StatusOr<std::vector<int32_t>> context = encode(record.context);
    if (!context.ok()) {
      return failed(file.kind == runtime::TaskKind::kRecall ? "prompt" : "context",
                    context.status());
    }
    // The continuation's ids as they follow the context in running text.
    auto continuation = [&](const std::string& field,
                            const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
      std::vector<int32_t> ids;
      if (!context->empty()) {
        absl::StatusOr<std::vector<int32_t>> whole = encode(record.context + text);
        if (!whole.ok()) return failed(field, whole.status());
        if (whole->size() > context->size() &&
            std::equal(context->begin(), context->end(), whole->begin())) {
          ids.assign(whole->begin() + static_cast<std::ptrdiff_t>(context->size()), whole->end());
        }
      }
      if (ids.empty()) {
        absl::StatusOr<std::vector<int32_t>> alone = encode(text);
        if (!alone.ok()) return failed(field, alone.status());
        ids = *std::move(alone);
      }
      if (ids.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": field \"", field, "\": has no tokens"));
      }
      return ids;
    };
    switch (file.kind) {
      case runtime::TaskKind::kChoice: {
        runtime::ChoiceItem item;
        item.context = *context;
        for (size_t k = 0; k < record.choices.size(); ++k) {
          SATDAR_ASSIGN_OR_RETURN(
              std::vector<int32_t> ids,
              continuation(absl::StrCat("choices[", k, "]"), record.choices[k]));
          item.choices.push_back(std::move(ids));
          item.choice_bytes.push_back(static_cast<int64_t>(record.choices[k].size()));
        }
        item.answer = record.answer;
        task.choice.push_back(std::move(item));
        break;
      }
      case runtime::TaskKind::kCloze: {
        runtime::ClozeItem item;
        item.context = *context;
        SATDAR_ASSIGN_OR_RETURN(item.target, continuation("target", record.target));
        task.cloze.push_back(std::move(item));
        break;
      }
      case runtime::TaskKind::kRecall: {
        runtime::RecallItem item;
        item.prompt = *context;
        item.answers = record.answers;
        task.recall.push_back(std::move(item));
        break;
      }
    }
    task.where.push_back(where);
  }
  return task;
}

}  // namespace satdar::cli
