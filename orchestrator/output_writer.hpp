#pragma once
/// \file
/// Exactly-once, crash-safe output file of one job.
///
/// Results are committed to the JobStore in any order; the writer appends the
/// contiguous committed prefix (lines next_line, next_line+1, ...) to the
/// file, each followed by '\n', fdatasync()s it, and only then records
/// {offset, next_line} in the store (synchronous write). On open the file is
/// truncated to the recorded offset, dropping a torn or unacknowledged tail;
/// the dropped lines are still committed in the store and are written again,
/// byte for byte the same. So after any crash and restart the finished file
/// holds every line exactly once, identical to an uninterrupted run. If the
/// file is shorter than the recorded offset (deleted or truncated by someone
/// else), or its first offset bytes no longer have the checksum recorded
/// with it (OutputProgress::prefix_checksum: a line edited since), it is
/// rewritten from line 0 out of the store.
///
/// All file I/O goes through a FileSystem (common/file_system.hpp): missing
/// folders are created durably (each one's parent synced), a new file's folder
/// is synced, and every append is synced before its progress is recorded.
/// tests/orchestrator/unsynced_writes_fault_test.cpp checks this against a
/// file system that drops unsynced writes at a simulated crash.

#include <cstdint>
#include <memory>
#include <string>

#include "common/file_system.hpp"
#include "common/result.hpp"
#include "orchestrator/job_store.hpp"

namespace shardline::orchestrator {

class OutputWriter {
 public:
  /// Opens (creating it and its folder if missing) the output file of a job
  /// with `total_lines` lines and recovers it (see recover()). `store` must
  /// outlive the writer. `fs`: the file system to write through; null:
  /// posix_file_system(). Errors: io (from the file system or the store).
  static Result<std::unique_ptr<OutputWriter>> open(JobStore& store, std::uint64_t job_id,
                                                    std::string path, std::uint64_t total_lines,
                                                    std::shared_ptr<FileSystem> fs = nullptr);
  ~OutputWriter();
  OutputWriter(const OutputWriter&) = delete;
  OutputWriter& operator=(const OutputWriter&) = delete;

  /// Truncates the file to the durably recorded offset and syncs it.
  /// Rewinds to line 0 (the file is rewritten from the store) when the file
  /// is shorter than that offset or its first `offset` bytes are not what
  /// was written (their checksum, OutputProgress::prefix_checksum, differs:
  /// an edited or damaged line). Called by open().
  Status recover();

  /// How many times recover() rewound to line 0 in this writer.
  [[nodiscard]] int rebuilds() const noexcept { return rebuilds_; }

  /// Appends every committed line from next_line() on that is contiguous,
  /// syncs, records the progress. Returns the number of lines appended.
  Result<std::uint64_t> advance();

  /// A cancelled job's file: appends every committed line from next_line()
  /// on, in line order, skipping the lines that have no result, and then
  /// records next_line() = total_lines (so complete() holds and a later
  /// open() leaves the file as it is). Crash-safe as advance(): each chunk
  /// is synced before its progress is recorded (next_line = the chunk's
  /// last line + 1), and a rerun after a crash appends the same bytes.
  /// Results committed after it are not written. Returns the lines appended.
  Result<std::uint64_t> finish_partial();

  [[nodiscard]] std::uint64_t next_line() const noexcept { return progress_.next_line; }
  [[nodiscard]] std::uint64_t offset() const noexcept { return progress_.offset; }
  [[nodiscard]] std::uint64_t total_lines() const noexcept { return total_lines_; }
  [[nodiscard]] bool complete() const noexcept { return progress_.next_line >= total_lines_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  OutputWriter(JobStore& store, std::uint64_t job_id, std::string path, std::uint64_t total_lines,
               std::shared_ptr<FileSystem> fs, std::unique_ptr<WritableFile> file);
  /// Writes `buf` at the recorded offset, syncs, then records
  /// {offset + size, next_line}.
  Status flush(const std::string& buf, std::uint64_t next_line);
  /// fnv1a64 of the file's first `bytes` bytes (fewer if it is shorter).
  Result<std::uint64_t> prefix_checksum(std::uint64_t bytes);

  JobStore& store_;
  std::uint64_t job_id_;
  std::string path_;
  std::uint64_t total_lines_;
  std::shared_ptr<FileSystem> fs_;
  std::unique_ptr<WritableFile> file_;
  OutputProgress progress_;
  bool dirty_ = false;  ///< a write failed: bytes past offset may be garbage
  int rebuilds_ = 0;
};

}  // namespace shardline::orchestrator
