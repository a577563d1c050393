#include "core/file_util.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::core {
namespace {

bool Contains(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != absl::string_view::npos;
}

// A FIFO given where a file is meant is refused at once (opening it for reading would wait
// for a writer forever).
TEST(FileUtil, FifoIsRefusedWithoutBlocking) {
  const std::string dir_path = testing::TestTmpDir("file_util_fifo");
  const std::string fifo = dir_path + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const auto start = std::chrono::steady_clock::now();
  auto text = ReadFileToString(fifo, kMaxSmallFileBytes);
  auto mapped = MappedFile::Open(fifo);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(text.status(), "pipe is a FIFO (named pipe), not a regular file"))
      << text.status();
  ASSERT_FALSE(mapped.ok());
  EXPECT_TRUE(Contains(mapped.status(), "is a FIFO")) << mapped.status();
  EXPECT_TRUE(Contains(CheckRegularFile(fifo), "is a FIFO"));
  EXPECT_TRUE(Contains(CheckFolder(fifo), "is a FIFO (named pipe), not a folder"));
  EXPECT_EQ(PathKind(fifo), "a FIFO (named pipe)");
}

TEST(FileUtil, DevicesFoldersAndMissingPaths) {
  const std::string dir_path = testing::TestTmpDir("file_util_devices");
  auto urandom = ReadFileToString("/dev/urandom", kMaxSmallFileBytes);
  ASSERT_FALSE(urandom.ok());
  EXPECT_TRUE(Contains(urandom.status(), "/dev/urandom is a character device")) << urandom.status();
  auto folder = ReadFileToString(dir_path, kMaxSmallFileBytes);
  EXPECT_TRUE(Contains(folder.status(), "is a folder, not a regular file")) << folder.status();
  auto missing = ReadFileToString(dir_path + "/nope", kMaxSmallFileBytes);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CheckRegularFile(dir_path + "/nope").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(CheckFolder(dir_path).ok());
}

TEST(FileUtil, SizeLimit) {
  const std::string dir_path = testing::TestTmpDir("file_util_sizelimit");
  const std::string path = dir_path + "/big";
  ASSERT_TRUE(WriteFileAtomically(path, std::string(1000, 'x')).ok());
  EXPECT_TRUE(ReadFileToString(path, 1000).ok());
  auto big = ReadFileToString(path, 999);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(big.status(), "larger than the 999 bytes")) << big.status();
}

TEST(FileUtil, OutputChecks) {
  const std::string dir_path = testing::TestTmpDir("file_util_outputs");
  EXPECT_TRUE(CheckOutputFile(dir_path + "/out.json").ok());
  EXPECT_TRUE(Contains(CheckOutputFile(dir_path + "/no/such/out.json"), "does not exist"));
  EXPECT_TRUE(Contains(CheckOutputFile(dir_path), "is a folder; an output must be"));
  EXPECT_TRUE(Contains(CheckOutputFile(dir_path + "/"), "names a folder"));
  EXPECT_TRUE(CheckOutputFolder(dir_path + "/new").ok());
  EXPECT_TRUE(CheckOutputFolder(dir_path).ok());
  EXPECT_TRUE(Contains(CheckOutputFolder(dir_path + "/a/b"), "does not exist"));
  // mkdir -p: missing parents are fine when the nearest existing one is a writable folder.
  EXPECT_TRUE(CheckCreatableFolder(dir_path + "/a/b/c").ok());
  EXPECT_TRUE(CheckCreatableFolder(dir_path).ok());
  const std::string file = dir_path + "/f";
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  EXPECT_TRUE(Contains(CheckOutputFolder(file), "is a regular file, not a folder"));
  EXPECT_TRUE(Contains(CheckCreatableFolder(file + "/x/y"),
                       file + " is a regular file, not a folder"));
  // Hard links and the same path are the same file.
  ASSERT_EQ(::link(file.c_str(), (dir_path + "/g").c_str()), 0);
  EXPECT_TRUE(SameFile(file, dir_path + "/g"));
  EXPECT_TRUE(SameFile(file, dir_path + "/./f"));
  EXPECT_FALSE(SameFile(file, dir_path + "/missing"));
}

TEST(FileUtil, RemoveTree) {
  const std::string dir_path = testing::TestTmpDir("file_util_removetree");
  const std::string root = dir_path + "/t";
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/sub").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileAtomically(root + "/sub/x", "1").ok());
  ASSERT_TRUE(RemoveTree(root).ok());
  EXPECT_EQ(PathKind(root), "missing");
  EXPECT_TRUE(RemoveTree(root).ok());  // already gone
}

}  // namespace
}  // namespace satdar::core
