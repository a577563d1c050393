#include "core/safetensors.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "core/testing/tmp_dir.h"
#include "gtest/gtest.h"

namespace satdar::core {
namespace {

std::string TmpPath(const std::string& name) { return testing::TestTmpDir("st") + "/" + name; }

// Builds a raw safetensors file from a header string and a data section.
void WriteRaw(const std::string& path, const std::string& header, const std::string& data) {
  uint64_t len = header.size();
  std::string bytes(reinterpret_cast<const char*>(&len), 8);
  bytes += header + data;
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
}

TEST(Safetensors, RoundTrip) {
  std::string path = TmpPath("rt.safetensors");
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<double> b = {0.5};
  std::vector<int32_t> c = {7, 8};
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"a", DType::kF32, {2, 3}, a.data()},
                                {"b", DType::kF64, {1}, b.data()},
                                {"c", DType::kI32, {2}, c.data()}},
                               {{"step", "12"}})
                  .ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->entries().size(), 3u);
  EXPECT_EQ(f->metadata().at("step"), "12");
  const SafetensorsEntry* e = f->Find("a");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(f->data(*e), a.data(), 24), 0);
  std::vector<double> a64(6);
  ASSERT_TRUE(f->ReadFloats("a", {2, 3}, DType::kF64, a64.data()).ok());
  EXPECT_EQ(a64[5], 6.0);
  EXPECT_EQ(f->Find("zzz"), nullptr);
  absl::Status s = f->ReadFloats("a", {3, 2}, DType::kF32, a64.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'a' has shape [2, 3], expected [3, 2]"), std::string::npos)
      << s;
  s = f->ReadFloats("c", {2}, DType::kF32, a64.data());
  EXPECT_NE(s.message().find("expected a floating dtype"), std::string::npos) << s;
}

TEST(Safetensors, DataSectionIsAligned) {
  std::string path = TmpPath("al.safetensors");
  std::vector<float> a = {1};
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kF32, {1}, a.data()}}, {}).ok());
  auto bytes = ReadFileToString(path, kNoSizeLimit);
  ASSERT_TRUE(bytes.ok());
  uint64_t len;
  std::memcpy(&len, bytes->data(), 8);
  EXPECT_EQ((8 + len) % 8, 0u);
}

struct BadCase {
  const char* name;
  std::string header;
  std::string data;
  const char* message;
};

TEST(Safetensors, RejectsBadFiles) {
  std::vector<BadCase> cases = {
      {"not_json", "{oops", "", "safetensors header: not valid JSON: parse error at line 1"},
      {"unknown_dtype", R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})",
       std::string(4, '\0'), "tensor 'w': unknown dtype 'F17'"},
      {"out_of_range", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       std::string(4, '\0'), "tensor 'w': data_offsets [0, 8] out of range"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, '\0'), "overlapping data_offsets"},
      {"size_mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       std::string(8, '\0'), "tensor 'w': 8 bytes for shape [3] of F32 (expected 12)"},
      {"negative_shape", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "",
       "shape entries must be >= 0"},
      {"missing_dtype", R"({"w":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'),
       "tensor 'w': missing dtype"},
  };
  for (const BadCase& c : cases) {
    std::string path = TmpPath(std::string(c.name) + ".safetensors");
    WriteRaw(path, c.header, c.data);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(f.status().message().find(c.message), std::string::npos)
        << c.name << ": " << f.status();
    EXPECT_NE(f.status().message().find(path), std::string::npos) << c.name;
  }
}

TEST(Safetensors, RejectsTruncatedFile) {
  std::string path = TmpPath("trunc.safetensors");
  std::vector<float> a(100, 1.0f);
  ASSERT_TRUE(WriteSafetensors(path, {{"w", DType::kF32, {100}, a.data()}}, {}).ok());
  auto bytes = ReadFileToString(path, kNoSizeLimit);
  ASSERT_TRUE(bytes.ok());
  for (size_t keep : {size_t{3}, size_t{20}, bytes->size() - 1}) {
    ASSERT_TRUE(WriteFileAtomically(path, bytes->substr(0, keep)).ok());
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << keep;
    EXPECT_NE(f.status().message().find("truncated"), std::string::npos) << f.status();
  }
}

TEST(Safetensors, MissingFileIsNotFound) {
  auto f = SafetensorsFile::Open(TmpPath("does_not_exist.safetensors"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

TEST(AtomicFileWriter, AbandonedWriteLeavesNothing) {
  std::string path = TmpPath("abandoned.bin");
  std::remove(path.c_str());
  {
    AtomicFileWriter w;
    ASSERT_TRUE(w.Open(path).ok());
    ASSERT_TRUE(w.Append("abc", 3).ok());
  }
  EXPECT_EQ(ReadFileToString(path, kNoSizeLimit).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace satdar::core
