#pragma once
/// \file
/// What every RocksDB database of Shardline (the KV store, jobs.db) needs to
/// live through a full disk (issue 46, items 7 and 8):
///
///  - rocksdb_error(): a failed call as an Error, with the code a caller acts
///    on: disk_full for ENOSPC (Status::IsNoSpace()), corrupt for a damaged
///    file, io for anything else.
///  - stops_writes(): whether a failed write left the database refusing
///    writes. RocksDB 7.8 then holds a background error that DB::Resume()
///    does not clear for a failed WAL append ("Resource busy", measured on
///    a 2 MiB tmpfs), so the owner closes the database and opens it again
///    once probe_free_space() finds room (the open replays the WAL up to
///    the failed record).
///  - open_info_log(): RocksDB's own LOG file, written by a logger that
///    never stops the process. Debian's librocksdb 7.8 is built with
///    assertions, and its default logger aborts on the write after a failed
///    one (WritableFileWriter::AssertFalseAndGetStatusForPrevError): a full
///    disk killed the node that way, and again at every restart.

#include <cstddef>
#include <memory>
#include <string>

#include "common/result.hpp"

namespace rocksdb {
class Env;
class Logger;
class Status;
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

}  // namespace shardline::kvstore
