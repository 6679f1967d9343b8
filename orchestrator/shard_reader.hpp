#pragma once
/// \file
/// Reads a job's input lines from its JSONL shards, in order, without ever
/// holding more than one line: 64 KiB blocks, blank lines skipped, a line
/// longer than the limit skipped over (not kept), CRLF accepted. Line
/// indexes count the non-blank lines over all shards, from 0.
///
/// A LineIndex remembers where every LineIndex::kStride-th line starts (a
/// sparse index: 24 bytes per 1,024 lines). Every reader given one records
/// the checkpoints it passes, so a job's lines are located after one read
/// of its shards: seek_near() jumps to the checkpoint at or before a line,
/// and at most kStride - 1 lines are read to reach it (claim_in_flight's
/// lines ahead of the job's reader, for example), instead of reading the
/// shards again from their start.

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "common/result.hpp"

namespace shardline::orchestrator {

/// Where line `i * kStride` of a job starts: its shard, the byte offset of
/// its first raw line (or of blank lines before it) and the 1-based line
/// number in the shard of the raw line before that offset.
struct LineCheckpoint {
  std::size_t shard = 0;
  std::uint64_t byte_offset = 0;
  std::uint64_t file_line = 0;
};

struct LineIndex {
  static constexpr std::uint64_t kStride = 1024;
  std::vector<LineCheckpoint> checkpoints;  ///< [i]: where line i * kStride starts
};

class ShardReader {
 public:
  /// `index`: where to record checkpoints and to seek from (not owned; it
  /// must outlive the reader); null = none. `max_line_bytes` 0: no limit.
  ShardReader(std::vector<std::string> paths, std::uint64_t max_line_bytes, LineIndex* index = nullptr);

  /// Next non-blank line into `line` (its index is next_index() - 1); false
  /// at the end. A too-long line counts as non-blank: too_long() is true
  /// and `line` is empty. Errors: not_found (a shard cannot be opened), io
  /// (a read error).
  [[nodiscard]] Result<bool> next(std::string& line);
  /// Makes line `line_index` near: goes to the recorded checkpoint at or
  /// before it (the start of the shards when none is recorded) unless
  /// reading on from here reaches it as soon. Then next() reaches it in at
  /// most LineIndex::kStride calls when its checkpoint is recorded.
  /// Errors: not_found (the shard cannot be opened).
  [[nodiscard]] Status seek_near(std::uint64_t line_index);

  /// Makes line `line_index`, which starts at `where` (last_line_start() of
  /// an earlier read), the next one next() reads: a prefix-ordered job's
  /// lines are read in their order, each where it starts. Errors: not_found
  /// (the shard cannot be opened), invalid_argument (no such shard).
  [[nodiscard]] Status seek_to(std::uint64_t line_index, const LineCheckpoint& where);
  /// Where the last line read starts (its shard, byte offset, and the
  /// 1-based number of the raw line before it).
  [[nodiscard]] const LineCheckpoint& last_line_start() const noexcept { return last_start_; }

  /// Index of the next non-blank line.
  [[nodiscard]] std::uint64_t next_index() const noexcept { return next_index_; }
  /// 1-based line number in its shard of the last line read.
  [[nodiscard]] std::uint64_t file_line() const noexcept { return file_line_; }
  /// Full length of the last line read (without its '\r\n').
  [[nodiscard]] std::uint64_t line_bytes() const noexcept { return line_bytes_; }
  /// The last line read is longer than max_line_bytes: `line` holds none of it.
  [[nodiscard]] bool too_long() const noexcept { return too_long_; }
  [[nodiscard]] std::uint64_t max_line_bytes() const noexcept { return max_line_bytes_; }
  /// Every shard was read (or stop() was called).
  [[nodiscard]] bool done() const noexcept { return done_; }
  /// Reads nothing more (the shards grew past the job's line count).
  void stop() noexcept { done_ = true; }
  /// The shard of the last line read, and its position in the list.
  [[nodiscard]] const std::string& shard_path() const { return paths_[shard_]; }
  [[nodiscard]] std::size_t shard() const noexcept { return shard_; }
  /// Raw lines (blank ones included) read so far: what seeking saves.
  [[nodiscard]] std::uint64_t raw_lines_read() const noexcept { return raw_lines_read_; }

 private:
  /// One raw line of the open shard (kept up to the limit); false at its end.
  bool read_line(std::string& line);
  /// Reads `shard` from `byte_offset` on: a seek when it is the shard open
  /// now, else an open. Errors: not_found.
  [[nodiscard]] Status open_shard(std::size_t shard, std::uint64_t byte_offset);

  std::vector<std::string> paths_;
  std::uint64_t max_line_bytes_ = 0;
  LineIndex* index_ = nullptr;
  std::size_t shard_ = 0;
  std::ifstream in_;
  std::string block_;              ///< read from `in_`, not yet consumed from block_pos_
  std::size_t block_pos_ = 0;
  std::uint64_t block_offset_ = 0;  ///< byte offset in the shard of block_[0]
  std::uint64_t next_index_ = 0;
  std::uint64_t file_line_ = 0;
  std::uint64_t line_bytes_ = 0;
  std::uint64_t raw_lines_read_ = 0;
  LineCheckpoint last_start_;
  bool too_long_ = false;
  bool done_ = false;
};

}  // namespace shardline::orchestrator
