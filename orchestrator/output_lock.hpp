#pragma once
/// \file
/// An exclusive, cross-process lock on a job's output file, held for as long
/// as the job writes it (issue 46, item 9: two `run`s with different
/// --data-dir and one --output both exited 0 with a torn line between them).
///
/// The lock is flock(LOCK_EX) on `OUTPUT.lock`, a file beside the output
/// that holds who took it ("job 3 of data dir /d (pid 123 on host h)"), so a
/// second writer's error names the holder. The kernel drops the lock when its
/// holder dies (kill -9 included): a stale lock file never blocks anyone. The
/// holder deletes the file on release; a taker that finds it replaced after
/// locking (a release raced it) takes the new one.

#include <memory>
#include <string>

#include "common/result.hpp"

namespace shardline::orchestrator {

class OutputLock {
 public:
  /// Takes the lock of `output_path` (its folder must exist) for `holder`, a
  /// description of the taker that a refused taker's error shows. Errors:
  /// invalid_argument (another open lock holds it: the message names the
  /// holder and the lock file), io (the lock file cannot be created).
  [[nodiscard]] static Result<std::unique_ptr<OutputLock>> acquire(const std::string& output_path,
                                                                   const std::string& holder);
  /// The lock file of `output_path`: output_path + ".lock".
  [[nodiscard]] static std::string lock_path(const std::string& output_path) { return output_path + ".lock"; }

  /// Rewrites the holder's description (e.g. once the job has an id).
  /// Best effort: the lock holds either way.
  void describe(const std::string& holder);

  /// Deletes the lock file and releases the lock.
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  /// "pid 123 on host h": how a holder names this process.
  [[nodiscard]] static std::string this_process();

 private:
  OutputLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;  ///< the lock file
};

}  // namespace shardline::orchestrator
