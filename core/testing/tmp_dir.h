// core/testing/tmp_dir.h: per-test scratch folders under Bazel's $TEST_TMPDIR.
#ifndef SATDAR_CORE_TESTING_TMP_DIR_H_
#define SATDAR_CORE_TESTING_TMP_DIR_H_

#include <sys/stat.h>

#include <cstdlib>
#include <string>

namespace satdar::core::testing {

// $TEST_TMPDIR/name (or /tmp/name outside Bazel), created if needed.
inline std::string TestTmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

}  // namespace satdar::core::testing

#endif  // SATDAR_CORE_TESTING_TMP_DIR_H_
