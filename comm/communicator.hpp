#pragma once
/// \file
/// The communicator: one rank's handle on a group of `world_size()` ranks that
/// move bulk data (activations, KV chunks, weight tiles) between each other.
/// Backends: in-process shared memory (comm/inproc.hpp), TCP sockets between
/// processes and hosts (comm/tcp.hpp), NCCL on GPUs (comm/nccl.hpp, CUDA
/// builds only), and sub-groups of any of them (comm/subgroup.hpp). A
/// decorator, comm/paced.hpp, paces gets and sends to an emulated link.
///
/// Conventions shared by every backend:
///  - Every call returns a Status; nothing throws. A missing or dead peer
///    becomes an `ErrorCode::io` Error within the communicator's timeout
///    (set_timeout), never a hang. The message names the op, this rank and the
///    peer at fault, e.g. "all_reduce_sum: rank 0 timed out after 200 ms
///    waiting for rank 3".
///  - Collectives (barrier, all_reduce_sum, all_gather, reduce_scatter_sum,
///    all_to_all, broadcast) must be called by every rank of the group, in the
///    same order, with the same `count` (and `root`). Ranks that disagree all
///    get `invalid_argument` (and the group stays usable).
///  - A collective that failed with io (timeout, dead peer): in the in-process
///    backend it was performed on no rank (all-or-nothing) and may be retried.
///    Over a network (TCP, NCCL, sub-groups of those) that cannot be
///    guaranteed: the failed collective may have completed on some ranks, so
///    the group is poisoned — every later collective fails with io at once —
///    and must be rebuilt. See each backend's header.
///  - Buffers are F32 and row-major; `count` is in elements. Shapes are given
///    as [rows, cols]; `world` is world_size().
///  - Reductions are deterministic: every element is summed in rank order,
///    ((x_0 + x_1) + x_2) + ... + x_{world-1}, whatever order ranks arrive in,
///    so results are bit-identical on every rank and across runs. (Exception:
///    NCCL, whose reductions follow its ring/tree order; see comm/nccl.hpp.)
///  - A communicator object is used by one thread at a time (its rank's).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/result.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace shardline::comm {

