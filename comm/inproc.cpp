#include "comm/inproc.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/exchange.hpp"

namespace shardline::comm {
namespace {

using Clock = std::chrono::steady_clock;

enum class Op { barrier, all_reduce_sum, all_gather, reduce_scatter_sum, all_to_all, broadcast };

const char* op_name(Op op) {
  switch (op) {
    case Op::barrier: return "barrier";
    case Op::all_reduce_sum: return "all_reduce_sum";
    case Op::all_gather: return "all_gather";
    case Op::reduce_scatter_sum: return "reduce_scatter_sum";
    case Op::all_to_all: return "all_to_all";
    case Op::broadcast: return "broadcast";
  }
  return "collective";
}

/// What one rank posted for the current collective.
struct Post {
  bool present = false;
  Op op = Op::barrier;
  const float* send = nullptr;
  float* recv = nullptr;  ///< all_reduce_sum / broadcast: the in-out buffer
  std::size_t count = 0;
  int root = 0;
  std::string bad;  ///< non-empty: this rank's arguments are invalid
};

/// A message queued because no matching recv was posted yet.
struct QueuedMsg {
  int src = 0;
  int tag = 0;
  std::vector<std::byte> bytes;
};

/// A recv waiting for its message; lives on the receiver's stack.
struct PostedRecv {
  enum class State { waiting, claimed, done };
  int src = 0;
  int tag = 0;
  void* dst = nullptr;
  std::size_t bytes = 0;
  State state = State::waiting;
  std::string error;  ///< set with state done when the sender rejected it
};

struct Region {
  const void* data = nullptr;
  std::size_t bytes = 0;
  int inflight = 0;  ///< gets copying from it right now
};

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  // Keep far deadlines representable for the condition variable.
  constexpr std::chrono::milliseconds kMax = std::chrono::hours(24 * 365);
  return Clock::now() + std::min(timeout, kMax);
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  if (an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}


std::string ms_string(std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; }

}  // namespace

struct InProcGroup::Impl {
  explicit Impl(int w)
      : world(w),
        posts(static_cast<std::size_t>(w)),
        attempt_gen(static_cast<std::size_t>(w), UINT64_MAX),
        inbox(static_cast<std::size_t>(w)),
        posted(static_cast<std::size_t>(w)),
        regions(static_cast<std::size_t>(w)),
        taken(static_cast<std::size_t>(w), 0),
        dead(static_cast<std::size_t>(w), 0),
        sent(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(w))) {}

  const int world;

  // Collectives. Barrier 1: every rank has posted; barrier 2: every rank has
  // finished reading/writing the posted buffers (so they may be reused).
  std::mutex coll_mu;
  std::condition_variable coll_cv;
  std::vector<Post> posts;  // written under coll_mu; read lock-free between the barriers
  int arrived1 = 0;
  int arrived2 = 0;
  std::uint64_t gen1 = 0;
  std::uint64_t gen2 = 0;
  std::vector<std::uint64_t> attempt_gen;  // gen1 at each rank's latest post

  // Point to point and one-sided.
  std::mutex p2p_mu;
  std::condition_variable p2p_cv;
  std::vector<std::deque<QueuedMsg>> inbox;       // by destination
  std::vector<std::list<PostedRecv*>> posted;     // by receiver
  std::vector<std::map<std::string, Region>> regions;  // by owner
  std::vector<char> taken;                        // guarded by p2p_mu

  // Written holding both mutexes; read holding either.
  std::vector<char> dead;
  int num_dead = 0;

  // Payload bytes each rank has sent (Communicator::bytes_sent).
  std::unique_ptr<std::atomic<std::uint64_t>[]> sent;

  int first_dead() const {
    for (int k = 0; k < world; ++k)
      if (dead[static_cast<std::size_t>(k)]) return k;
    return -1;
  }
  bool is_dead(int r) const { return dead[static_cast<std::size_t>(r)] != 0; }
};

namespace {

class InProcCommunicator final : public Communicator {
 public:
  InProcCommunicator(std::shared_ptr<InProcGroup::Impl> g, int rank)
      : g_(std::move(g)), rank_(rank) {}

