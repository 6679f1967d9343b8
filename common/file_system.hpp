#pragma once
/// \file
/// A small file-system seam for code that must make its writes durable (the
/// orchestrator's output files and state folder). posix_file_system() is the
/// real one; tests put a fault-injecting one in its place
/// (tests/support/fault_injection_fs.hpp) that, at a simulated crash, drops
/// every write not yet synced, in the spirit of RocksDB's
/// FaultInjectionTestFS.
///
/// Durability contract (POSIX, and what the fault-injecting one enforces):
///  - bytes written with WritableFile::write_at() and a size set with
///    WritableFile::truncate() survive a crash only once
///    WritableFile::sync() has returned;
///  - a name created in a folder (a file by open_writable(), a folder by
///    make_directory()) survives a crash only once that folder has been
///    synced with sync_dir().
/// The durability logic itself (which sync after which write) lives above
/// this seam, in the callers and in create_directories_durably(), so that a
/// fault-injecting file system can check it.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/result.hpp"

namespace shardline {

/// A file open for writing (and reading back what is in it).
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  /// Writes all of `data` at byte `offset` (short writes and EINTR are
  /// retried). Errors: disk_full (ENOSPC, EDQUOT), io.
  [[nodiscard]] virtual Status write_at(std::uint64_t offset, std::string_view data) = 0;
  /// Sets the size to `size` bytes (cutting or zero-extending). Errors:
  /// disk_full, io.
  [[nodiscard]] virtual Status truncate(std::uint64_t size) = 0;
  /// Makes the data and the size durable (fdatasync). Errors: disk_full
  /// (a delayed allocation found no space), io.
  [[nodiscard]] virtual Status sync() = 0;
  /// The current size in bytes. Errors: io.
  [[nodiscard]] virtual Result<std::uint64_t> size() = 0;
  /// Reads up to out.size() bytes at byte `offset` into `out` (EINTR and
  /// short reads retried); returns how many were read, fewer only at the
  /// end of the file. Errors: io.
  [[nodiscard]] virtual Result<std::size_t> read_at(std::uint64_t offset, std::span<char> out) = 0;
};

/// What FileSystem::open_writable() returns.
struct OpenedFile {
  std::unique_ptr<WritableFile> file;
  bool created = false;  ///< this call created the file (its name is not durable yet)
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  /// Opens `path` for writing (and reading back), creating it (mode 0644)
  /// when missing; never truncates. Errors: io (no such folder, not a regular file, no permission).
  [[nodiscard]] virtual Result<OpenedFile> open_writable(const std::string& path) = 0;
  /// Creates the one folder `path` (mode 0755; its parent must exist). Returns
  /// true when it created it, false when a folder of that name exists.
  /// Errors: io (the name is a file, the parent is missing, no permission).
  [[nodiscard]] virtual Result<bool> make_directory(const std::string& path) = 0;
  /// fsync of the folder `path`: makes the names created in it durable.
  /// Errors: io.
  [[nodiscard]] virtual Status sync_dir(const std::string& path) = 0;
};

/// The real file system (POSIX calls); one shared, stateless instance. Every
/// call that fails with ENOSPC or EDQUOT returns ErrorCode::disk_full, any
/// other failure io.
[[nodiscard]] std::shared_ptr<FileSystem> posix_file_system();

/// The folder holding `path` ("." for a bare name, "/" for "/x").
[[nodiscard]] std::string parent_directory(const std::string& path);

/// Creates the folder `path` and its missing parents so that they survive a
/// crash: after making each folder it syncs the folder holding it. Folders
/// that exist are left alone. A failed folder sync is ignored (some file
/// systems cannot sync a folder), as in OutputWriter. Errors: io (from
/// make_directory()).
[[nodiscard]] Status create_directories_durably(FileSystem& fs, const std::string& path);

}  // namespace shardline