/// Timeout a communicator starts with.
inline constexpr std::chrono::milliseconds kDefaultTimeout{60'000};

class Communicator {
 public:
  virtual ~Communicator() = default;

  /// True when the buffers of every call are device pointers (CUDA
  /// memory: NCCL, the in-process device communicator of
  /// model/cuda/inproc_device_comm.hpp); false for host memory. A runner
  /// checks its communicators against where its tensors live.
  [[nodiscard]] virtual bool on_device() const noexcept { return false; }

  // ---- stream order (device communicators) -----------------------------------
  // By default a device communicator's call reads its buffers once the
  // caller's writes are complete (the caller synchronises its stream first)
  // and returns when its results are in place. Bound to the caller's CUDA
  // stream, a call instead queues its work on that stream, behind the work
  // already queued there, and returns without waiting for the device
  // (NCCL's model: ncclAllReduce(..., stream)): the caller's later kernels
  // on the stream see the results, and no host synchronisation is needed.

  /// Orders the following calls on `stream` (a cudaStream_t of this rank's
  /// device). Errors: unsupported (host communicators; the default),
  /// invalid_argument (already bound to another stream, a null stream),
  /// io (the CUDA events cannot be made).
  [[nodiscard]] virtual Status bind_stream(CUstream_st* /*stream*/) {
    return make_error(ErrorCode::unsupported, "communicator: no stream order");
  }
  /// True when the collectives (barrier aside) are ordered on the bound stream.
  [[nodiscard]] virtual bool collectives_in_stream_order() const noexcept { return false; }
  /// True when send / recv are ordered on the bound stream too.
  [[nodiscard]] virtual bool point_to_point_in_stream_order() const noexcept { return false; }
  /// Waits until the bound stream's work is done, bounded by the timeout (a
  /// dead peer fails it with io instead of hanging the caller's stream).
  /// ok when nothing is bound. Errors: io.
  [[nodiscard]] virtual Status wait_stream() { return {}; }

  /// This rank, in [0, world_size()).
  [[nodiscard]] virtual int rank() const noexcept = 0;
  [[nodiscard]] virtual int world_size() const noexcept = 0;

  /// How long one call may wait for a peer before it fails with io.
  /// Non-positive values are clamped to 1 ms.
  virtual void set_timeout(std::chrono::milliseconds timeout) noexcept = 0;
  [[nodiscard]] virtual std::chrono::milliseconds timeout() const noexcept = 0;

  // ---- collectives -------------------------------------------------------

  /// Returns once every rank has entered the barrier.
  [[nodiscard]] virtual Status barrier() = 0;

  /// In place: data[count] <- sum over ranks of data[count] (rank order).
  [[nodiscard]] virtual Status all_reduce_sum(float* data, std::size_t count) = 0;

  /// send[count] from every rank -> recv[world, count], row k = rank k's send.
  /// In place is allowed: send == recv + rank() * count.
  [[nodiscard]] virtual Status all_gather(const float* send, std::size_t count,
                                          float* recv) = 0;

  /// send[world, count] on every rank -> recv[count] on rank r =
  /// sum over ranks k of row r of rank k's send (rank order).
  /// In place is allowed: recv == send + rank() * count.
  [[nodiscard]] virtual Status reduce_scatter_sum(const float* send, float* recv,
                                                  std::size_t count) = 0;

  /// send[world, count] -> recv[world, count]: row k of rank r's recv =
  /// row r of rank k's send. send and recv must not overlap.
  [[nodiscard]] virtual Status all_to_all(const float* send, float* recv,
                                          std::size_t count) = 0;

  /// data[count] of rank `root` is copied into data[count] of every rank.
  [[nodiscard]] virtual Status broadcast(float* data, std::size_t count, int root) = 0;

  // ---- point to point ----------------------------------------------------

  /// Sends `bytes` bytes to `peer` under `tag`. Does not wait for the matching
  /// recv (the backend buffers the message or writes straight into a recv
  /// that is already posted), so sends and recvs may be issued in any order.
  /// Messages from one sender with one tag arrive in the order sent.
  [[nodiscard]] virtual Status send(const void* data, std::size_t bytes, int peer,
                                    int tag) = 0;

  /// Receives the next message from `peer` with `tag` into data[bytes]; waits
  /// up to the timeout. The message must be exactly `bytes` long: otherwise
  /// this recv fails with mismatch and the message stays queued for a later
  /// recv of the right size (send still succeeds). Messages sent before the
  /// peer died are still delivered.
  [[nodiscard]] virtual Status recv(void* data, std::size_t bytes, int peer,
                                    int tag) = 0;

  // ---- one-sided ---------------------------------------------------------

  /// Makes data[bytes] readable by every rank under `name` (replacing an
  /// earlier region of that name). The memory must stay valid until
  /// unexpose(name) returns or the group goes away. Expose before the peers
  /// get (e.g. expose, then barrier()).
  [[nodiscard]] virtual Status expose(std::string name, const void* data,
                                      std::size_t bytes) = 0;

  /// Withdraws a region; waits for gets in flight on it. not_found if absent.
  [[nodiscard]] virtual Status unexpose(const std::string& name) = 0;

  /// Copies bytes [offset, offset + bytes) of the region `name` exposed by
  /// `peer` into dst[bytes]. not_found when `peer` exposes no such region,
  /// invalid_argument when the range is outside it, io when `peer` is dead.
  [[nodiscard]] virtual Status get(int peer, std::string name, std::size_t offset,
                                   void* dst, std::size_t bytes) = 0;

  // ---- accounting --------------------------------------------------------

  /// Payload bytes this rank has sent to other ranks since the communicator
  /// was made (monotonic; frame headers and handshakes not included): send()
  /// payloads, the bytes of get() answered from this rank's exposed regions,
  /// and the share of each collective that leaves this rank in a direct
  /// exchange (all_gather, all_to_all, reduce_scatter_sum: (world-1) * count
  /// * 4 bytes; broadcast: that much on the root, 0 elsewhere; all_reduce_sum:
  /// (count - slice) * 4 + (world-1) * slice * 4, slice = this rank's share
  /// of count / world). Backends that cannot tell return 0.
  [[nodiscard]] virtual std::uint64_t bytes_sent() const noexcept { return 0; }
};

}  // namespace shardline::comm