  ~InProcCommunicator() override {
    // Withdraw exposed regions (waiting for gets in flight) so no peer reads
    // memory the owner may free after dropping its communicator.
    std::unique_lock lk(g_->p2p_mu);
    auto& mine = g_->regions[static_cast<std::size_t>(rank_)];
    g_->p2p_cv.wait(lk, [&] {
      return std::all_of(mine.begin(), mine.end(),
                         [](const auto& kv) { return kv.second.inflight == 0; });
    });
    mine.clear();
  }

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return g_->world; }
  void set_timeout(std::chrono::milliseconds t) noexcept override {
    timeout_ = std::max(t, std::chrono::milliseconds(1));
  }
  std::chrono::milliseconds timeout() const noexcept override { return timeout_; }
  std::uint64_t bytes_sent() const noexcept override {
    return g_->sent[static_cast<std::size_t>(rank_)].load(std::memory_order_relaxed);
  }

  Status barrier() override {
    Post p;
    p.op = Op::barrier;
    return collective(std::move(p));
  }

  Status all_reduce_sum(float* data, std::size_t count) override {
    Post p;
    p.op = Op::all_reduce_sum;
    p.recv = data;
    p.count = count;
    if (count > 0 && data == nullptr) p.bad = "data is null";
    return collective(std::move(p));
  }

  Status all_gather(const float* send, std::size_t count, float* recv) override {
    Post p;
    p.op = Op::all_gather;
    p.send = send;
    p.recv = recv;
    p.count = count;
    if (count > 0 && (send == nullptr || recv == nullptr)) p.bad = "null buffer";
    return collective(std::move(p));
  }

  Status reduce_scatter_sum(const float* send, float* recv, std::size_t count) override {
    Post p;
    p.op = Op::reduce_scatter_sum;
    p.send = send;
    p.recv = recv;
    p.count = count;
    if (count > 0 && (send == nullptr || recv == nullptr)) p.bad = "null buffer";
    return collective(std::move(p));
  }

  Status all_to_all(const float* send, float* recv, std::size_t count) override {
    Post p;
    p.op = Op::all_to_all;
    p.send = send;
    p.recv = recv;
    p.count = count;
    const std::size_t total = count * static_cast<std::size_t>(g_->world) * sizeof(float);
    if (count > 0 && (send == nullptr || recv == nullptr)) {
      p.bad = "null buffer";
    } else if (overlaps(send, total, recv, total)) {
      p.bad = "send and recv overlap";
    }
    return collective(std::move(p));
  }

  Status broadcast(float* data, std::size_t count, int root) override {
    Post p;
    p.op = Op::broadcast;
    p.recv = data;
    p.count = count;
    p.root = root;
    if (root < 0 || root >= g_->world) {
      p.bad = "root " + std::to_string(root) + " is out of range [0, " +
              std::to_string(g_->world) + ")";
    } else if (count > 0 && data == nullptr) {
      p.bad = "data is null";
    }
    return collective(std::move(p));
  }

  Status send(const void* data, std::size_t bytes, int peer, int tag) override;
  Status recv(void* data, std::size_t bytes, int peer, int tag) override;
  Status expose(std::string name, const void* data, std::size_t bytes) override;
  Status unexpose(const std::string& name) override;
  Status get(int peer, std::string name, std::size_t offset, void* dst,
             std::size_t bytes) override;
  /// get(), the copy done by `copy` (see inproc_get_with).
  Status get_with(int peer, std::string name, std::size_t offset, std::size_t bytes, const RegionCopy& copy);

 private:
  std::string who(const char* op) const {
    return std::string(op) + ": rank " + std::to_string(rank_);
  }
  Error peer_range_error(const char* op, int peer) const {
    return make_error(ErrorCode::invalid_argument,
                      who(op) + ": peer " + std::to_string(peer) + " is out of range [0, " +
                          std::to_string(g_->world) + ")");
  }
  Error self_dead_error(const char* op) const {
    return make_error(ErrorCode::io, who(op) + " has been marked dead");
  }
  Error peer_dead_error(const char* op, int peer) const {
    return make_error(ErrorCode::io, who(op) + ": peer rank " + std::to_string(peer) + " is dead");
  }

  Status collective(Post post);
  void run_collective(const Post& mine) const;
  /// This rank's share of a collective's traffic in a direct exchange (see
  /// Communicator::bytes_sent).
  std::uint64_t collective_bytes(const Post& mine) const {
    const std::uint64_t n = mine.count, peers = static_cast<std::uint64_t>(g_->world - 1);
    switch (mine.op) {
      case Op::barrier: return 0;
      case Op::all_gather:
      case Op::reduce_scatter_sum:
      case Op::all_to_all: return peers * n * sizeof(float);
      case Op::broadcast: return mine.root == rank_ ? peers * n * sizeof(float) : 0;
      case Op::all_reduce_sum: {
        const auto [b, e] = detail::reduce_slice(mine.count, rank_, g_->world);
        const std::uint64_t own = e - b;
        return ((n - own) + peers * own) * sizeof(float);
      }
    }
    return 0;
  }

