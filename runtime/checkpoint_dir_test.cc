#include "runtime/checkpoint_dir.h"

#include <sys/stat.h>

#include <string>

#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::runtime {
namespace {

bool Exists(const std::string& path) { return core::PathKind(path) != "missing"; }

TEST(CheckpointDirLock, OneRunPerFolder) {
  const std::string dir = core::testing::TestTmpDir("ckdir_lock") + "/ck";
  std::string note;
  auto first = CheckpointDirLock::Acquire(dir, false, &note);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(note.empty());
  auto second = CheckpointDirLock::Acquire(dir, true, nullptr);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find("is in use by another run (pid "), std::string::npos)
      << second.status();
  first->reset();  // released: the folder can be taken again
  auto third = CheckpointDirLock::Acquire(dir, true, nullptr);
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST(CheckpointDirLock, RemovesStaleTemporariesAndRefusesAFreshRunIntoUsedFolder) {
  const std::string dir = core::testing::TestTmpDir("ckdir_stale");
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/ckpt_00000002.safetensors.tmp.77", "x").ok());
  ASSERT_EQ(::mkdir((dir + "/ckpt_00000004.tmp").c_str(), 0755), 0);
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/notes.txt", "mine").ok());
  std::string note;
  auto lock = CheckpointDirLock::Acquire(dir, false, &note);
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_EQ(note, "removed 2 temporary file(s) a killed run left in " + dir);
  EXPECT_FALSE(Exists(dir + "/ckpt_00000002.safetensors.tmp.77"));
  EXPECT_FALSE(Exists(dir + "/ckpt_00000004.tmp"));
  EXPECT_TRUE(Exists(dir + "/notes.txt"));
  lock->reset();
  ASSERT_TRUE(core::WriteFileAtomically(dir + "/ckpt_00000006.safetensors", "x").ok());
  auto fresh = CheckpointDirLock::Acquire(dir, false, nullptr);
  ASSERT_FALSE(fresh.ok());
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(fresh.status().message().find("already holds checkpoints (newest: " + dir +
                                          "/ckpt_00000006.safetensors); set resume"),
            std::string::npos)
      << fresh.status();
  EXPECT_TRUE(CheckpointDirLock::Acquire(dir, true, nullptr).ok());
}

}  // namespace
}  // namespace satdar::runtime
