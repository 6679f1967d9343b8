#pragma once
/// \file
/// Link emulation: a Communicator decorator that paces one-sided gets and
/// point-to-point sends to a given link bandwidth and latency.
///
/// This is an EMULATION of a GPU interconnect (NVLink-like) on CPU threads.
/// CPU "devices" in Shardline are threads sharing one memory bus, so a get or
/// a send between ranks costs a memcpy at memory bandwidth, far faster,
/// relative to that memory, than any real link between GPUs. Pacing lets the
/// ratio of link speed to memory bandwidth be set like a GPU node's, so that
/// what is bound by weight or activation transfers (SiDP's weight fetches,
/// CaS's activation rows) behaves in the right proportion to compute.
///
/// Worked example, H200: NVLink ~900 GB/s per GPU per direction against HBM
/// ~4.8 TB/s, so the link is ~0.19x memory bandwidth. On a host whose threads
/// read memory at ~20 GB/s (measure it), the same ratio is
/// LinkSpec{.gbps = 0.19 * 20 = 3.8, .latency_us = ...}.
///
/// The model (LinkModel): every rank has one egress and one ingress port of
/// `gbps` each. A transfer of B bytes from rank p to rank q starts when the
/// caller issues it and both p's egress and q's ingress are free, and holds
/// both for latency + B / bandwidth. So N readers of one owner serialize on
/// the owner's egress (the incast that SiDP's peak shifting avoids), a reader
/// pulling from two owners serializes on its own ingress, and transfers
/// between disjoint pairs run in parallel. Reservations are first come,
/// first served; there is no switch or topology beyond the per-rank ports.
///
/// What is paced (PacedCommunicator):
///  - get(peer, ...): a transfer peer -> this rank of `bytes`. The copy runs
///    at once; the call then sleeps until the link would have delivered it
///    (the copy's own time counts toward the link time).
///  - send(..., peer, ...): a transfer this rank -> peer. The call sleeps
///    until the link would have delivered the message, then hands it to the
///    wrapped communicator, so the receiver cannot see it earlier.
///  - Transfers to or from this rank itself use no link and are not paced.
/// What is not paced: recv (its message was paced by the sender), expose /
/// unexpose, and -- unless the communicator is created with
/// `pace_collectives` -- the collectives. SiDP's data path is one-sided gets
/// (WaS weight fetches) and point-to-point sends (CaS rows and results);
/// the collectives it uses are small control exchanges. A sub-group built on
/// a PacedCommunicator (comm/subgroup.hpp) rides its sends, so its
/// collectives are paced too.
/// With `pace_collectives` (the in-process engine groups' TP / SP
/// collectives, whose in-process backend is shared memory, not sends),
/// every collective is paced as NCCL's ring runs it: after the collective
/// itself, this rank holds the link to its ring successor ((rank + 1) mod
/// world) for the bytes a ring moves per rank, issued when the call began:
///  - all_reduce_sum: 2 (world-1)/world * count * 4 (reduce-scatter + all-gather);
///  - all_gather, reduce_scatter_sum, all_to_all: (world-1) * count * 4;
///  - broadcast: count * 4 (a pipelined ring);
///  - barrier: 0 bytes (the latency alone).
/// A rank's ports are those of its device: `link_ports` maps the
/// communicator's ranks to the LinkModel's (a TP group of devices {2, 3}
/// uses ports 2 and 3), so every group of one engine group shares the
/// devices' links.
///
/// Limits: pacing never fails a call, even if the wait exceeds the timeout
/// (the wait is emulated link time, not a dead peer). Each process has its
/// own LinkModel: over TCP between processes, ranks in different processes
/// do not see each other's reservations, so incast across processes is not
/// modelled (only a process's own ranks contend). Pacing only slows calls
/// down; a wrapped transfer that is slower than the model (TCP) is not
/// slowed further.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"