  std::shared_ptr<InProcGroup::Impl> g_;
  const int rank_;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
};

Status InProcCommunicator::collective(Post post) {
  auto& g = *g_;
  const Op op = post.op;
  const char* name = op_name(op);
  const auto deadline = deadline_after(timeout_);

  // Barrier 1: post, wait for everyone's post (or a timeout / dead peer).
  {
    std::unique_lock lk(g.coll_mu);
    if (g.is_dead(rank_)) return self_dead_error(name);
    if (g.num_dead > 0) return peer_dead_error(name, g.first_dead());
    post.present = true;
    g.posts[static_cast<std::size_t>(rank_)] = std::move(post);
    const std::uint64_t gen = g.gen1;
    g.attempt_gen[static_cast<std::size_t>(rank_)] = gen;
    if (++g.arrived1 == g.world) {
      g.arrived1 = 0;
      ++g.gen1;
      g.coll_cv.notify_all();
    } else {
      g.coll_cv.wait_until(lk, deadline, [&] { return g.gen1 != gen || g.num_dead > 0; });
      if (g.gen1 == gen) {
        // Not completed: withdraw, so the collective happens on no rank.
        g.posts[static_cast<std::size_t>(rank_)].present = false;
        --g.arrived1;
        if (g.is_dead(rank_)) return self_dead_error(name);
        if (g.num_dead > 0) return peer_dead_error(name, g.first_dead());
        // Name the peers that never arrived at this collective first; peers
        // that arrived but gave up (their own timeout) come second.
        std::string never, gave_up;
        int culprit = -1;
        for (int k = 0; k < g.world; ++k) {
          const auto uk = static_cast<std::size_t>(k);
          if (k == rank_ || g.posts[uk].present) continue;
          std::string& list = g.attempt_gen[uk] == gen ? gave_up : never;
          list += (list.empty() ? "" : ", ") + std::to_string(k);
        }
        for (int pass = 0; pass < 2 && culprit < 0; ++pass) {
          for (int k = 0; k < g.world && culprit < 0; ++k) {
            const auto uk = static_cast<std::size_t>(k);
            if (k == rank_ || g.posts[uk].present) continue;
            if ((g.attempt_gen[uk] == gen) == (pass == 1)) culprit = k;
          }
        }
        std::string detail = "never arrived: " + (never.empty() ? "none" : never);
        if (!gave_up.empty()) detail += "; gave up: " + gave_up;
        return make_error(ErrorCode::io, who(name) + " timed out after " + ms_string(timeout_) +
                                             " waiting for rank " + std::to_string(culprit) +
                                             " (" + detail + "; group of " +
                                             std::to_string(g.world) + ")");
      }
    }
  }

  // Between the barriers `posts` is stable: nobody posts again before
  // barrier 2 completes. Every rank reaches the same verdict.
  const Post& mine = g.posts[static_cast<std::size_t>(rank_)];
  const Post& p0 = g.posts[0];
  Status result;
  for (int k = 0; k < g.world && result.ok(); ++k) {
    const Post& p = g.posts[static_cast<std::size_t>(k)];
    if (!p.bad.empty()) {
      result = make_error(ErrorCode::invalid_argument,
                          who(name) + ": rank " + std::to_string(k) + " passed bad arguments to " +
                              op_name(p.op) + ": " + p.bad);
    } else if (p.op != p0.op || p.count != p0.count ||
               (p0.op == Op::broadcast && p.root != p0.root)) {
      auto describe = [](int r, const Post& q) {
        std::string s = "rank " + std::to_string(r) + " called " + op_name(q.op) +
                        "(count=" + std::to_string(q.count);
        if (q.op == Op::broadcast) s += ", root=" + std::to_string(q.root);
        return s + ")";
      };
      result = make_error(ErrorCode::invalid_argument,
                          who(name) + ": ranks disagree: " + describe(0, p0) + ", " +
                              describe(k, p));
    }
  }
  if (result.ok()) {
    run_collective(mine);
    g.sent[static_cast<std::size_t>(rank_)].fetch_add(collective_bytes(mine),
                                                       std::memory_order_relaxed);
  }

  // Barrier 2: nobody reuses or returns its buffers while peers touch them.
  // Work between the barriers never blocks, so this wait is bounded.
  {
    std::unique_lock lk(g.coll_mu);
    const std::uint64_t gen = g.gen2;
    if (++g.arrived2 == g.world) {
      g.arrived2 = 0;
      ++g.gen2;
      g.coll_cv.notify_all();
    } else {
      g.coll_cv.wait(lk, [&] { return g.gen2 != gen; });
    }
  }
  return result;
}

