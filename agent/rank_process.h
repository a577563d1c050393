// agent/rank_process.h: one rank a worker runs: a child `satdar train` in its own process
// group, its stdout and stderr read line by line (kept for the coordinator, the last ones for
// the exit report, and parsed for progress), and its end.
//
//   SATDAR_ASSIGN_OR_RETURN(auto p, RankProcess::Start(argv, env, "rank0.log"));
//   p->Signal(SIGTERM);                 // the whole group
//   if (p->Poll(&code, &signal)) ...    // ended
#ifndef SATDAR_AGENT_RANK_PROCESS_H_
#define SATDAR_AGENT_RANK_PROCESS_H_

#include <sys/types.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace satdar::agent {

struct RankProgress {
  int64_t step = 0;
  double loss = 0;
  double tokens_per_second = 0;
  std::string metrics_address;  // HOST:PORT, once the rank said where it serves /metrics
};

// Progress from a line `satdar train` prints ("step    10/200 | loss 7.5137 | ... | 1202
// tok/s"), or its metrics address ("metrics: serving on http://HOST:PORT/metrics"); false for
// any other line.
bool ParseProgressLine(const std::string& line, RankProgress* out);

class RankProcess {
 public:
  // argv[0] is the program. env: extra "NAME=value" entries. Every line is also appended to
  // log_path.
  static absl::StatusOr<std::unique_ptr<RankProcess>> Start(const std::vector<std::string>& argv,
                                                            const std::vector<std::string>& env,
                                                            const std::string& log_path);
  ~RankProcess();  // kills the group if it still runs
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The lines read since the last call.
  std::vector<std::string> TakeLines();
  std::vector<std::string> LastLines() const;
  RankProgress progress() const;
  // True once the child has ended (and its output is read): *exit_code (-1 for a signal) and
  // *signal (0 for a normal exit).
  bool Poll(int* exit_code, int* signal);
  void Signal(int sig);

 private:
  RankProcess() = default;
  void ReadLoop(int fd, std::string log_path);

  pid_t pid_ = -1;
  bool ended_ = false;
  int exit_code_ = -1, signal_ = 0;
  std::thread reader_;
  mutable std::mutex mu_;
  std::vector<std::string> pending_;  // guarded by mu_
  std::deque<std::string> last_;      // guarded by mu_
  RankProgress progress_;             // guarded by mu_
  bool eof_ = false;                  // guarded by mu_
};

}  // namespace satdar::agent

#endif  // SATDAR_AGENT_RANK_PROCESS_H_