namespace shardline::comm {

/// One rank's link, per direction.
struct LinkSpec {
  /// Bandwidth in GB/s (1e9 bytes/s), per direction, per rank (like NVLink's
  /// per-GPU figure). Must be finite and > 0.
  double gbps = 0;
  /// Fixed cost added to every transfer, in microseconds. Finite, >= 0.
  double latency_us = 0;
};

/// ok, or invalid_argument naming the bad field and value.
[[nodiscard]] Status validate(const LinkSpec& spec);

/// Parses the two numbers of a LinkSpec (e.g. the values of --link-gbps and
/// --link-latency-us: "3.8", "1.5") and validates them. Errors:
/// invalid_argument when a text is not a whole decimal number or a value is
/// out of range.
[[nodiscard]] Result<LinkSpec> parse_link_spec(std::string_view gbps, std::string_view latency_us);

/// The ports of every rank of one emulated node: shared by all ranks of a
/// group (one per node), thread-safe. Time is steady_clock, passed in by the
/// caller (`now`), so the arithmetic is testable without sleeping.
class LinkModel {
 public:
  using Clock = std::chrono::steady_clock;
  using TimePoint = Clock::time_point;

  /// Errors: invalid_argument (world_size < 1, bad spec).
  [[nodiscard]] static Result<std::shared_ptr<LinkModel>> create(int world_size, LinkSpec spec);

  [[nodiscard]] int world_size() const noexcept { return static_cast<int>(egress_free_.size()); }
  [[nodiscard]] const LinkSpec& spec() const noexcept { return spec_; }

  /// Time one transfer of `bytes` holds a link: latency + bytes / bandwidth,
  /// rounded to the nearest nanosecond (capped at about 30 years).
  [[nodiscard]] std::chrono::nanoseconds transfer_time(std::uint64_t bytes) const noexcept;

  /// Reserves a transfer of `bytes` from rank `src` to rank `dst` issued at
  /// `now`: start = max(now, src's egress free time, dst's ingress free time),
  /// end = start + transfer_time(bytes); both free times become end. Returns
  /// end, the time the transfer is delivered. src == dst reserves nothing and
  /// returns now. Errors: invalid_argument (a rank out of range).
  [[nodiscard]] Result<TimePoint> reserve(int src, int dst, std::uint64_t bytes, TimePoint now);
  /// Bytes of every reservation so far (src != dst), over all ports.
  [[nodiscard]] std::uint64_t reserved_bytes() const;

 private:
  LinkModel(int world_size, LinkSpec spec);

  const LinkSpec spec_;
  mutable std::mutex mu_;
  std::vector<TimePoint> egress_free_;   // guarded by mu_
  std::vector<TimePoint> ingress_free_;  // guarded by mu_
  std::uint64_t reserved_bytes_ = 0;     // guarded by mu_
};

/// A Communicator whose gets and sends are paced by a shared LinkModel (see
/// the file comment). Wraps `inner` (not owned: it must outlive this);
/// rank(), world_size(), timeouts, bytes_sent() and every other call are the
/// inner communicator's. Used by one thread at a time, like any communicator.
class PacedCommunicator final : public Communicator {
 public:
  /// Errors: invalid_argument (link is null, or its world size is not
  /// inner's).
  [[nodiscard]] static Result<std::unique_ptr<PacedCommunicator>> create(
      Communicator& inner, std::shared_ptr<LinkModel> link);
  /// Owns `inner`; its rank r uses the link's port link_ports[r]; with
  /// `pace_collectives` the collectives are paced too (see the file
  /// comment). Errors: invalid_argument (no inner or link, link_ports not
  /// of inner's world size, a port outside the link's ranks or repeated).
  [[nodiscard]] static Result<std::unique_ptr<PacedCommunicator>> create(
      std::unique_ptr<Communicator> inner, std::shared_ptr<LinkModel> link, std::vector<int> link_ports,
      bool pace_collectives);

  int rank() const noexcept override { return inner_.rank(); }
  int world_size() const noexcept override { return inner_.world_size(); }
  void set_timeout(std::chrono::milliseconds t) noexcept override { inner_.set_timeout(t); }
  std::chrono::milliseconds timeout() const noexcept override { return inner_.timeout(); }