void InProcCommunicator::run_collective(const Post& mine) const {
  const auto& posts = g_->posts;
  const int w = g_->world;
  const std::size_t n = mine.count;
  const auto r = static_cast<std::size_t>(rank_);
  if (n == 0) return;

  switch (mine.op) {
    case Op::barrier: return;

    case Op::all_reduce_sum: {
      // Rank r owns slice r: sums it in rank order, writes it to every rank.
      const auto [b, e] = detail::reduce_slice(n, rank_, w);
      for (std::size_t i = b; i < e; ++i) {
        float acc = posts[0].recv[i];
        for (int k = 1; k < w; ++k) acc += posts[static_cast<std::size_t>(k)].recv[i];
        for (int k = 0; k < w; ++k) posts[static_cast<std::size_t>(k)].recv[i] = acc;
      }
      return;
    }

    case Op::reduce_scatter_sum: {
      const std::size_t off = r * n;
      float* out = mine.recv;
      for (std::size_t i = 0; i < n; ++i) {
        float acc = posts[0].send[off + i];
        for (int k = 1; k < w; ++k) acc += posts[static_cast<std::size_t>(k)].send[off + i];
        out[i] = acc;
      }
      return;
    }

    case Op::all_gather: {
      for (int k = 0; k < w; ++k) {
        const float* src = posts[static_cast<std::size_t>(k)].send;
        float* dst = mine.recv + static_cast<std::size_t>(k) * n;
        if (src != dst) std::memmove(dst, src, n * sizeof(float));
      }
      return;
    }

    case Op::all_to_all: {
      for (int k = 0; k < w; ++k) {
        const float* src = posts[static_cast<std::size_t>(k)].send + r * n;
        std::memcpy(mine.recv + static_cast<std::size_t>(k) * n, src, n * sizeof(float));
      }
      return;
    }

    case Op::broadcast: {
      const float* src = posts[static_cast<std::size_t>(mine.root)].recv;
      if (src != mine.recv) std::memcpy(mine.recv, src, n * sizeof(float));
      return;
    }
  }
}

Status InProcCommunicator::send(const void* data, std::size_t bytes, int peer, int tag) {
  constexpr const char* kOp = "send";
  auto& g = *g_;
  if (peer < 0 || peer >= g.world) return peer_range_error(kOp, peer);
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": data is null");
  }
  std::unique_lock lk(g.p2p_mu);
  if (g.is_dead(rank_)) return self_dead_error(kOp);
  if (g.is_dead(peer)) return peer_dead_error(kOp, peer);

  // A matching recv already posted: copy straight into it (zero-copy path).
  auto& waiting = g.posted[static_cast<std::size_t>(peer)];
  for (auto it = waiting.begin(); it != waiting.end(); ++it) {
    PostedRecv* pr = *it;
    if (pr->src != rank_ || pr->tag != tag) continue;
    waiting.erase(it);
    if (pr->bytes != bytes) {
      pr->error = "message of " + std::to_string(bytes) + " bytes from rank " +
                  std::to_string(rank_) + " (tag " + std::to_string(tag) + "), expected " +
                  std::to_string(pr->bytes);
      pr->state = PostedRecv::State::done;
      g.p2p_cv.notify_all();
      break;  // the recv fails; the message is queued as if it had come first
    }
    pr->state = PostedRecv::State::claimed;  // receiver now waits for done
    lk.unlock();
    if (bytes > 0) std::memcpy(pr->dst, data, bytes);
    lk.lock();
    pr->state = PostedRecv::State::done;
    g.p2p_cv.notify_all();
    if (peer != rank_) g.sent[static_cast<std::size_t>(rank_)].fetch_add(bytes, std::memory_order_relaxed);
    return Status();
  }

  QueuedMsg m;
  m.src = rank_;
  m.tag = tag;
  m.bytes.resize(bytes);
  if (bytes > 0) std::memcpy(m.bytes.data(), data, bytes);
  g.inbox[static_cast<std::size_t>(peer)].push_back(std::move(m));
  if (peer != rank_) g.sent[static_cast<std::size_t>(rank_)].fetch_add(bytes, std::memory_order_relaxed);
  return Status();
}

