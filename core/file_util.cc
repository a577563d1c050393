#include "core/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace satdar::core {

namespace {
absl::Status ErrnoError(const std::string& what, const std::string& path) {
  int err = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Errors of opening an input: NotFound when it is missing, InvalidArgument otherwise.
absl::Status ErrnoInputError(const std::string& what, const std::string& path) {
  int err = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
}

std::string KindOf(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

absl::Status TooLarge(const std::string& path, uint64_t size, size_t max_bytes) {
  return absl::InvalidArgumentError(absl::StrCat(path, " is ", size,
                                                 " bytes or more, larger than the ", max_bytes,
                                                 " bytes a file of its kind may be"));
}

// Opens a regular file for reading. O_NONBLOCK makes opening a FIFO return at once (instead of
// waiting for a writer), so it can be refused; for a regular file the flag changes nothing.
absl::StatusOr<int> OpenForReading(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return ErrnoInputError("cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = ::fstat(fd, &st) == 0 ? KindOf(st.st_mode) : "not readable";
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", kind, ", not a regular file"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}
}  // namespace

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

absl::Status AtomicFileWriter::Open(const std::string& path) {
  path_ = path;
  tmp_path_ = absl::StrCat(path, ".tmp.", ::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) return ErrnoError("cannot create", tmp_path_);
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Append(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", tmp_path_);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (::fsync(fd_) != 0) return ErrnoError("cannot fsync", tmp_path_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(tmp_path_.c_str());
    return ErrnoError("cannot close", tmp_path_);
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    absl::Status s = ErrnoError("cannot rename to", path_);
    ::unlink(tmp_path_.c_str());
    return s;
  }
  // Best effort: some file systems (FUSE, 9p) refuse to fsync a folder, and the rename has
  // already made the complete file visible.
  (void)FsyncDir(DirName(path_));
  return absl::OkStatus();
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, size_);
    map_ = other.map_;
    size_ = other.size_;
    other.map_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  SATDAR_ASSIGN_OR_RETURN(const int fd, OpenForReading(path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  MappedFile f;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* map = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": cannot mmap: ", std::strerror(err)));
    }
    f.map_ = map;
  }
  ::close(fd);
  return f;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  SATDAR_ASSIGN_OR_RETURN(const int fd, OpenForReading(path));
  struct stat st;
  if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return TooLarge(path, static_cast<uint64_t>(st.st_size), max_bytes);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("cannot read", path);
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    if (out.size() + static_cast<size_t>(r) > max_bytes) {  // it grew while we read it
      ::close(fd);
      return TooLarge(path, out.size() + static_cast<size_t>(r), max_bytes);
    }
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

std::string PathKind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT ? "missing" : "not accessible";
  return KindOf(st.st_mode);
}

absl::Status CheckRegularFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoInputError("cannot open", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", KindOf(st.st_mode), ", not a regular file"));
  }
  return absl::OkStatus();
}

absl::Status CheckFolder(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoInputError("cannot open folder", path);
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", KindOf(st.st_mode), ", not a folder"));
  }
  return absl::OkStatus();
}

absl::Status CheckOutputFile(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("the output path is empty");
  if (path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(path, " names a folder, not a file"));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", KindOf(st.st_mode), "; an output must be a regular file"));
  }
  const std::string dir = DirName(path);
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", path, ": the folder ", dir, " does not exist"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", path, ": ", dir, " is ", KindOf(st.st_mode), ", not a folder"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": the folder ", dir,
                                                   " is not writable (", std::strerror(errno),
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckOutputFolder(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("the output folder is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is ", KindOf(st.st_mode), ", not a folder"));
    }
    if (::access(path.c_str(), W_OK | X_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write into ", path, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const std::string parent = DirName(trimmed);
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create folder ", path, ": ", parent, " does not exist"));
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create folder ", path, ": ", parent,
                                                   " is not writable (", std::strerror(errno),
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckCreatableFolder(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("the output folder is empty");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return CheckOutputFolder(path);
  std::string at = path;
  while (true) {
    while (at.size() > 1 && at.back() == '/') at.pop_back();
    at = DirName(at);
    if (::stat(at.c_str(), &st) == 0) break;
    if (at == "." || at == "/") break;
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create folder ", path, ": ", at,
                                                   " is ", KindOf(st.st_mode), ", not a folder"));
  }
  if (::access(at.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create folder ", path, ": ", at,
                                                   " is not writable (", std::strerror(errno),
                                                   ")"));
  }
  return absl::OkStatus();
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  AtomicFileWriter writer;
  absl::Status s = writer.Open(path);
  if (s.ok()) s = writer.Append(contents.data(), contents.size());
  if (s.ok()) s = writer.Commit();
  return s;
}

absl::Status MakeDirs(const std::string& path) {
  std::string at;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    at = path.substr(0, slash);
    start = slash + 1;
    if (at.empty()) continue;
    if (::mkdir(at.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create folder ", at, ": ", std::strerror(errno)));
    }
  }
  return CheckFolder(path);
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoError("cannot remove", path);
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return ErrnoError("cannot open folder", path);
    absl::Status s;
    while (struct dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      s = RemoveTree(path + "/" + name);
      if (!s.ok()) break;
    }
    ::closedir(d);
    SATDAR_RETURN_IF_ERROR(s);
    if (::rmdir(path.c_str()) != 0) return ErrnoError("cannot remove", path);
    return absl::OkStatus();
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot remove", path);
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open folder", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync folder", dir);
  return absl::OkStatus();
}

uint64_t Checksum64(const void* data, size_t n, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed ^ (n * 0x9e3779b97f4a7c15ull);
  size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (size_t i = words * 8; i < n; ++i) {
    h = (h ^ p[i]) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace satdar::core
