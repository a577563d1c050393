// data/shard.h: token shards, the on-disk unit of a prepared dataset.
//
// Layout (little-endian), written to a temporary name and renamed when complete:
//   offset 0   char[8]  magic "SATDSHRD"
//          8   u32      version (1)
//         12   u32      token width in bytes: 2 (u16 ids) or 4 (u32 ids); 1 for a POS sidecar
//         16   u64      token count N
//         24   u64      document count D
//         32   u64      checksum of everything after the header (Checksum64)
//         40   u64      vocabulary size the ids were checked against (0 for a sidecar)
//         48   u8[16]   reserved (zero)
//         64   N tokens, then D u64 document start offsets (ascending, the first is 0)
// A POS sidecar has the same layout with 1-byte entries: the part-of-speech group of every
// token of the shard it sits beside (data/pos.h).
#ifndef SATDAR_DATA_SHARD_H_
#define SATDAR_DATA_SHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/file_util.h"

namespace satdar::data {

inline constexpr char kShardMagic[8] = {'S', 'A', 'T', 'D', 'S', 'H', 'R', 'D'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

// Writes a shard atomically. width is 1, 2 or 4; every id must fit the width and (when vocab
// > 0) be < vocab.
absl::Status WriteShard(const std::string& path, const std::vector<uint32_t>& tokens,
                        const std::vector<uint64_t>& doc_starts, int width, uint64_t vocab);

// A read-only, memory-mapped shard; Open verifies magic, version, sizes, ids against the
// vocabulary and the checksum, naming the file in every error.
class Shard {
 public:
  static absl::StatusOr<Shard> Open(const std::string& path, uint64_t vocab);

  const std::string& path() const { return path_; }
  uint64_t size() const { return tokens_; }
  int width() const { return width_; }
  uint64_t vocab() const { return vocab_; }  // what the header says the ids were checked against
  uint32_t at(uint64_t i) const {
    return width_ == 2 ? reinterpret_cast<const uint16_t*>(data_)[i]
                       : width_ == 4 ? reinterpret_cast<const uint32_t*>(data_)[i]
                                     : reinterpret_cast<const uint8_t*>(data_)[i];
  }
  const std::vector<uint64_t>& doc_starts() const { return docs_; }

 private:
  Shard() = default;
  std::string path_;
  core::MappedFile file_;
  const char* data_ = nullptr;
  uint64_t tokens_ = 0;
  int width_ = 0;
  uint64_t vocab_ = 0;
  std::vector<uint64_t> docs_;
};

}  // namespace satdar::data

#endif  // SATDAR_DATA_SHARD_H_