Status InProcCommunicator::recv(void* data, std::size_t bytes, int peer, int tag) {
  constexpr const char* kOp = "recv";
  auto& g = *g_;
  if (peer < 0 || peer >= g.world) return peer_range_error(kOp, peer);
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": data is null");
  }
  const auto deadline = deadline_after(timeout_);
  std::unique_lock lk(g.p2p_mu);
  if (g.is_dead(rank_)) return self_dead_error(kOp);

  // Already queued? Messages sent before a peer died are still delivered.
  auto& q = g.inbox[static_cast<std::size_t>(rank_)];
  for (auto it = q.begin(); it != q.end(); ++it) {
    if (it->src != peer || it->tag != tag) continue;
    if (it->bytes.size() != bytes) {
      return make_error(ErrorCode::mismatch,
                        who(kOp) + ": message from rank " + std::to_string(peer) + " (tag " +
                            std::to_string(tag) + ") has " + std::to_string(it->bytes.size()) +
                            " bytes, expected " + std::to_string(bytes));
    }
    std::vector<std::byte> payload = std::move(it->bytes);
    q.erase(it);
    lk.unlock();
    if (bytes > 0) std::memcpy(data, payload.data(), bytes);
    return Status();
  }
  if (g.is_dead(peer)) return peer_dead_error(kOp, peer);

  PostedRecv pr;
  pr.src = peer;
  pr.tag = tag;
  pr.dst = data;
  pr.bytes = bytes;
  auto& mine = g.posted[static_cast<std::size_t>(rank_)];
  mine.push_back(&pr);
  g.p2p_cv.wait_until(lk, deadline, [&] {
    return pr.state != PostedRecv::State::waiting || g.is_dead(peer) || g.is_dead(rank_);
  });
  if (pr.state == PostedRecv::State::waiting) {
    mine.remove(&pr);
    if (g.is_dead(rank_)) return self_dead_error(kOp);
    if (g.is_dead(peer)) return peer_dead_error(kOp, peer);
    return make_error(ErrorCode::io, who(kOp) + " timed out after " + ms_string(timeout_) +
                                         " waiting for rank " + std::to_string(peer) + " (tag " +
                                         std::to_string(tag) + ", " + std::to_string(bytes) +
                                         " bytes)");
  }
  // Claimed: the sender is copying into `data`; that copy never blocks.
  g.p2p_cv.wait(lk, [&] { return pr.state == PostedRecv::State::done; });
  if (!pr.error.empty()) return make_error(ErrorCode::mismatch, who(kOp) + ": " + pr.error);
  return Status();
}

Status InProcCommunicator::expose(std::string name, const void* data, std::size_t bytes) {
  constexpr const char* kOp = "expose";
  if (name.empty()) return make_error(ErrorCode::invalid_argument, who(kOp) + ": empty name");
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": region '" + name + "' is null");
  }
  auto& g = *g_;
  std::unique_lock lk(g.p2p_mu);
  if (g.is_dead(rank_)) return self_dead_error(kOp);
  auto& mine = g.regions[static_cast<std::size_t>(rank_)];
  auto it = mine.find(name);
  if (it != mine.end()) {
    // Replacing: let gets in flight on the old memory finish first.
    g.p2p_cv.wait(lk, [&] { return it->second.inflight == 0; });
    it->second.data = data;
    it->second.bytes = bytes;
  } else {
    mine.emplace(std::move(name), Region{data, bytes, 0});
  }
  return Status();
}

Status InProcCommunicator::unexpose(const std::string& name) {
  constexpr const char* kOp = "unexpose";
  auto& g = *g_;
  std::unique_lock lk(g.p2p_mu);
  auto& mine = g.regions[static_cast<std::size_t>(rank_)];
  auto it = mine.find(name);
  if (it == mine.end()) {
    return make_error(ErrorCode::not_found, who(kOp) + ": no region named '" + name + "'");
  }
  g.p2p_cv.wait(lk, [&] { return it->second.inflight == 0; });
  mine.erase(it);
  return Status();
}

Status InProcCommunicator::get(int peer, std::string name, std::size_t offset, void* dst,
                               std::size_t bytes) {
  if (bytes > 0 && dst == nullptr) {
    return make_error(ErrorCode::invalid_argument, who("get") + ": dst is null");
  }
  return get_with(peer, std::move(name), offset, bytes, [&](const void* src) {
    std::memcpy(dst, src, bytes);
    return Status();
  });
}

