// comm/kv_store.h: a small key-value store through which ranks find each other before they
// can talk (Gloo's rendezvous, NCCL's unique id). Values are opaque bytes.
//
//   SATDAR_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> store, FileKvStore::Open("/shared/job42"));
//   SATDAR_RETURN_IF_ERROR(store->Set("rank/0", address));
//   SATDAR_ASSIGN_OR_RETURN(std::string peer, store->Get("rank/1", absl::Seconds(30)));
//
// Keys are written once per job; a store directory (or a key prefix) must be fresh for every
// launch, otherwise a rank may read what an earlier launch left behind.
#ifndef SATDAR_COMM_KV_STORE_H_
#define SATDAR_COMM_KV_STORE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace satdar::comm {

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Stores value under key (replacing an earlier value); readers see all of it or nothing.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The value of key, waiting until it is present; DeadlineExceeded naming the key (and the
  // store) when it did not appear within timeout.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // The value of key if present now, NotFound otherwise.
  virtual absl::StatusOr<std::string> TryGet(const std::string& key) = 0;
};

// A store in a directory every rank can reach (a local folder, or NFS for several machines).
// Each key is one file, written to a temporary name and renamed, so a reader never sees a
// partial value. Any key is allowed: characters other than [A-Za-z0-9_-] are escaped.
class FileKvStore : public KvStore {
 public:
  // Creates dir if it is missing (its parent must exist). Unavailable when dir cannot be
  // created or is not a writable directory; the message names it.
  static absl::StatusOr<std::unique_ptr<FileKvStore>> Open(const std::string& dir);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<std::string> TryGet(const std::string& key) override;

  const std::string& dir() const { return dir_; }

 private:
  explicit FileKvStore(std::string dir) : dir_(std::move(dir)) {}
  std::string PathOf(const std::string& key) const;

  std::string dir_;
};

}  // namespace satdar::comm

#endif  // SATDAR_COMM_KV_STORE_H_
