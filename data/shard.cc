#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/file_util.h"

namespace satdar::data {

namespace {

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t width;
  uint64_t tokens;
  uint64_t docs;
  uint64_t checksum;
  uint64_t vocab;
  uint8_t reserved[16];
};
static_assert(sizeof(Header) == kShardHeaderBytes, "shard header is 64 bytes");

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("shard ", path, ": ", what));
}

}  // namespace

absl::Status WriteShard(const std::string& path, const std::vector<uint32_t>& tokens,
                        const std::vector<uint64_t>& doc_starts, int width, uint64_t vocab) {
  SATDAR_CHECK(width == 1 || width == 2 || width == 4) << "bad shard width " << width;
  const uint64_t limit = width == 4 ? (1ull << 32) : (1ull << (8 * width));
  std::string body(tokens.size() * width + doc_starts.size() * 8, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t t = tokens[i];
    if (t >= limit || (vocab > 0 && t >= vocab)) {
      return Bad(path, absl::StrCat("token id ", t, " at ", i, " does not fit (vocab ", vocab,
                                    ", width ", width, ")"));
    }
    if (width == 1) body[i] = static_cast<char>(t);
    if (width == 2) {
      uint16_t v = static_cast<uint16_t>(t);
      std::memcpy(&body[i * 2], &v, 2);
    }
    if (width == 4) std::memcpy(&body[i * 4], &t, 4);
  }
  std::memcpy(&body[tokens.size() * width], doc_starts.data(), doc_starts.size() * 8);
  Header h{};
  std::memcpy(h.magic, kShardMagic, 8);
  h.version = kShardVersion;
  h.width = static_cast<uint32_t>(width);
  h.tokens = tokens.size();
  h.docs = doc_starts.size();
  h.checksum = core::Checksum64(body.data(), body.size());
  h.vocab = vocab;
  core::AtomicFileWriter writer;
  SATDAR_RETURN_IF_ERROR(writer.Open(path));
  SATDAR_RETURN_IF_ERROR(writer.Append(&h, sizeof(h)));
  SATDAR_RETURN_IF_ERROR(writer.Append(body.data(), body.size()));
  return writer.Commit();
}

absl::StatusOr<Shard> Shard::Open(const std::string& path, uint64_t vocab) {
  Shard s;
  s.path_ = path;
  auto mapped = core::MappedFile::Open(path);
  if (!mapped.ok()) return Bad(path, std::string(mapped.status().message()));
  s.file_ = std::move(*mapped);
  if (s.file_.size() < kShardHeaderBytes) {
    return Bad(path, "truncated: shorter than the 64-byte header");
  }
  Header h;
  std::memcpy(&h, s.file_.data(), sizeof(h));
  if (std::memcmp(h.magic, kShardMagic, 8) != 0) return Bad(path, "not a satdar shard (bad magic)");
  if (h.version != kShardVersion) {
    return Bad(path, absl::StrCat("version ", h.version, ", this satdar reads ", kShardVersion));
  }
  if (h.width != 1 && h.width != 2 && h.width != 4) {
    return Bad(path, absl::StrCat("token width ", h.width, " is not 1, 2 or 4"));
  }
  const uint64_t body = s.file_.size() - kShardHeaderBytes;
  if (h.tokens > body / h.width || h.docs > body / 8 || h.tokens * h.width + h.docs * 8 != body) {
    return Bad(path, absl::StrCat("truncated or padded: ", body, " bytes after the header for ",
                                  h.tokens, " tokens of ", h.width, " bytes and ", h.docs,
                                  " documents"));
  }
  s.data_ = s.file_.data() + kShardHeaderBytes;
  if (core::Checksum64(s.data_, body) != h.checksum) {
    return Bad(path, "checksum mismatch: the file is corrupted");
  }
  s.tokens_ = h.tokens;
  s.width_ = static_cast<int>(h.width);
  s.vocab_ = h.vocab;
  if (vocab > 0 && h.width > 1) {
    if (h.vocab > vocab) {
      return Bad(path, absl::StrCat("written for vocabulary size ", h.vocab,
                                    ", larger than the model's ", vocab));
    }
    for (uint64_t i = 0; i < s.tokens_; ++i) {
      if (s.at(i) >= vocab) {
        return Bad(path, absl::StrCat("token id ", s.at(i), " at ", i, " >= vocab_size ", vocab));
      }
    }
  }
  s.docs_.resize(h.docs);
  std::memcpy(s.docs_.data(), s.data_ + h.tokens * h.width, h.docs * 8);
  for (uint64_t d = 0; d < h.docs; ++d) {
    if (s.docs_[d] > s.tokens_ || (d > 0 && s.docs_[d] < s.docs_[d - 1])) {
      return Bad(path, "document offsets are not ascending within the shard");
    }
  }
  return s;
}

}  // namespace satdar::data
