#pragma once
/// \file
/// In-process communicator backend: the ranks of a group are threads of one
/// process sharing memory (CPU devices). One shared state guarded by a mutex
/// and condition variables; collectives use two generation-counted barriers
/// (post buffers -> all posted; work -> all done) and are zero-copy: between
/// the barriers each rank reads its peers' posted buffers directly, and the
/// reduction work is split across the ranks (rank r reduces slice r of the
/// elements and writes the result into every rank's buffer).
///
///   auto group = InProcGroup::create(4).value();
///   // in thread r:
///   auto comm = group->communicator(r).value();
///   Status st = comm->all_reduce_sum(buf, n);
///
/// Point to point: send writes straight into a recv that is already posted,
/// otherwise it queues a copy. One-sided get copies from the exposer's memory.
/// `mark_dead(rank)` (alias `abort(rank)`) simulates a dead peer: every call
/// waiting on it, and every later call that needs it, fails with io at once.

#include <chrono>
#include <memory>
#include <utility>

#include "comm/communicator.hpp"
#include "common/result.hpp"

namespace shardline::comm {

class InProcGroup {
 public:
  /// A group of `world_size` ranks (>= 1); invalid_argument otherwise.
  [[nodiscard]] static Result<std::shared_ptr<InProcGroup>> create(int world_size);

  [[nodiscard]] int world_size() const noexcept;

  /// The communicator of `rank`; each rank can be taken once. The
  /// communicator keeps the group's shared state alive.
  /// Errors: invalid_argument (rank out of range or already taken).
  [[nodiscard]] Result<std::unique_ptr<Communicator>> communicator(int rank);

  /// Marks `rank` dead: its blocked peers (and the rank itself) wake with an io
  /// error; later collectives, sends to it, recvs from it (once its queued
  /// messages are drained) and gets from it fail with io. Irreversible.
  [[nodiscard]] Status mark_dead(int rank);
  [[nodiscard]] Status abort(int rank) { return mark_dead(rank); }
  [[nodiscard]] bool is_dead(int rank) const;

  struct Impl;  // shared state (comm/inproc.cpp)

 private:
  explicit InProcGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace shardline::comm
