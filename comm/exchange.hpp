#pragma once
/// \file
/// Internal to comm/: the collectives of the message-passing backends (TCP,
/// sub-groups), written once over a small transport interface.
///
/// Every collective is a direct exchange over the full mesh:
///  - phase 1: every rank sends one message to every other rank, made of a
///    descriptor (op, count, root, "my arguments are bad", sequence number)
///    and the payload that op needs to move (possibly empty). Every rank thus
///    sees every rank's descriptor and reaches the same verdict: if any rank
///    passed bad arguments or the ranks disagree on op / count / root, all of
///    them return invalid_argument having consumed exactly the same messages,
///    and the group stays in step.
///  - all_reduce_sum only, phase 2: rank r owns slice r of the elements (the
///    same split as the in-process backend), sums it in rank order from the
///    phase-1 slices and sends the sum to every rank.
/// Sums are always ((x_0 + x_1) + x_2) + ..., so results are bit-identical to
/// the in-process backend's and on every rank. Phase-1 traffic per rank:
/// all_gather / all_to_all / reduce_scatter_sum send (world-1) * count floats;
/// all_reduce_sum sends about 2 * count * (world-1) / world floats.
/// Received payloads are validated and only then copied into the caller's
/// buffers, so a collective that fails leaves them untouched on this rank.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"

namespace shardline::comm::detail {

enum class CollOp : std::uint8_t {
  barrier = 1,
  all_reduce_sum = 2,
  all_gather = 3,
  reduce_scatter_sum = 4,
  all_to_all = 5,
  broadcast = 6,
};

/// "all_reduce_sum", ...; "collective" for unknown values.
[[nodiscard]] const char* coll_op_name(std::uint8_t op) noexcept;

/// Why a rank's own arguments are bad (0 = fine).
enum class BadArgs : std::uint8_t {
  none = 0,
  null_buffer = 1,
  overlap = 2,
  root_out_of_range = 3,
  too_large = 4,
};
[[nodiscard]] const char* bad_args_text(std::uint8_t bad) noexcept;

/// What a rank tells a peer about one collective message; fixed 48 bytes so
/// it can travel as a message of its own (sub-groups) or inside a frame
/// header (TCP).
struct CollDesc {
  static constexpr std::uint32_t kMagic = 0x4c4f4353;  // "SCOL"
  std::uint32_t magic = kMagic;
  std::uint8_t op = 0;
  std::uint8_t phase = 1;
  std::uint8_t bad = 0;
  std::uint8_t reserved0 = 0;
  std::int32_t root = 0;
  std::uint32_t reserved1 = 0;
  std::uint64_t seq = 0;            ///< collective sequence number in the group
  std::uint64_t count = 0;          ///< elements, as the caller passed them
  std::uint64_t payload_bytes = 0;  ///< bytes of payload that follow
  std::uint64_t reserved2 = 0;
};
static_assert(sizeof(CollDesc) == 48);

/// A byte buffer that is not zero-filled on allocation (payloads are
/// overwritten right away). 16-byte aligned, so floats can be read in place.
class ByteBuf {
 public:
  ByteBuf() = default;
  /// n bytes, or an empty buffer with ok() == false when memory runs out.
  [[nodiscard]] static ByteBuf allocate(std::size_t n) {
    ByteBuf b;
    if (n == 0) return b;
    b.p_.reset(new (std::nothrow) std::byte[n]);
    if (b.p_) b.n_ = n;
    else b.failed_ = true;
    return b;
  }
  [[nodiscard]] bool ok() const noexcept { return !failed_; }
  [[nodiscard]] std::byte* data() noexcept { return p_.get(); }
  [[nodiscard]] const std::byte* data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

 private:
  std::unique_ptr<std::byte[]> p_;
  std::size_t n_ = 0;
  bool failed_ = false;
};

struct CollMsg {
  CollDesc desc;
  ByteBuf payload;
};

/// How one backend moves collective messages. Errors are complete messages
/// ("all_reduce_sum: rank 0 timed out after 200 ms waiting for rank 3"), so
/// `op` (a name from coll_op_name) is passed along.
class CollTransport {
 public:
  virtual ~CollTransport() = default;
  /// Sends desc and desc.payload_bytes bytes of `payload` to `peer`.
  [[nodiscard]] virtual Status post(int peer, const CollDesc& desc, const void* payload,
                                    const char* op) = 0;
  /// Receives the message of collective `seq`, phase `phase` from `peer`.
  [[nodiscard]] virtual Status take(int peer, std::uint64_t seq, std::uint8_t phase, CollMsg& out,
                                    const char* op) = 0;
};

/// One collective call as the Communicator method received it. For
/// all_reduce_sum and broadcast the in-out buffer is `recv` (send == recv).
struct CollCall {
  CollOp op = CollOp::barrier;
  const float* send = nullptr;
  float* recv = nullptr;
  std::size_t count = 0;
  int root = 0;
};

/// The call of one collective: `op` with its buffers (send == recv in place),
/// element count and root.
[[nodiscard]] inline CollCall coll_call(CollOp op, const float* send = nullptr, float* recv = nullptr,
                                        std::size_t count = 0, int root = 0) {
  CollCall c;
  c.op = op;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.root = root;
  return c;
}

/// The collectives of Communicator, each as one call of `collective(CollCall)`:
/// the backends built on run_collective (TCP, sub-groups) derive from
/// CollectivesByCall<TheirBase> and implement only collective().
template <class Base>
class CollectivesByCall : public Base {
 public:
  [[nodiscard]] Status barrier() override { return collective(coll_call(CollOp::barrier)); }
  [[nodiscard]] Status all_reduce_sum(float* data, std::size_t count) override {
    return collective(coll_call(CollOp::all_reduce_sum, data, data, count));
  }
  [[nodiscard]] Status all_gather(const float* send, std::size_t count, float* recv) override {
    return collective(coll_call(CollOp::all_gather, send, recv, count));
  }
  [[nodiscard]] Status reduce_scatter_sum(const float* send, float* recv, std::size_t count) override {
    return collective(coll_call(CollOp::reduce_scatter_sum, send, recv, count));
  }
  [[nodiscard]] Status all_to_all(const float* send, float* recv, std::size_t count) override {
    return collective(coll_call(CollOp::all_to_all, send, recv, count));
  }
  [[nodiscard]] Status broadcast(float* data, std::size_t count, int root) override {
    return collective(coll_call(CollOp::broadcast, data, data, count, root));
  }

 protected:
  /// Runs one collective on this backend's transport.
  [[nodiscard]] virtual Status collective(const CollCall& call) = 0;
};


/// Runs `call` as rank `rank` of `world` under sequence number `seq` (the
/// same on every rank). `bytes_sent` grows by the payload bytes posted.
/// Errors: invalid_argument (bad or disagreeing arguments, on every rank),
/// io (from the transport; also a peer whose message has the wrong size).
[[nodiscard]] Status run_collective(CollTransport& transport, int rank, int world,
                                    std::uint64_t seq, const CollCall& call,
                                    std::uint64_t& bytes_sent);

/// Slice [begin, end) of n elements that rank r of w reduces in all_reduce_sum.
[[nodiscard]] std::pair<std::size_t, std::size_t> reduce_slice(std::size_t n, int r, int w) noexcept;

/// "200 ms".
[[nodiscard]] inline std::string ms_text(std::chrono::milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

}  // namespace shardline::comm::detail
