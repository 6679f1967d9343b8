#pragma once
// A disk that can be full, for the disk-full tests (issue 46, items 7 and 8):
// while DiskSpace::full is set, every write that needs space fails the way a
// full disk fails it (ENOSPC):
//  - FullDiskFileSystem (Shardline's FileSystem seam: output files, the data
//    dir's folders): write_at, a truncate that grows, sync, creating a file
//    or a folder return ErrorCode::disk_full;
//  - FullDiskRocksDbFs (RocksDB's, for jobs.db and the KV store): creating a
//    file, Append, PositionedAppend, Flush, Sync, Fsync, RangeSync and
//    Allocate return IOStatus::NoSpace.
// Reads, deletes, renames and shrinking truncates still work, as on a real
// full disk. Clearing `full` is freeing space.

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>
#include <memory>
#include <string>

#include <rocksdb/file_system.h>
#include <rocksdb/io_status.h>

#include "common/file_system.hpp"
#include "common/result.hpp"

namespace shardline::testing_support {

/// The switch both file systems read; `writes_refused` counts what it refused.
struct DiskSpace {
  std::atomic<bool> full{false};
  std::atomic<int> writes_refused{0};

  [[nodiscard]] bool refuse() {
    if (!full.load()) return false;
    ++writes_refused;
    return true;
  }
};

class FullDiskFileSystem final : public FileSystem {
 public:
  explicit FullDiskFileSystem(std::shared_ptr<DiskSpace> space, std::shared_ptr<FileSystem> base = posix_file_system())
      : space_(std::move(space)), base_(std::move(base)) {}

  Result<OpenedFile> open_writable(const std::string& path) override {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec) && space_->refuse()) return no_space("open", path);
    auto opened = base_->open_writable(path);
    if (!opened.ok()) return opened;
    return OpenedFile{std::make_unique<File>(space_, path, std::move(opened->file)), opened->created};
  }
  Result<bool> make_directory(const std::string& path) override {
    std::error_code ec;
    if (!std::filesystem::is_directory(path, ec) && space_->refuse()) return no_space("mkdir", path);
    return base_->make_directory(path);
  }
  Status sync_dir(const std::string& path) override { return base_->sync_dir(path); }

  static Error no_space(const std::string& what, const std::string& path) {
    return make_error(ErrorCode::disk_full, what + " " + path + ": No space left on device (simulated)");
  }

 private:
  class File final : public WritableFile {
   public:
    File(std::shared_ptr<DiskSpace> space, std::string path, std::unique_ptr<WritableFile> base)
        : space_(std::move(space)), path_(std::move(path)), base_(std::move(base)) {}
    Status write_at(std::uint64_t offset, std::string_view data) override {
      if (!data.empty() && space_->refuse()) return no_space("write", path_);
      return base_->write_at(offset, data);
    }
    Status truncate(std::uint64_t size) override {
      auto now = base_->size();
      if (now.ok() && size > *now && space_->refuse()) return no_space("truncate", path_);
      return base_->truncate(size);
    }
    Status sync() override {
      if (space_->refuse()) return no_space("sync", path_);
      return base_->sync();
    }
    Result<std::uint64_t> size() override { return base_->size(); }
    Result<std::size_t> read_at(std::uint64_t offset, std::span<char> out) override {
      return base_->read_at(offset, out);
    }

   private:
    std::shared_ptr<DiskSpace> space_;
    std::string path_;
    std::unique_ptr<WritableFile> base_;
  };

  std::shared_ptr<DiskSpace> space_;
  std::shared_ptr<FileSystem> base_;
};

class FullDiskRocksDbFs final : public rocksdb::FileSystemWrapper {
 public:
  explicit FullDiskRocksDbFs(std::shared_ptr<DiskSpace> space,
                             const std::shared_ptr<rocksdb::FileSystem>& base = rocksdb::FileSystem::Default())
      : rocksdb::FileSystemWrapper(base), space_(std::move(space)) {}

  const char* Name() const override { return "ShardlineFullDiskRocksDbFs"; }

  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    if (space_->refuse()) return no_space(fname);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus st = target()->NewWritableFile(fname, opts, &file, dbg);
    if (st.ok()) *result = std::make_unique<File>(space_, fname, std::move(file));
    return st;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus st = target()->ReopenWritableFile(fname, opts, &file, dbg);
    if (st.ok()) *result = std::make_unique<File>(space_, fname, std::move(file));
    return st;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string&, const std::string&, const rocksdb::FileOptions&,
                                      std::unique_ptr<rocksdb::FSWritableFile>*, rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("ReuseWritableFile (full-disk test file system)");
  }

  static rocksdb::IOStatus no_space(const std::string& fname) {
    return rocksdb::IOStatus::NoSpace("While appending to file: " + fname, "No space left on device (simulated)");
  }

 private:
  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::shared_ptr<DiskSpace> space, std::string fname, std::unique_ptr<rocksdb::FSWritableFile> base)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(base)), space_(std::move(space)), fname_(std::move(fname)) {}
    using rocksdb::FSWritableFileOwnerWrapper::Append;
    using rocksdb::FSWritableFileOwnerWrapper::PositionedAppend;
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->Append(data, options, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info, rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->Append(data, options, info, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset, const rocksdb::IOOptions& options,
                                       rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->PositionedAppend(data, offset, options, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset, const rocksdb::IOOptions& options,
                                       const rocksdb::DataVerificationInfo& info,
                                       rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->PositionedAppend(data, offset, options, info, dbg);
    }
    rocksdb::IOStatus Flush(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->Flush(options, dbg);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->Sync(options, dbg);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options, rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->Fsync(options, dbg);
    }
    rocksdb::IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const rocksdb::IOOptions& options,
                                rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->RangeSync(offset, nbytes, options, dbg);
    }
    rocksdb::IOStatus Allocate(uint64_t offset, uint64_t len, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override {
      if (space_->refuse()) return no_space(fname_);
      return target()->Allocate(offset, len, options, dbg);
    }

   private:
    std::shared_ptr<DiskSpace> space_;
    std::string fname_;
  };

  std::shared_ptr<DiskSpace> space_;
};

/// Runs `body` in a forked child, so that a file-size limit it sets and an
/// abort stay there; returns its waitpid status (-1: fork or wait failed).
/// The child exits with what `body` returns.
inline int status_of_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) ::_exit(body());
  int status = 0;
  return ::waitpid(pid, &status, 0) == pid ? status : -1;
}

/// In a child of status_of_child(): every file of the process stops growing
/// one byte past the current size of `file` (RLIMIT_FSIZE; a write past it
/// fails with EFBIG, SIGXFSZ ignored): as deterministic as a full disk, and
/// no mount needed. False when the limit could not be set.
inline bool stop_files_growing_past(const std::string& file) {
  ::signal(SIGXFSZ, SIG_IGN);
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) return false;
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(size + 1);
  return ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
}

}  // namespace shardline::testing_support
