#include "comm/subgroup.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "comm/exchange.hpp"

namespace shardline::comm {
namespace {

using Clock = std::chrono::steady_clock;
using detail::ms_text;

constexpr int kDescTag = 0;  // + tag_base: descriptors; + phase: payloads
/// Largest collective payload a descriptor may announce (sanity check).
constexpr std::uint64_t kMaxPayload = std::uint64_t{1} << 40;

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kMax = std::chrono::hours(24 * 365);
  return Clock::now() + std::clamp(timeout, std::chrono::milliseconds(1), kMax);
}

/// Restores the parent's timeout when the sub-group's call ends.
class ParentTimeout {
 public:
  explicit ParentTimeout(Communicator& parent) : parent_(parent), saved_(parent.timeout()) {}
  ~ParentTimeout() { parent_.set_timeout(saved_); }
  ParentTimeout(const ParentTimeout&) = delete;
  ParentTimeout& operator=(const ParentTimeout&) = delete;
  /// Gives the parent the time left until `deadline`; false when none is.
  bool until(Clock::time_point deadline) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    parent_.set_timeout(left);
    return true;
  }

 private:
  Communicator& parent_;
  std::chrono::milliseconds saved_;
};

class SubgroupComm final : public detail::CollectivesByCall<Communicator> {
 public:
  SubgroupComm(Communicator& parent, std::vector<int> members, int rank, int tag_base)
      : parent_(parent),
        members_(std::move(members)),
        rank_(rank),
        tag_base_(tag_base),
        prefix_("sg" + std::to_string(tag_base) + ":"),
        timeout_(parent.timeout()) {}

