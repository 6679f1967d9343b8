#include "common/file_system.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace shardline {
namespace {

Error os_error(const std::string& what, const std::string& path, int err) {
  // A full disk (or quota) is not a broken file: the caller pauses and
  // retries once space is back (issue 46, items 7 and 8).
  const ErrorCode code = err == ENOSPC || err == EDQUOT ? ErrorCode::disk_full : ErrorCode::io;
  return make_error(code, what + " " + path + ": " + std::strerror(err));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override { ::close(fd_); }
  PosixWritableFile(const PosixWritableFile&) = delete;
  PosixWritableFile& operator=(const PosixWritableFile&) = delete;

  Status write_at(std::uint64_t offset, std::string_view data) override {
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return os_error("write", path_, errno);
      }
      done += static_cast<std::size_t>(n);
    }
    return Status::ok_status();
  }

  Status truncate(std::uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return os_error("truncate", path_, errno);
    return Status::ok_status();
  }

  Status sync() override {
    if (::fdatasync(fd_) != 0) return os_error("sync", path_, errno);
    return Status::ok_status();
  }

  Result<std::uint64_t> size() override {
    struct stat sb {};
    if (::fstat(fd_, &sb) != 0) return os_error("stat", path_, errno);
    return static_cast<std::uint64_t>(sb.st_size);
  }

  Result<std::size_t> read_at(std::uint64_t offset, std::span<char> out) override {
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return os_error("read", path_, errno);
      }
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    return done;
  }

 private:
  std::string path_;
  int fd_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Result<OpenedFile> open_writable(const std::string& path) override {
    // O_EXCL first, so that `created` is exact even when two open at once.
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return os_error("open", path, errno);
    return OpenedFile{std::make_unique<PosixWritableFile>(path, fd), created};
  }

  Result<bool> make_directory(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) == 0) return true;
    const int err = errno;
    struct stat sb {};
    if (err == EEXIST && ::stat(path.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) return false;
    return os_error("mkdir", path, err == EEXIST ? ENOTDIR : err);
  }

  Status sync_dir(const std::string& path) override {
    const int dfd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return os_error("open folder", path, errno);
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (rc != 0) return os_error("sync folder", path, err);
    return Status::ok_status();
  }
};

}  // namespace

std::shared_ptr<FileSystem> posix_file_system() {
  static const std::shared_ptr<FileSystem> fs = std::make_shared<PosixFileSystem>();
  return fs;
}

std::string parent_directory(const std::string& path) {
  const std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  std::filesystem::path parent = p.has_filename() ? p.parent_path() : p.parent_path().parent_path();
  if (parent.empty()) return ".";
  return parent.string();
}

Status create_directories_durably(FileSystem& fs, const std::string& path) {
  // The missing folders, deepest first, then created from the top down.
  std::vector<std::string> chain;
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" -> "a/b"
  std::error_code ec;
  while (!p.empty() && p != p.root_path() && p != "." && !std::filesystem::is_directory(p, ec)) {
    chain.push_back(p.string());
    p = p.parent_path();
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    auto made = fs.make_directory(*it);
    if (!made.ok()) return made.error();
    if (*made) (void)fs.sync_dir(parent_directory(*it));  // best effort, see the header
  }
  return Status::ok_status();
}

}  // namespace shardline