  Status barrier() override {
    return collective(0, [&] { return inner_.barrier(); });
  }
  Status all_reduce_sum(float* data, std::size_t count) override {
    const std::uint64_t w = static_cast<std::uint64_t>(world_size());
    return collective(2 * (w - 1) * count * 4 / w, [&] { return inner_.all_reduce_sum(data, count); });
  }
  Status all_gather(const float* send, std::size_t count, float* recv) override {
    return collective(ring_bytes(count), [&] { return inner_.all_gather(send, count, recv); });
  }
  Status reduce_scatter_sum(const float* send, float* recv, std::size_t count) override {
    return collective(ring_bytes(count), [&] { return inner_.reduce_scatter_sum(send, recv, count); });
  }
  Status all_to_all(const float* send, float* recv, std::size_t count) override {
    return collective(ring_bytes(count), [&] { return inner_.all_to_all(send, recv, count); });
  }
  Status broadcast(float* data, std::size_t count, int root) override {
    return collective(static_cast<std::uint64_t>(count) * 4, [&] { return inner_.broadcast(data, count, root); });
  }

  /// Paced: sleeps until the link delivers, then sends (see file comment).
  Status send(const void* data, std::size_t bytes, int peer, int tag) override;
  Status recv(void* data, std::size_t bytes, int peer, int tag) override {
    return inner_.recv(data, bytes, peer, tag);
  }

  Status expose(std::string name, const void* data, std::size_t bytes) override {
    return inner_.expose(std::move(name), data, bytes);
  }
  Status unexpose(const std::string& name) override { return inner_.unexpose(name); }
  /// Paced: copies, then sleeps until the link delivers (see file comment).
  Status get(int peer, std::string name, std::size_t offset, void* dst,
             std::size_t bytes) override;

  std::uint64_t bytes_sent() const noexcept override { return inner_.bytes_sent(); }

  /// Bytes of the gets and sends this rank made that went through the link
  /// model (successful ones, to or from another rank).
  [[nodiscard]] std::uint64_t paced_bytes() const noexcept { return paced_bytes_.load(); }
  /// Nanoseconds this rank spent asleep waiting for the emulated link (the
  /// time pacing added on top of the wrapped calls).
  [[nodiscard]] std::uint64_t link_wait_ns() const noexcept { return link_wait_ns_.load(); }
  [[nodiscard]] const std::shared_ptr<LinkModel>& link() const noexcept { return link_; }

 private:
  PacedCommunicator(Communicator& inner, std::shared_ptr<LinkModel> link, std::unique_ptr<Communicator> owned,
                    std::vector<int> link_ports, bool pace_collectives)
      : owned_(std::move(owned)),
        inner_(inner),
        link_(std::move(link)),
        link_ports_(std::move(link_ports)),
        pace_collectives_(pace_collectives) {}

  /// Sleeps until `until` (if in the future), adding the time to the counter.
  void wait_until(LinkModel::TimePoint until);
  /// The link's port of communicator rank `r`.
  [[nodiscard]] int port(int r) const noexcept { return link_ports_[static_cast<std::size_t>(r)]; }
  /// (world - 1) * count floats, in bytes.
  [[nodiscard]] std::uint64_t ring_bytes(std::size_t count) const noexcept {
    return static_cast<std::uint64_t>(world_size() - 1) * count * 4;
  }
  /// Runs a collective and, with pace_collectives_, holds the link to the
  /// ring successor for `bytes` from the call's start (see the file comment).
  template <typename Op>
  Status collective(std::uint64_t bytes, Op&& op) {
    if (!pace_collectives_ || world_size() < 2) return op();
    const auto issued = LinkModel::Clock::now();
    Status st = op();
    if (!st.ok()) return st;
    auto end = link_->reserve(port(rank()), port((rank() + 1) % world_size()), bytes, issued);
    if (!end.ok()) return end.error();
    wait_until(end.value());
    paced_bytes_.fetch_add(bytes);
    return st;
  }

  std::unique_ptr<Communicator> owned_;  // inner_, when created owning it
  Communicator& inner_;
  const std::shared_ptr<LinkModel> link_;
  const std::vector<int> link_ports_;  // [world_size] -> link port
  const bool pace_collectives_ = false;
  std::atomic<std::uint64_t> paced_bytes_{0};
  std::atomic<std::uint64_t> link_wait_ns_{0};
};

}  // namespace shardline::comm
