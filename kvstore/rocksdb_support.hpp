#pragma once
/// \file
/// What every RocksDB database of Shardline (the KV store, jobs.db) needs to
/// live through a full disk (issue 46, items 7 and 8):
///
///  - rocksdb_error(): a failed call as an Error, with the code a caller acts
///    on: disk_full for ENOSPC (Status::IsNoSpace()), corrupt for a damaged
///    file, io for anything else.
///  - ReopenableDb: a database that a failed write does not stop for good.
///    RocksDB 7.8 then holds a background error that DB::Resume() does not
///    clear for a failed WAL append ("Resource busy", measured on a 2 MiB
///    tmpfs), so it is closed and opened again once probe_free_space()
///    finds room (the open replays the WAL up to the failed record).
///  - open_info_log(): RocksDB's own LOG file, written by a logger that
///    never stops the process. Debian's librocksdb 7.8 is built with
///    assertions, and its default logger aborts on the write after a failed
///    one (WritableFileWriter::AssertFalseAndGetStatusForPrevError): a full
///    disk killed the node that way, and again at every restart.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.hpp"

namespace rocksdb {
class DB;
class Env;
class Logger;
class Status;
struct Options;
}  // namespace rocksdb

namespace shardline::kvstore {

/// `st` (not ok) as an Error "<what>: <RocksDB's text>": disk_full when the
/// disk has no space, corrupt when a file is damaged, else io.
[[nodiscard]] Error rocksdb_error(const std::string& what, const rocksdb::Status& st);

/// True when a write that failed with `st` stops the database's writes
/// until it is reopened: an I/O error of any kind (no space, EIO, a failed
/// sync). False for an ok status and for refusals that change nothing
/// (invalid argument, busy, not found).
[[nodiscard]] bool stops_writes(const rocksdb::Status& st);

/// Whether the disk under `dir` has room again: writes a probe file of
/// `bytes` bytes there through `env`'s file system, syncs it and deletes it
/// (leaving nothing behind). The owner of a database that a full disk
/// stopped probes before closing it to reopen: while the probe fails, the
/// open database keeps serving reads. Errors: disk_full, io.
[[nodiscard]] Status probe_free_space(rocksdb::Env& env, const std::string& dir, std::size_t bytes);
inline constexpr std::size_t kReopenProbeBytes = 1u << 20;

/// A logger for rocksdb::Options::info_log that writes RocksDB's messages
/// (INFO and above) to `dir`/LOG, moving an earlier LOG to LOG.old first
/// (one is kept; a LOG past 4 MiB is moved there too). It opens the file at the first message that finds `dir`
/// (RocksDB creates it in DB::Open). Failed writes are dropped, never
/// retried into an abort; when the file cannot be created (no space) the
/// messages are dropped.
[[nodiscard]] std::shared_ptr<rocksdb::Logger> open_info_log(const std::string& dir);

/// One RocksDB database that lives through a full disk: after a write that
/// stopped it (write_failed(), stops_writes()), the next writable() closes
/// it and opens it again with the same options once probe_free_space()
/// finds room; until then it keeps serving reads. Used by the KV store and
/// jobs.db. The Env in the options must outlive it. Not thread-safe: the
/// owner serializes calls.
class ReopenableDb {
 public:
  ReopenableDb();  ///< closed: every call reopens (fails: nothing to open)
  ~ReopenableDb();
  ReopenableDb(ReopenableDb&&) noexcept;
  ReopenableDb& operator=(ReopenableDb&&) noexcept;

  /// Opens `dir` with `options`, its info_log set to open_info_log(dir).
  /// `name` starts every error message ("job store"); while the database
  /// is stopped, free space is probed at most every `probe_interval`
  /// (writes in between get the last error at once). Errors: those of
  /// rocksdb_error() ("<name>: open <dir>: ...").
  [[nodiscard]] static Result<ReopenableDb> open(std::string name, std::string dir, rocksdb::Options options,
                                                 std::chrono::milliseconds probe_interval);

  /// The open database (null after a failed reopen: call readable() or
  /// writable() first).
  [[nodiscard]] rocksdb::DB* operator->() const noexcept { return db_.get(); }
  [[nodiscard]] rocksdb::DB* get() const noexcept { return db_.get(); }

  /// Open and taking writes: reopens a stopped database once the disk has
  /// room. Errors: the probe's (disk_full while the disk is full; the
  /// database stays open for reads), the open's (it is then closed, and the
  /// next call tries again).
  [[nodiscard]] Status writable();
  /// Open, for a read: a stopped database still serves reads, so it is
  /// reopened only when a failed reopen closed it. Errors: as writable().
  [[nodiscard]] Status readable();
  /// The error of a failed write "<name>: <what>: ..."; one that stops
  /// RocksDB's writes makes the next writable() reopen the database.
  [[nodiscard]] Error write_failed(const std::string& what, const rocksdb::Status& st);
  /// rocksdb_error() of a failed call, "<name>: <what>: ...".
  [[nodiscard]] Error error(const std::string& what, const rocksdb::Status& st) const;

  /// Times the database was closed and opened again after a failed write.
  [[nodiscard]] std::uint64_t reopens() const noexcept { return reopens_; }

 private:
  std::string name_;
  std::string dir_;
  std::unique_ptr<rocksdb::Options> options_;  ///< what db_ was opened with (destroyed after db_)
  std::unique_ptr<rocksdb::DB> db_;
  std::chrono::milliseconds probe_interval_{0};
  bool reopen_ = false;  ///< a write stopped db_: reopen before the next write
  Error stopped_;        ///< why (returned to writes until the next probe)
  std::chrono::steady_clock::time_point next_probe_{};
  std::uint64_t reopens_ = 0;
};

}  // namespace shardline::kvstore
