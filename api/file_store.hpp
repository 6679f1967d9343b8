#pragma once
/// \file
/// The OpenAI Files API's storage (docs/http.md): uploaded files and batch
/// output files, each a content file `<id>.data` plus a metadata file
/// `<id>.json` under one folder (`--data-dir`/api/files). Metadata is written
/// to a temporary name, synced and renamed, so a crash leaves either the old
/// state or the new one; a content file without metadata is garbage and is
/// deleted at open. Thread-safe.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/file_system.hpp"
#include "common/result.hpp"

namespace shardline::api {

/// The OpenAI `file` object's fields.
struct FileInfo {
  std::string id;         ///< "file-" + 24 hex digits
  std::uint64_t bytes = 0;
  std::int64_t created_at = 0;  ///< unix seconds
  std::string filename;
  std::string purpose;    ///< "batch" (uploads), "batch_output" (batch results)
};

class FileStore {
 public:
  /// Opens (creates) the folder and loads the metadata of every file in it.
  /// Errors: io (cannot create or read the folder), corrupt (a metadata file
  /// that does not parse: named).
  [[nodiscard]] static Result<std::unique_ptr<FileStore>> open(const std::filesystem::path& dir);

  /// A new file being written: append its bytes with `write`, then `commit`
  /// (or drop the writer: the partial content is deleted).
  class Writer {
   public:
    Writer(Writer&&) noexcept;
    Writer& operator=(Writer&&) noexcept;
    ~Writer();
    /// Appends. Errors: io; out_of_memory when the file would exceed the
    /// store's size limit (the writer is then unusable).
    [[nodiscard]] Status write(std::string_view data);
    /// Syncs the content, records the metadata and returns the file.
    /// Errors: io.
    [[nodiscard]] Result<FileInfo> commit();
    [[nodiscard]] std::uint64_t bytes() const { return info_.bytes; }

   private:
    friend class FileStore;
    Writer(FileStore* store, FileInfo info, std::unique_ptr<WritableFile> out, std::uint64_t max_bytes);
    void discard();
    FileStore* store_ = nullptr;
    FileInfo info_;
    std::unique_ptr<WritableFile> out_;
    std::uint64_t max_bytes_ = 0;
  };

  /// Starts a file. `max_bytes` = 0: no limit. Errors: io.
  [[nodiscard]] Result<Writer> create(std::string filename, std::string purpose, std::uint64_t max_bytes = 0);

  [[nodiscard]] std::optional<FileInfo> get(const std::string& id) const;
  /// Every file, newest first (created_at, then id, descending).
  [[nodiscard]] std::vector<FileInfo> list() const;
  /// Where a file's content is (read it with plain file I/O).
  [[nodiscard]] std::filesystem::path content_path(const std::string& id) const;
  /// Deletes a file. Errors: not_found, io.
  [[nodiscard]] Status remove(const std::string& id);

 private:
  explicit FileStore(std::filesystem::path dir) : dir_(std::move(dir)) {}
  [[nodiscard]] Status write_metadata(const FileInfo& info);
  std::filesystem::path dir_;
  mutable std::mutex mu_;
  std::map<std::string, FileInfo> files_;
};

/// "prefix" + 24 random hex digits (from std::random_device).
[[nodiscard]] std::string random_id(std::string_view prefix);

/// Writes `text` to `path` durably: a temporary file, fsync, rename, fsync
/// of the folder. Errors: io.
[[nodiscard]] Status write_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace shardline::api
