// agent/jsonl_tail.h: follows a file another process appends lines to (a rank's --log-jsonl),
// handing out each complete line once, from the file's size at construction on.
//
//   JsonlTail tail(shared + "/log.jsonl");
//   for (std::string& line : tail.TakeRecords()) ...   // new complete lines since the last call
#ifndef SATDAR_AGENT_JSONL_TAIL_H_
#define SATDAR_AGENT_JSONL_TAIL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace satdar::agent {

class JsonlTail {
 public:
  // max_bytes: at most this much is read per call (the rest waits for the next one).
  explicit JsonlTail(std::string path, int64_t max_bytes = 1 << 20);

  // The complete lines appended since the last call; a partial last line waits until it ends,
  // and a line longer than max_bytes is dropped whole.
  // A file that is missing, or shorter than what was read (replaced), starts over from 0.
  std::vector<std::string> TakeRecords();

 private:
  std::string path_;
  int64_t max_bytes_;
  int64_t offset_ = 0;
  bool skipping_ = false;  // inside a line longer than max_bytes_
};

}  // namespace satdar::agent

#endif  // SATDAR_AGENT_JSONL_TAIL_H_
