#pragma once
/// \file
/// A comm::Communicator on DEVICE buffers for ranks that are threads of one
/// process sharing one GPU (issue 41 item 2: several ranks on one device,
/// which NCCL refuses; a lent GPU machine has one GPU). It wraps a host
/// communicator of the same ranks (an InProcGroup's): that one carries the
/// buffer addresses and the barriers; the data moves as device-to-device
/// copies and rank-order adds (kernels::cuda::add_inplace) on this
/// communicator's own stream, or on the caller's once bound to it (below).
///
/// Numerics: every reduction sums in rank order, ((x_0 + x_1) + x_2) + ...,
/// each add rounded to nearest (IEEE), so results are bit-identical to the
/// host in-process communicator's on the same data.
///
/// Contract (as NcclCommunicator's, comm/nccl.hpp): the caller's writes to
/// its buffers are complete before the call (synchronize its stream); the
/// call returns when every rank's results are in place. Not capturable in a
/// CUDA graph.
///
/// Bound to the caller's stream (bind_stream), the collectives are ordered
/// on it instead and return without waiting for the device: a call copies
/// this rank's input into one of two staging slots on the stream and
/// records the slot's event; the host group exchanges every rank's slot and
/// event (a rendezvous of the threads, no device wait); the stream waits
/// for every peer's event, then reads the peers' slots into this rank's
/// results (sums in rank order, as above). Every call that gets past the
/// exchange waits for every peer's event (a call refused there gives its
/// slot back), so a peer's slot is written again (two calls later) only
/// after this rank's reads of it, and an event is re-recorded only after
/// every peer queued its wait: nothing is synchronised on the host, except
/// a device synchronisation while a slot still grows. Every rank of a group
/// must be bound or none (a call refuses a mix). Point to point stays a
/// host rendezvous on the communicator's own stream.
///
/// Point to point (PP's residual between stages, SiDP's CaS rows): a
/// rendezvous, as NCCL's ncclSend / ncclRecv are. send() posts its buffer's
/// address to the peer and returns once the peer's recv() has copied it (so,
/// unlike the host contract in comm/communicator.hpp, a send waits for its
/// recv, up to the timeout). The two ranks may be on different GPUs of the
/// process (the receiver's copy is then a peer copy, as get's); collectives
/// need every rank on one GPU.
///
/// One-sided: expose / get over device memory (get is a device copy on this
/// communicator's stream, under the host group's region bookkeeping, so an
/// unexpose waits for the copies in flight). bytes_sent() does not count
/// the bytes of gets.

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "kernels/cuda/device_buffer.hpp"

struct CUstream_st;
struct CUevent_st;

namespace shardline::model {

class InProcDeviceCommunicator final : public comm::Communicator {
 public:
  /// Wraps `host` (one rank of an in-process group of the same ranks), on
  /// CUDA device `device`. Errors: invalid_argument (null host), io (the
  /// stream cannot be made).
  [[nodiscard]] static Result<std::unique_ptr<InProcDeviceCommunicator>> create(
      std::unique_ptr<comm::Communicator> host, int device);
  ~InProcDeviceCommunicator() override;
  InProcDeviceCommunicator(const InProcDeviceCommunicator&) = delete;
  InProcDeviceCommunicator& operator=(const InProcDeviceCommunicator&) = delete;

  [[nodiscard]] bool on_device() const noexcept override { return true; }
  [[nodiscard]] int rank() const noexcept override { return host_->rank(); }
  [[nodiscard]] int world_size() const noexcept override { return host_->world_size(); }
  void set_timeout(std::chrono::milliseconds timeout) noexcept override { host_->set_timeout(timeout); }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override { return host_->timeout(); }

  [[nodiscard]] Status barrier() override { return host_->barrier(); }
  /// data[count] (device) <- sum over ranks, in rank order.
  [[nodiscard]] Status all_reduce_sum(float* data, std::size_t count) override;
  /// send[count] (device) of every rank -> recv[world, count] (device).
  [[nodiscard]] Status all_gather(const float* send, std::size_t count, float* recv) override;
  /// Row r of every rank's send[world, count] -> summed into recv[count] of rank r.
  [[nodiscard]] Status reduce_scatter_sum(const float* send, float* recv, std::size_t count) override;
  [[nodiscard]] Status all_to_all(const float* send, float* recv, std::size_t count) override;
  [[nodiscard]] Status broadcast(float* data, std::size_t count, int root) override;

  /// Device data[bytes] to `peer` under `tag` (>= 0: the negative tags
  /// carry the acknowledgements); returns once the peer has copied it.
  /// Errors: invalid_argument (a negative tag, a null buffer, a peer outside
  /// the group or itself; the peer's recv of another size: then both calls
  /// fail); io (the host group's timeout, a dead
  /// peer, a failed copy on the receiving side).
  [[nodiscard]] Status send(const void* data, std::size_t bytes, int peer, int tag) override;
  /// The next message of `peer` under `tag` into device data[bytes]: a
  /// device-to-device copy (a peer copy from another GPU) on this
  /// communicator's stream, waited for, then acknowledged. Errors: as send's; `mismatch` is invalid_argument here
  /// (the message is consumed and its send fails too).
  [[nodiscard]] Status recv(void* data, std::size_t bytes, int peer, int tag) override;
  /// Makes device data[bytes] (this rank's GPU's memory) readable by the
  /// group's ranks under `name` (the host group keeps the address; nothing
  /// is copied). Errors: invalid_argument (host memory, an empty name); the
  /// host group's.
  [[nodiscard]] Status expose(std::string name, const void* data, std::size_t bytes) override;
  /// Withdraws a region; waits for gets in flight on it (their device copies included).
  [[nodiscard]] Status unexpose(const std::string& name) override { return host_->unexpose(name); }
  /// One-sided read (SiDP's WaS fetch, seed 002 §4.2): bytes [offset, offset
  /// + bytes) of `peer`'s region `name` into device dst[bytes], a
  /// device-to-device copy (across GPUs: a peer copy) on this communicator's
  /// stream, waited for; the peer takes no part. Errors: not_found (no such
  /// region), invalid_argument (a range outside it, dst not device memory),
  /// io (a dead peer, a failed copy).
  [[nodiscard]] Status get(int peer, std::string name, std::size_t offset, void* dst, std::size_t bytes) override;
  [[nodiscard]] std::uint64_t bytes_sent() const noexcept override { return bytes_sent_; }

