#include "core/folder_lock.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::core {
namespace {

// flock locks belong to an open file description, so a second Acquire in the same process
// conflicts with the first just as another process would.
TEST(FolderLock, SecondHolderIsRefusedAndNamesTheFirst) {
  const std::string dir = testing::TestTmpDir("folder_lock_second");
  auto first = FolderLock::Acquire(dir, "x.lock", "--work-dir", "worker");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = FolderLock::Acquire(dir, "x.lock", "--work-dir", "worker");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  const std::string want = absl::StrCat("--work-dir: ", dir, " is in use by another worker (pid ",
                                        ::getpid(), " on host ");
  EXPECT_EQ(second.status().message().substr(0, want.size()), want) << second.status();
  first->reset();
  EXPECT_TRUE(FolderLock::Acquire(dir, "x.lock", "--work-dir", "worker").ok());
}

TEST(FolderLock, UncreatableLockFileNamesTheFlag) {
  auto lock = FolderLock::Acquire("/nonexistent-satdar-dir", "x.lock", "--state-dir", "coordinator");
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(lock.status().message()),
            "--state-dir: cannot create the lock file /nonexistent-satdar-dir/x.lock: No such file "
            "or directory");
}

}  // namespace
}  // namespace satdar::core
