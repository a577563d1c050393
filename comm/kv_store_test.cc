#include "comm/kv_store.h"

#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::comm {
namespace {

std::string FreshDir(const std::string& name) {
  return core::testing::TestTmpDir(absl::StrCat(name, "_", ::getpid()));
}

TEST(FileKvStore, SetGetAnyKeyAndBytes) {
  auto store = FileKvStore::Open(FreshDir("kv_basic") + "/store");  // created when missing
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string bytes("a\0b\xff\n", 5);
  for (const std::string key : {"plain", "with/slash", "dots.tmp.12", "sp ace%", ""}) {
    ASSERT_TRUE((*store)->Set(key, bytes + key).ok()) << key;
  }
  for (const std::string key : {"plain", "with/slash", "dots.tmp.12", "sp ace%", ""}) {
    auto v = (*store)->Get(key, absl::Seconds(1));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, bytes + key);
  }
  ASSERT_TRUE((*store)->Set("plain", "replaced").ok());
  EXPECT_EQ(*(*store)->TryGet("plain"), "replaced");
  EXPECT_EQ((*store)->TryGet("absent").status().code(), absl::StatusCode::kNotFound);
}

TEST(FileKvStore, GetWaitsForTheKeyOrTimesOutNamingIt) {
  const std::string dir = FreshDir("kv_wait");
  auto store = FileKvStore::Open(dir);
  ASSERT_TRUE(store.ok());
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto other = FileKvStore::Open(dir);
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE((*other)->Set("late", std::string(1 << 20, 'x')).ok());
  });
  auto v = (*store)->Get("late", absl::Seconds(10));
  writer.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->size(), 1u << 20);  // never a partial value
  const auto start = std::chrono::steady_clock::now();
  auto never = (*store)->Get("never", absl::Milliseconds(200));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(never.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(
      never.status().message().find("key 'never' did not appear in the rendezvous store " + dir),
      std::string::npos)
      << never.status();
  EXPECT_GE(took, std::chrono::milliseconds(190));
  EXPECT_LT(took, std::chrono::seconds(5));
}

TEST(FileKvStore, UnreachableDirectoryIsAnError) {
  auto s = FileKvStore::Open("/nonexistent-satdar-dir/a/b");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find("/nonexistent-satdar-dir/a/b is not reachable"),
            std::string::npos)
      << s.status();
  EXPECT_EQ(FileKvStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace satdar::comm