  /// Orders the collectives on `stream` (see above). Errors:
  /// invalid_argument (a null stream, already bound to another), io (events).
  [[nodiscard]] Status bind_stream(CUstream_st* stream) override;
  [[nodiscard]] bool collectives_in_stream_order() const noexcept override { return bound_ != nullptr; }
  /// Returns at once: no peer can leave the bound stream waiting (every
  /// event it waits for was recorded before the exchange that named it), so
  /// the caller's own synchronisation of the stream is enough.
  [[nodiscard]] Status wait_stream() override;

  /// The host communicator it wraps: the same ranks, for host buffers (a
  /// SiDP rank's step control). Its calls must follow the same order on
  /// every rank as this one's.
  [[nodiscard]] comm::Communicator& host() noexcept { return *host_; }
  /// The CUDA device of this rank's buffers.
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  /// What a rank posts for one collective; exchanged over the host group.
  struct Post {
    std::uint64_t op = 0;
    std::uint64_t count = 0;
    std::uint64_t root = 0;
    std::uint64_t device = 0;
    std::uint64_t send = 0;  ///< device addresses (in stream order, send is the rank's staging slot)
    std::uint64_t recv = 0;
    std::uint64_t event = 0;  ///< in stream order: the slot's event (a cudaEvent_t), recorded
    std::uint64_t mode = 0;   ///< 1: bound to a stream (every rank must agree)
  };
  InProcDeviceCommunicator(std::unique_ptr<comm::Communicator> host, int device, CUstream_st* stream);
  /// send / recv's argument checks. Errors: invalid_argument.
  [[nodiscard]] Status check_peer(int peer, int tag, const void* data, std::size_t bytes, const char* op) const;
  /// Every rank's post (a host all_gather), checked to agree: the same op,
  /// count, root, device and mode, non-null buffers. Errors:
  /// invalid_argument on every rank when they disagree (no device work of
  /// the call's own happened, but for a bound rank's staging copy, which
  /// nobody reads); the host group's io.
  [[nodiscard]] Result<std::vector<Post>> exchange(const Post& mine, const char* op_name);
  /// Waits for this rank's copies, then for every rank's (a host barrier,
  /// always taken so that no rank returns while a peer still reads its
  /// buffers). The first error wins.
  [[nodiscard]] Status finish(Status work);

  /// In stream order: `bytes` of device `src` into this call's staging slot
  /// on the bound stream, then the slot's event recorded; `post` gets the
  /// slot and the event. Errors: io (a copy, memory, an event).
  [[nodiscard]] Status stage_in(const void* src, std::size_t bytes, Post& post);
  /// In stream order: the bound stream waits for every peer's event.
  [[nodiscard]] Status wait_for_peers(const std::vector<Post>& posts);
  /// A collective's rendezvous: exchange(); in stream order first stages
  /// `bytes` of device `src` (checked locally; a rank that fails here still
  /// joins the exchange with null buffers, so every rank fails together, and
  /// gives its slot back) and afterwards makes the stream wait for every
  /// peer's event. Errors: exchange's; invalid_argument (not device memory);
  /// io (staging).
  [[nodiscard]] Result<std::vector<Post>> meet(Post mine, const void* src, std::size_t bytes, const char* op_name);
  /// dst[count] = the sum over ranks, in rank order, of elements
  /// [offset, offset + count) of each post's send buffer, queued on the
  /// stream the op runs on. Errors: io (a copy), the add's.
  [[nodiscard]] Status sum_in_rank_order(float* dst, const std::vector<Post>& posts, std::size_t offset,
                                         std::size_t count, const char* what);
  /// An async device-to-device copy on the stream the op runs on.
  [[nodiscard]] Status copy(void* dst, const void* src, std::size_t bytes, const char* what);
  /// The stream the collectives run on: the bound one, or the communicator's own.
  [[nodiscard]] CUstream_st* work_stream() const noexcept { return bound_ != nullptr ? bound_ : stream_; }
  /// Ends a collective: in stream order nothing to wait for; otherwise finish().
  [[nodiscard]] Status done(Status work) { return bound_ != nullptr ? work : finish(std::move(work)); }

  std::unique_ptr<comm::Communicator> host_;
  int device_ = 0;
  CUstream_st* stream_ = nullptr;
  CUstream_st* bound_ = nullptr;          ///< bind_stream's (null: not bound)
  CUevent_st* slot_events_[2] = {};       ///< the staging slots' events
  kernels::cuda::DeviceBuffer slots_[2];  ///< staging slots, grown on demand
  std::uint64_t calls_ = 0;               ///< collectives in stream order so far (slot = calls_ % 2)
  kernels::cuda::DeviceBuffer scratch_;  ///< [count] floats: reduce_scatter_sum's sum (its recv may be its send)
  std::uint64_t bytes_sent_ = 0;
};

}  // namespace shardline::model
