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
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
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

/// Copies a region's bytes from `src` (the exposer's memory at the asked
/// offset) to wherever the caller wants them.
using RegionCopy = std::function<Status(const void* src)>;

/// Communicator::get with the copy done by `copy` (e.g. a device-to-device
/// copy, when the exposed memory is a GPU's: model/cuda/inproc_device_comm),
/// under get's checks (not_found, invalid_argument for a range outside the
/// region, io for a dead rank) and its guarantee: the region stays exposed
/// (unexpose waits) until `copy` returns. `comm` must be a rank of an
/// InProcGroup (unsupported otherwise). Errors: get's, or copy's.
[[nodiscard]] Status inproc_get_with(Communicator& comm, int peer, std::string name, std::size_t offset,
                                     std::size_t bytes, const RegionCopy& copy);

}  // namespace shardline::comm
