#pragma once
/// \file
/// Internal to comm/ (the TCP backend, comm/tcp.hpp): the data path. TcpComm
/// is the TcpCommunicator of one rank over the connections a finished
/// rendezvous (tcp_rendezvous.cpp) hands it; its methods are in tcp.cpp.
///
/// Every message is a frame: a 40-byte FrameHeader (host byte order,
/// little-endian hosts only) and `bytes` of payload, written whole under the
/// connection's send lock. One receiver thread reads all connections with
/// poll and queues the frames per (peer, tag) for recv and per (peer,
/// collective sequence, phase) for collectives; one responder thread answers
/// get requests from the exposed regions.

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/exchange.hpp"
#include "comm/tcp.hpp"
#include "comm/tcp_socket.hpp"

namespace shardline::comm::tcp_detail {

static_assert(std::endian::native == std::endian::little,
              "the TCP frame format is little-endian host order");

using detail::ByteBuf;
using detail::ms_text;

constexpr std::uint64_t kMaxFrameBytes = std::uint64_t{1} << 40;  // one message's payload
constexpr std::size_t kStageBytes = 1 << 16;  // the receiver's staging buffer per peer
constexpr std::size_t kPumpBudget = 8u << 20;  // bytes read from one peer per poll round

/// A lock whose acquisition gives up at a deadline (what std::timed_mutex
/// does, built on mutex + condition variable so that ThreadSanitizer, which
/// does not intercept pthread_mutex_clocklock, can follow it).
class DeadlineLock {
 public:
  [[nodiscard]] bool lock_until(Clock::time_point deadline) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return !busy_; })) return false;
    busy_ = true;
    return true;
  }
  void unlock() {
    {
      std::lock_guard lk(mu_);
      busy_ = false;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;
};

/// Holds a DeadlineLock taken by lock_until until release() or destruction.
class DeadlineGuard {
 public:
  explicit DeadlineGuard(DeadlineLock& lock) : lock_(lock) {}
  ~DeadlineGuard() { release(); }
  DeadlineGuard(const DeadlineGuard&) = delete;
  DeadlineGuard& operator=(const DeadlineGuard&) = delete;
  [[nodiscard]] bool acquire(Clock::time_point deadline) {
    held_ = lock_.lock_until(deadline);
    return held_;
  }
  void release() {
    if (held_) lock_.unlock();
    held_ = false;
  }

 private:
  DeadlineLock& lock_;
  bool held_ = false;
};

/// Frame kinds. A get_req payload is the u64 byte count followed by the
/// region name; a get_resp payload is the bytes asked for (status ok only).
enum class Kind : std::uint32_t { data = 1, coll = 2, get_req = 3, get_resp = 4 };

struct FrameHeader {
  std::uint32_t kind = 0;
  std::int32_t tag = 0;     ///< data: the user tag
  std::uint64_t bytes = 0;  ///< payload bytes that follow
  std::uint64_t id = 0;     ///< coll: sequence number; get_req / get_resp: request id
  std::uint64_t arg = 0;    ///< coll: count; get_req: offset; get_resp: region bytes
  std::int32_t root = 0;    ///< coll: root
  std::uint8_t op = 0;      ///< coll: CollOp
  std::uint8_t phase = 0;   ///< coll: 1 or 2
  std::uint8_t bad = 0;     ///< coll: BadArgs
  std::uint8_t status = 0;  ///< get_resp: 0 ok, 1 no such region, 2 outside the region
};
static_assert(sizeof(FrameHeader) == 40);

enum GetStatus : std::uint8_t { kGetOk = 0, kGetNotFound = 1, kGetOutside = 2 };

/// The TcpCommunicator of one rank (see comm/tcp.hpp for its contract).
class TcpComm final : public detail::CollectivesByCall<TcpCommunicator> {
 public:
  /// Takes the connections of a finished rendezvous (conns[rank] is unused)
  /// and starts the receiver and responder threads.
  TcpComm(int rank, int world, std::vector<Fd> conns, std::chrono::milliseconds timeout);
  /// Stops the threads, then closes each connection in order (FIN after
  /// everything written).
  ~TcpComm() override;

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_; }
  void set_timeout(std::chrono::milliseconds t) noexcept override {
    timeout_ms_.store(std::max<std::int64_t>(t.count(), 1));
  }
  std::chrono::milliseconds timeout() const noexcept override {
    return std::chrono::milliseconds(timeout_ms_.load());
  }
  std::uint64_t bytes_sent() const noexcept override { return bytes_sent_.load(); }
  std::uint64_t bytes_received() const noexcept override { return bytes_received_.load(); }
  std::uint64_t wire_bytes_sent() const noexcept override { return wire_sent_.load(); }
  std::uint64_t wire_bytes_received() const noexcept override { return wire_received_.load(); }
  bool peer_dead(int peer) const override {
    if (peer < 0 || peer >= world_ || peer == rank_) return false;
    std::lock_guard lk(mu_);
    return peers_[static_cast<std::size_t>(peer)]->dead;
  }
  std::string poisoned() const override {
    std::lock_guard lk(mu_);
    return poisoned_;
  }

  Status send(const void* data, std::size_t bytes, int peer, int tag) override;
  Status recv(void* data, std::size_t bytes, int peer, int tag) override;
  Status expose(std::string name, const void* data, std::size_t bytes) override;
  Status unexpose(const std::string& name) override;
  Status get(int peer, std::string name, std::size_t offset, void* dst,
             std::size_t bytes) override;

 private:
  struct RxState {  // receiver thread only
    FrameHeader hdr;
    std::size_t hdr_got = 0;
    bool in_payload = false;
    ByteBuf payload;
    std::size_t payload_got = 0;
    std::vector<std::byte> stage;
    bool open = true;
  };
  struct Peer {
    Fd fd;
    DeadlineLock send_mu;  // one frame at a time on the socket
    RxState rx;
    // Guarded by mu_.
    bool dead = false;
    std::string dead_reason;
    std::map<int, std::deque<ByteBuf>> p2p;  // by tag
    std::map<std::pair<std::uint64_t, std::uint8_t>, detail::CollMsg> coll;  // by (seq, phase)
  };
  struct PendingGet {
    bool done = false;
    std::uint8_t status = kGetOk;
    std::uint64_t region_bytes = 0;
    ByteBuf data;
  };
  struct GetRequest {
    int peer = 0;
    std::uint64_t id = 0;
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
    std::string name;
  };
  struct Region {
    const void* data = nullptr;
    std::size_t bytes = 0;
    int inflight = 0;
  };

  class Transport final : public detail::CollTransport {
   public:
    Transport(TcpComm& c, Clock::time_point deadline) : c_(c), deadline_(deadline) {}
    Status post(int peer, const detail::CollDesc& d, const void* payload, const char* op) override {
      FrameHeader h;
      h.kind = static_cast<std::uint32_t>(Kind::coll);
      h.bytes = d.payload_bytes;
      h.id = d.seq;
      h.arg = d.count;
      h.root = d.root;
      h.op = d.op;
      h.phase = d.phase;
      h.bad = d.bad;
      return c_.send_frame(peer, h, payload, deadline_, op);
    }
    Status take(int peer, std::uint64_t seq, std::uint8_t phase, detail::CollMsg& out,
                const char* op) override {
      return c_.take_coll(peer, seq, phase, out, deadline_, op);
    }

   private:
    TcpComm& c_;
    Clock::time_point deadline_;
  };

  std::string who(const char* op) const { return std::string(op) + ": rank " + std::to_string(rank_); }
  Error peer_range_error(const char* op, int peer) const {
    return make_error(ErrorCode::invalid_argument,
                      who(op) + ": peer " + std::to_string(peer) + " is out of range [0, " +
                          std::to_string(world_) + ")");
  }
  Error dead_error(const char* op, int peer) const {  // mu_ held
    return make_error(ErrorCode::io, who(op) + ": peer rank " + std::to_string(peer) + " is dead (" +
                                         peers_[static_cast<std::size_t>(peer)]->dead_reason + ")");
  }

  Status collective(const detail::CollCall& call) override;
  Status send_frame(int peer, const FrameHeader& h, const void* payload, Clock::time_point deadline,
                    const char* op);
  Status take_coll(int peer, std::uint64_t seq, std::uint8_t phase, detail::CollMsg& out,
                   Clock::time_point deadline, const char* op);
  void mark_dead(int peer, const std::string& reason);
  void receive_loop();
  void pump(int peer);
  void dispatch(int peer);
  void respond_loop();

  const int rank_;
  const int world_;
  std::atomic<std::int64_t> timeout_ms_{kDefaultTimeout.count()};
  std::vector<std::unique_ptr<Peer>> peers_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // p2p, collectives, gets, deaths
  std::condition_variable resp_cv_;  // get requests for the responder
  std::deque<GetRequest> requests_;
  std::map<std::uint64_t, PendingGet> pending_;
  std::uint64_t next_request_ = 1;
  std::string poisoned_;
  int num_dead_ = 0;
  std::uint64_t coll_seq_ = 0;  // the collective thread only

  std::mutex regions_mu_;
  std::condition_variable regions_cv_;
  std::map<std::string, Region> regions_;

  std::atomic<bool> stop_{false};
  Fd stop_r_, stop_w_;
  std::thread receiver_, responder_;

  std::atomic<std::uint64_t> bytes_sent_{0}, bytes_received_{0}, wire_sent_{0}, wire_received_{0};
};

}  // namespace shardline::comm::tcp_detail