Status InProcCommunicator::get_with(int peer, std::string name, std::size_t offset, std::size_t bytes,
                                    const RegionCopy& copy) {
  constexpr const char* kOp = "get";
  auto& g = *g_;
  if (peer < 0 || peer >= g.world) return peer_range_error(kOp, peer);
  std::unique_lock lk(g.p2p_mu);
  if (g.is_dead(rank_)) return self_dead_error(kOp);
  if (g.is_dead(peer)) return peer_dead_error(kOp, peer);
  auto& theirs = g.regions[static_cast<std::size_t>(peer)];
  auto it = theirs.find(name);
  if (it == theirs.end()) {
    return make_error(ErrorCode::not_found, who(kOp) + ": rank " + std::to_string(peer) +
                                                " exposes no region named '" + name + "'");
  }
  Region& region = it->second;
  if (offset > region.bytes || bytes > region.bytes - offset) {
    return make_error(ErrorCode::invalid_argument,
                      who(kOp) + ": bytes [" + std::to_string(offset) + ", " +
                          std::to_string(offset) + " + " + std::to_string(bytes) +
                          ") are outside region '" + name + "' of rank " + std::to_string(peer) +
                          " (" + std::to_string(region.bytes) + " bytes)");
  }
  if (bytes == 0) return Status();
  ++region.inflight;
  lk.unlock();
  Status copied = copy(static_cast<const std::byte*>(region.data) + offset);
  lk.lock();
  if (--region.inflight == 0) g.p2p_cv.notify_all();
  if (copied.ok() && peer != rank_) g.sent[static_cast<std::size_t>(peer)].fetch_add(bytes, std::memory_order_relaxed);
  return copied;
}

}  // namespace

Status inproc_get_with(Communicator& comm, int peer, std::string name, std::size_t offset, std::size_t bytes,
                       const RegionCopy& copy) {
  auto* c = dynamic_cast<InProcCommunicator*>(&comm);
  if (c == nullptr)
    return make_error(ErrorCode::unsupported, "inproc_get_with: not an in-process communicator");
  return c->get_with(peer, std::move(name), offset, bytes, copy);
}

Result<std::shared_ptr<InProcGroup>> InProcGroup::create(int world_size) {
  if (world_size < 1) {
    return make_error(ErrorCode::invalid_argument,
                      "InProcGroup::create: world_size must be >= 1, got " +
                          std::to_string(world_size));
  }
  return std::shared_ptr<InProcGroup>(new InProcGroup(std::make_shared<Impl>(world_size)));
}

int InProcGroup::world_size() const noexcept { return impl_->world; }

Result<std::unique_ptr<Communicator>> InProcGroup::communicator(int rank) {
  if (rank < 0 || rank >= impl_->world) {
    return make_error(ErrorCode::invalid_argument,
                      "InProcGroup::communicator: rank " + std::to_string(rank) +
                          " is out of range [0, " + std::to_string(impl_->world) + ")");
  }
  std::lock_guard lk(impl_->p2p_mu);
  auto& taken = impl_->taken[static_cast<std::size_t>(rank)];
  if (taken) {
    return make_error(ErrorCode::invalid_argument,
                      "InProcGroup::communicator: rank " + std::to_string(rank) +
                          " is already taken");
  }
  taken = 1;
  return std::unique_ptr<Communicator>(std::make_unique<InProcCommunicator>(impl_, rank));
}

Status InProcGroup::mark_dead(int rank) {
  if (rank < 0 || rank >= impl_->world) {
    return make_error(ErrorCode::invalid_argument,
                      "InProcGroup::mark_dead: rank " + std::to_string(rank) +
                          " is out of range [0, " + std::to_string(impl_->world) + ")");
  }
  {
    std::scoped_lock lk(impl_->coll_mu, impl_->p2p_mu);
    auto& d = impl_->dead[static_cast<std::size_t>(rank)];
    if (!d) {
      d = 1;
      ++impl_->num_dead;
    }
  }
  impl_->coll_cv.notify_all();
  impl_->p2p_cv.notify_all();
  return Status();
}

bool InProcGroup::is_dead(int rank) const {
  if (rank < 0 || rank >= impl_->world) return false;
  std::lock_guard lk(impl_->p2p_mu);
  return impl_->is_dead(rank);
}

}  // namespace shardline::comm