  ~SubgroupComm() override {
    for (const auto& name : exposed_) (void)parent_.unexpose(prefix_ + name);
  }

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return static_cast<int>(members_.size()); }
  void set_timeout(std::chrono::milliseconds t) noexcept override {
    timeout_ = std::max(t, std::chrono::milliseconds(1));
  }
  std::chrono::milliseconds timeout() const noexcept override { return timeout_; }
  std::uint64_t bytes_sent() const noexcept override { return bytes_sent_.load(); }

  Status send(const void* data, std::size_t bytes, int peer, int tag) override {
    constexpr const char* kOp = "send";
    if (Status st = check_peer_tag(kOp, peer, tag); !st.ok()) return st;
    const auto deadline = deadline_after(timeout_);
    ParentTimeout pt(parent_);
    if (!pt.until(deadline)) return timed_out(kOp, peer, "");
    Status st = parent_.send(data, bytes, parent_rank(peer), user_tag(tag));
    if (!st.ok()) return wrap(kOp, peer, st.error());
    if (peer != rank_) bytes_sent_.fetch_add(bytes);
    return st;
  }

  Status recv(void* data, std::size_t bytes, int peer, int tag) override {
    constexpr const char* kOp = "recv";
    if (Status st = check_peer_tag(kOp, peer, tag); !st.ok()) return st;
    const auto deadline = deadline_after(timeout_);
    ParentTimeout pt(parent_);
    if (!pt.until(deadline)) return timed_out(kOp, peer, tag_text(tag, bytes));
    Status st = parent_.recv(data, bytes, parent_rank(peer), user_tag(tag));
    if (st.ok()) return st;
    if (st.error().code == ErrorCode::io && Clock::now() >= deadline) {
      return timed_out(kOp, peer, tag_text(tag, bytes));
    }
    return wrap(kOp, peer, st.error());
  }

  Status expose(std::string name, const void* data, std::size_t bytes) override {
    constexpr const char* kOp = "expose";
    if (name.empty()) return make_error(ErrorCode::invalid_argument, who(kOp) + ": empty name");
    Status st = parent_.expose(prefix_ + name, data, bytes);
    if (!st.ok()) return make_error(st.error().code, who(kOp) + ": " + st.error().message);
    exposed_.insert(std::move(name));
    return st;
  }

  Status unexpose(const std::string& name) override {
    constexpr const char* kOp = "unexpose";
    if (exposed_.count(name) == 0) {
      return make_error(ErrorCode::not_found, who(kOp) + ": no region named '" + name + "'");
    }
    exposed_.erase(name);
    Status st = parent_.unexpose(prefix_ + name);
    if (!st.ok()) return make_error(st.error().code, who(kOp) + ": " + st.error().message);
    return st;
  }

  Status get(int peer, std::string name, std::size_t offset, void* dst,
             std::size_t bytes) override {
    constexpr const char* kOp = "get";
    if (peer < 0 || peer >= world_size()) return peer_range_error(kOp, peer);
    const auto deadline = deadline_after(timeout_);
    ParentTimeout pt(parent_);
    if (!pt.until(deadline)) return timed_out(kOp, peer, "(region '" + name + "')");
    Status st = parent_.get(parent_rank(peer), prefix_ + name, offset, dst, bytes);
    if (st.ok()) return st;
    switch (st.error().code) {
      case ErrorCode::not_found:
        return make_error(ErrorCode::not_found, who(kOp) + ": rank " + std::to_string(peer) +
                                                    " exposes no region named '" + name + "'");
      case ErrorCode::io:
        if (Clock::now() >= deadline) return timed_out(kOp, peer, "(region '" + name + "')");
        return wrap(kOp, peer, st.error());
      default:
        return wrap(kOp, peer, st.error());
    }
  }

 private:
  /// Moves collective messages over the parent's point to point.
  class Transport final : public detail::CollTransport {
   public:
    Transport(SubgroupComm& s, Clock::time_point deadline)
        : s_(s), deadline_(deadline), timeout_(s.parent_) {}

    Status post(int peer, const detail::CollDesc& d, const void* payload, const char* op) override {
      if (!timeout_.until(deadline_)) return s_.timed_out(op, peer, "");
      Status st = s_.parent_.send(&d, sizeof d, s_.parent_rank(peer), s_.tag_base_ + kDescTag);
      if (st.ok() && d.payload_bytes > 0) {
        st = s_.parent_.send(payload, d.payload_bytes, s_.parent_rank(peer), s_.tag_base_ + d.phase);
      }
      if (!st.ok()) return s_.wrap(op, peer, st.error(), ErrorCode::io);
      return st;
    }

    Status take(int peer, std::uint64_t seq, std::uint8_t phase, detail::CollMsg& out,
                const char* op) override {
      const int pr = s_.parent_rank(peer);
      auto failed = [&](const Error& e) {
        if (e.code == ErrorCode::io && Clock::now() >= deadline_) {
          return s_.timed_out(op, peer, "(collective #" + std::to_string(seq) + ", phase " +
                                            std::to_string(phase) + ")");
        }
        return s_.wrap(op, peer, e, ErrorCode::io);
      };
      if (!timeout_.until(deadline_)) return failed(make_error(ErrorCode::io, "timed out"));
      detail::CollDesc d;
      if (Status st = s_.parent_.recv(&d, sizeof d, pr, s_.tag_base_ + kDescTag); !st.ok()) {
        return failed(st.error());
      }
      if (d.magic != detail::CollDesc::kMagic || d.seq != seq || d.phase != phase ||
          d.payload_bytes > kMaxPayload) {
        return make_error(ErrorCode::io, s_.who(op) + ": rank " + std::to_string(peer) +
                                             " is out of step (got collective #" +
                                             std::to_string(d.seq) + " phase " +
                                             std::to_string(d.phase) + ", expected #" +
                                             std::to_string(seq) + " phase " +
                                             std::to_string(phase) + "; tag range shared?)");
      }
      out.desc = d;
      out.payload = detail::ByteBuf::allocate(d.payload_bytes);
      if (!out.payload.ok()) {
        return make_error(ErrorCode::out_of_memory,
                          s_.who(op) + ": cannot buffer " + std::to_string(d.payload_bytes) +
                              " bytes from rank " + std::to_string(peer));
      }
      if (d.payload_bytes > 0) {
        if (!timeout_.until(deadline_)) return failed(make_error(ErrorCode::io, "timed out"));
        if (Status st = s_.parent_.recv(out.payload.data(), d.payload_bytes, pr,
                                        s_.tag_base_ + phase);
            !st.ok()) {
          return failed(st.error());
        }
      }
      return Status();
    }

   private:
    SubgroupComm& s_;
    Clock::time_point deadline_;
    ParentTimeout timeout_;
  };

  int parent_rank(int r) const { return members_[static_cast<std::size_t>(r)]; }
  int user_tag(int tag) const { return tag_base_ + kSubgroupInternalTags + tag; }

  std::string who(const char* op) const {
    return std::string(op) + ": rank " + std::to_string(rank_);
  }
  std::string peer_text(int peer) const {
    return "rank " + std::to_string(peer) + " (parent rank " + std::to_string(parent_rank(peer)) + ")";
  }
  static std::string tag_text(int tag, std::size_t bytes) {
    return "(tag " + std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)";
  }
  Error timed_out(const char* op, int peer, const std::string& detail) const {
    return make_error(ErrorCode::io, who(op) + " timed out after " + ms_text(timeout_) +
                                         " waiting for " + peer_text(peer) +
                                         (detail.empty() ? "" : " " + detail));
  }
  /// A parent error, re-addressed in sub-group ranks (code kept unless given).
  Error wrap(const char* op, int peer, const Error& e,
             std::optional<ErrorCode> code = std::nullopt) const {
    return make_error(code.value_or(e.code),
                      who(op) + " (parent rank " + std::to_string(parent_rank(rank_)) +
                          "), with " + peer_text(peer) + ": " + e.message);
  }
  Error peer_range_error(const char* op, int peer) const {
    return make_error(ErrorCode::invalid_argument,
                      who(op) + ": peer " + std::to_string(peer) + " is out of range [0, " +
                          std::to_string(world_size()) + ")");
  }
  Status check_peer_tag(const char* op, int peer, int tag) const {
    if (peer < 0 || peer >= world_size()) return peer_range_error(op, peer);
    if (tag < 0 || tag > kSubgroupMaxTag) {
      return make_error(ErrorCode::invalid_argument,
                        who(op) + ": tag " + std::to_string(tag) + " is out of range [0, " +
                            std::to_string(kSubgroupMaxTag) + "]");
    }
    return Status();
  }

  Status collective(const detail::CollCall& call) override {
    const char* name = detail::coll_op_name(static_cast<std::uint8_t>(call.op));
    if (!poisoned_.empty()) {
      return make_error(ErrorCode::io, who(name) + ": the sub-group is poisoned by an earlier failure (" +
                                           poisoned_ + "); rebuild it");
    }
    const auto deadline = deadline_after(timeout_);
    std::uint64_t sent = 0;
    Status st;
    {
      Transport t(*this, deadline);
      st = detail::run_collective(t, rank_, world_size(), seq_++, call, sent);
    }
    bytes_sent_.fetch_add(sent);
    if (!st.ok() && st.error().code != ErrorCode::invalid_argument) poisoned_ = st.error().message;
    return st;
  }

  Communicator& parent_;
  const std::vector<int> members_;
  const int rank_;
  const int tag_base_;
  const std::string prefix_;
  std::chrono::milliseconds timeout_;
  std::uint64_t seq_ = 0;
  std::string poisoned_;
  std::set<std::string> exposed_;
  std::atomic<std::uint64_t> bytes_sent_{0};
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_subgroup(Communicator& parent, std::vector<int> members,
                                                    int tag_base, MemberOrder order) {
  const std::string where = "make_subgroup: parent rank " + std::to_string(parent.rank());
  if (members.empty()) return make_error(ErrorCode::invalid_argument, where + ": no members");
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= parent.world_size()) {
      return make_error(ErrorCode::invalid_argument,
                        where + ": member " + std::to_string(members[i]) + " is out of range [0, " +
                            std::to_string(parent.world_size()) + ")");
    }
    if (order == MemberOrder::increasing && i > 0 && members[i] <= members[i - 1]) {
      return make_error(ErrorCode::invalid_argument,
                        where + ": members must be strictly increasing (" +
                            std::to_string(members[i - 1]) + " then " + std::to_string(members[i]) +
                            ")");
    }
  }
  if (order == MemberOrder::as_given) {
    std::vector<int> sorted = members;
    std::sort(sorted.begin(), sorted.end());
    if (auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
      return make_error(ErrorCode::invalid_argument,
                        where + ": member " + std::to_string(*dup) + " is listed twice");
    }
  }
  auto it = std::find(members.begin(), members.end(), parent.rank());
  if (it == members.end()) {
    return make_error(ErrorCode::invalid_argument, where + " is not a member of the sub-group");
  }
  if (tag_base < 0 || tag_base > INT_MAX - kSubgroupTagSpan + 1) {
    return make_error(ErrorCode::invalid_argument,
                      where + ": tag_base " + std::to_string(tag_base) + " is out of range [0, " +
                          std::to_string(INT_MAX - kSubgroupTagSpan + 1) + "]");
  }
  const int rank = static_cast<int>(it - members.begin());
  return std::unique_ptr<Communicator>(
      std::make_unique<SubgroupComm>(parent, std::move(members), rank, tag_base));
}

}  // namespace shardline::comm
