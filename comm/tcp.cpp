// The TCP data path: the TcpComm methods (comm/tcp_comm.hpp), i.e. point to
// point, collectives over comm/exchange.hpp, one-sided get, and the receiver
// and responder threads.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "comm/tcp_comm.hpp"

namespace shardline::comm::tcp_detail {

// ---- life cycle --------------------------------------------------------------------

TcpComm::TcpComm(int rank, int world, std::vector<Fd> conns, std::chrono::milliseconds timeout)
    : rank_(rank), world_(world) {
  set_timeout(timeout);
  for (int k = 0; k < world; ++k) {
    auto p = std::make_unique<Peer>();
    p->fd = std::move(conns[static_cast<std::size_t>(k)]);
    p->rx.stage.resize(kStageBytes);
    peers_.push_back(std::move(p));
  }
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0) {
    stop_r_ = Fd(fds[0]);
    stop_w_ = Fd(fds[1]);
  }
  receiver_ = std::thread([this] { receive_loop(); });
  responder_ = std::thread([this] { respond_loop(); });
}

TcpComm::~TcpComm() {
  stop_.store(true);
  if (stop_w_.valid()) {
    const char c = 1;
    (void)!::write(stop_w_.get(), &c, 1);  // never drained: stays readable
  }
  {
    std::lock_guard lk(mu_);
  }
  cv_.notify_all();
  resp_cv_.notify_all();
  if (receiver_.joinable()) receiver_.join();
  if (responder_.joinable()) responder_.join();
  // Orderly close: FIN after everything we wrote; drop what is unread so
  // close() does not turn into a reset.
  for (auto& p : peers_) {
    if (!p->fd.valid()) continue;
    ::shutdown(p->fd.get(), SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 256 && ::recv(p->fd.get(), sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
  }
}

void TcpComm::mark_dead(int peer, const std::string& reason) {
  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  {
    std::lock_guard lk(mu_);
    if (p.dead) return;
    p.dead = true;
    p.dead_reason = reason;
    ++num_dead_;
  }
  if (p.fd.valid()) ::shutdown(p.fd.get(), SHUT_WR);  // fail its writers fast; FIN to the peer
  cv_.notify_all();
}

Status TcpComm::send_frame(int peer, const FrameHeader& h, const void* payload,
                           Clock::time_point deadline, const char* op) {
  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  {
    std::lock_guard lk(mu_);
    if (p.dead) return dead_error(op, peer);
  }
  DeadlineGuard lk(p.send_mu);
  if (!lk.acquire(deadline)) {
    return make_error(ErrorCode::io, who(op) + " timed out after " + ms_text(timeout()) +
                                         " waiting for its connection to rank " +
                                         std::to_string(peer) + " to be free");
  }
  iovec iov[2] = {{const_cast<FrameHeader*>(&h), sizeof h},
                  {const_cast<void*>(payload), static_cast<std::size_t>(h.bytes)}};
  std::size_t written = 0;
  const IoResult r = write_all(p.fd.get(), iov, h.bytes > 0 ? 2 : 1, deadline, stop_r_.get(), written);
  wire_sent_.fetch_add(written);
  if (r.ok()) return Status();
  lk.release();
  if (r.fail == IoFail::timeout && written == 0) {
    return make_error(ErrorCode::io, who(op) + " timed out after " + ms_text(timeout()) +
                                         " sending to rank " + std::to_string(peer) +
                                         " (it does not read)");
  }
  // The stream now holds part of a frame (or is gone): the connection is lost.
  std::string reason = r.fail == IoFail::timeout
                           ? "a send timed out after " + ms_text(timeout()) + " mid-frame"
                       : r.fail == IoFail::closed ? "connection closed (" + r.text + ")"
                                                  : r.text;
  mark_dead(peer, reason);
  std::lock_guard g(mu_);
  return dead_error(op, peer);
}

Status TcpComm::take_coll(int peer, std::uint64_t seq, std::uint8_t phase, detail::CollMsg& out,
                          Clock::time_point deadline, const char* op) {
  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  const auto key = std::make_pair(seq, phase);
  std::unique_lock lk(mu_);
  // Any dead member dooms the collective on every rank: stop waiting at once,
  // whichever peer this rank happens to be waiting for.
  cv_.wait_until(lk, deadline,
                 [&] { return p.coll.count(key) > 0 || num_dead_ > 0 || stop_.load(); });
  if (auto it = p.coll.find(key); it != p.coll.end()) {
    out = std::move(it->second);
    p.coll.erase(it);
    return Status();
  }
  if (p.dead) return dead_error(op, peer);
  for (int k = 0; k < world_; ++k) {
    if (peers_[static_cast<std::size_t>(k)]->dead) return dead_error(op, k);
  }
  return make_error(ErrorCode::io, who(op) + " timed out after " + ms_text(timeout()) +
                                       " waiting for rank " + std::to_string(peer) +
                                       " (collective #" + std::to_string(seq) + ", phase " +
                                       std::to_string(phase) + ")");
}

Status TcpComm::collective(const detail::CollCall& call) {
  const char* name = detail::coll_op_name(static_cast<std::uint8_t>(call.op));
  const auto deadline = deadline_after(timeout());
  {
    std::lock_guard lk(mu_);
    if (!poisoned_.empty()) {
      return make_error(ErrorCode::io, who(name) + ": the group is poisoned by an earlier failure (" +
                                           poisoned_ + "); rebuild it");
    }
    for (int k = 0; k < world_; ++k) {
      if (k != rank_ && peers_[static_cast<std::size_t>(k)]->dead) {
        Error e = dead_error(name, k);
        poisoned_ = e.message;
        return e;
      }
    }
  }
  Transport t(*this, deadline);
  std::uint64_t sent = 0;
  const std::uint64_t seq = coll_seq_++;
  Status st = detail::run_collective(t, rank_, world_, seq, call, sent);
  bytes_sent_.fetch_add(sent);
  if (!st.ok() && st.error().code == ErrorCode::io) {
    std::lock_guard lk(mu_);
    if (poisoned_.empty()) poisoned_ = st.error().message;
  }
  return st;
}

Status TcpComm::send(const void* data, std::size_t bytes, int peer, int tag) {
  constexpr const char* kOp = "send";
  if (peer < 0 || peer >= world_) return peer_range_error(kOp, peer);
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": data is null");
  }
  if (bytes > kMaxFrameBytes) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": " + std::to_string(bytes) +
                                                       " bytes is more than one message may carry");
  }
  if (peer == rank_) {
    ByteBuf copy = ByteBuf::allocate(bytes);
    if (!copy.ok()) {
      return make_error(ErrorCode::out_of_memory,
                        who(kOp) + ": cannot buffer " + std::to_string(bytes) + " bytes");
    }
    if (bytes > 0) std::memcpy(copy.data(), data, bytes);
    {
      std::lock_guard lk(mu_);
      peers_[static_cast<std::size_t>(peer)]->p2p[tag].push_back(std::move(copy));
    }
    cv_.notify_all();
    return Status();
  }
  FrameHeader h;
  h.kind = static_cast<std::uint32_t>(Kind::data);
  h.tag = tag;
  h.bytes = bytes;
  Status st = send_frame(peer, h, data, deadline_after(timeout()), kOp);
  if (st.ok()) bytes_sent_.fetch_add(bytes);
  return st;
}

Status TcpComm::recv(void* data, std::size_t bytes, int peer, int tag) {
  constexpr const char* kOp = "recv";
  if (peer < 0 || peer >= world_) return peer_range_error(kOp, peer);
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": data is null");
  }
  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  const auto deadline = deadline_after(timeout());
  std::unique_lock lk(mu_);
  auto queued = [&]() -> std::deque<ByteBuf>* {
    auto it = p.p2p.find(tag);
    return it != p.p2p.end() && !it->second.empty() ? &it->second : nullptr;
  };
  cv_.wait_until(lk, deadline, [&] { return queued() != nullptr || p.dead || stop_.load(); });
  if (auto* q = queued()) {
    if (q->front().size() != bytes) {
      return make_error(ErrorCode::mismatch,
                        who(kOp) + ": message from rank " + std::to_string(peer) + " (tag " +
                            std::to_string(tag) + ") has " + std::to_string(q->front().size()) +
                            " bytes, expected " + std::to_string(bytes));
    }
    ByteBuf msg = std::move(q->front());
    q->pop_front();
    if (q->empty()) p.p2p.erase(tag);
    lk.unlock();
    if (bytes > 0) std::memcpy(data, msg.data(), bytes);
    return Status();
  }
  if (p.dead) return dead_error(kOp, peer);
  return make_error(ErrorCode::io, who(kOp) + " timed out after " + ms_text(timeout()) +
                                       " waiting for rank " + std::to_string(peer) + " (tag " +
                                       std::to_string(tag) + ", " + std::to_string(bytes) +
                                       " bytes)");
}

Status TcpComm::expose(std::string name, const void* data, std::size_t bytes) {
  constexpr const char* kOp = "expose";
  if (name.empty()) return make_error(ErrorCode::invalid_argument, who(kOp) + ": empty name");
  if (bytes > 0 && data == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": region '" + name + "' is null");
  }
  std::unique_lock lk(regions_mu_);
  auto it = regions_.find(name);
  if (it != regions_.end()) {
    regions_cv_.wait(lk, [&] { return it->second.inflight == 0; });  // answers are bounded
    it->second.data = data;
    it->second.bytes = bytes;
  } else {
    regions_.emplace(std::move(name), Region{data, bytes, 0});
  }
  return Status();
}

Status TcpComm::unexpose(const std::string& name) {
  constexpr const char* kOp = "unexpose";
  std::unique_lock lk(regions_mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return make_error(ErrorCode::not_found, who(kOp) + ": no region named '" + name + "'");
  }
  regions_cv_.wait(lk, [&] { return it->second.inflight == 0; });
  regions_.erase(it);
  return Status();
}

Status TcpComm::get(int peer, std::string name, std::size_t offset, void* dst, std::size_t bytes) {
  constexpr const char* kOp = "get";
  if (peer < 0 || peer >= world_) return peer_range_error(kOp, peer);
  if (bytes > 0 && dst == nullptr) {
    return make_error(ErrorCode::invalid_argument, who(kOp) + ": dst is null");
  }
  auto outside = [&](std::uint64_t region_bytes) {
    return make_error(ErrorCode::invalid_argument,
                      who(kOp) + ": bytes [" + std::to_string(offset) + ", " +
                          std::to_string(offset) + " + " + std::to_string(bytes) +
                          ") are outside region '" + name + "' of rank " + std::to_string(peer) +
                          " (" + std::to_string(region_bytes) + " bytes)");
  };
  auto not_found = [&] {
    return make_error(ErrorCode::not_found, who(kOp) + ": rank " + std::to_string(peer) +
                                                " exposes no region named '" + name + "'");
  };
  if (peer == rank_) {
    std::unique_lock lk(regions_mu_);
    auto it = regions_.find(name);
    if (it == regions_.end()) return not_found();
    const Region& r = it->second;
    if (offset > r.bytes || bytes > r.bytes - offset) return outside(r.bytes);
    if (bytes > 0) std::memcpy(dst, static_cast<const std::byte*>(r.data) + offset, bytes);
    return Status();
  }

  Peer& p = *peers_[static_cast<std::size_t>(peer)];
  std::uint64_t id = 0;
  {
    std::lock_guard lk(mu_);
    if (p.dead) return dead_error(kOp, peer);
    id = next_request_++;
    pending_[id];
  }
  const auto deadline = deadline_after(timeout());
  // The get_req payload: u64 bytes, then the name (read back in dispatch).
  const std::uint64_t want = bytes;
  std::string payload(reinterpret_cast<const char*>(&want), sizeof want);
  payload += name;
  FrameHeader h;
  h.kind = static_cast<std::uint32_t>(Kind::get_req);
  h.bytes = payload.size();
  h.id = id;
  h.arg = offset;
  if (Status st = send_frame(peer, h, payload.data(), deadline, kOp); !st.ok()) {
    std::lock_guard lk(mu_);
    pending_.erase(id);
    return st;
  }
  std::unique_lock lk(mu_);
  cv_.wait_until(lk, deadline, [&] { return pending_[id].done || p.dead || stop_.load(); });
  PendingGet answer = std::move(pending_[id]);
  pending_.erase(id);
  if (!answer.done) {
    if (p.dead) return dead_error(kOp, peer);
    return make_error(ErrorCode::io, who(kOp) + " timed out after " + ms_text(timeout()) +
                                         " waiting for rank " + std::to_string(peer) +
                                         " (region '" + name + "')");
  }
  lk.unlock();
  if (answer.status == kGetNotFound) return not_found();
  if (answer.status == kGetOutside) return outside(answer.region_bytes);
  if (answer.data.size() != bytes) {
    return make_error(ErrorCode::io, who(kOp) + ": rank " + std::to_string(peer) + " answered " +
                                         std::to_string(answer.data.size()) + " bytes, expected " +
                                         std::to_string(bytes) + " (protocol error)");
  }
  if (bytes > 0) std::memcpy(dst, answer.data.data(), bytes);
  return Status();
}

// ---- receiver and responder threads --------------------------------------------

void TcpComm::receive_loop() {
  std::vector<pollfd> fds;
  std::vector<int> who;
  while (!stop_.load()) {
    fds.clear();
    who.clear();
    fds.push_back({stop_r_.get(), POLLIN, 0});
    who.push_back(-1);
    for (int k = 0; k < world_; ++k) {
      Peer& p = *peers_[static_cast<std::size_t>(k)];
      if (k == rank_ || !p.fd.valid() || !p.rx.open) continue;
      fds.push_back({p.fd.get(), POLLIN, 0});
      who.push_back(k);
    }
    // Without a stop pipe (pipe2 failed), wake up now and then to see stop_.
    const int n = ::poll(fds.data(), fds.size(), stop_r_.valid() ? -1 : 50);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (fds[0].revents != 0) break;  // stop
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) pump(who[i]);
    }
  }
}

/// Reads what peer k has sent (up to a budget), dispatching complete frames.
void TcpComm::pump(int k) {
  Peer& p = *peers_[static_cast<std::size_t>(k)];
  RxState& rx = p.rx;
  std::size_t budget = kPumpBudget;
  auto lost = [&](const std::string& reason) {
    rx.open = false;
    mark_dead(k, reason);
  };
  while (budget > 0 && rx.open) {
    // Large payload remainders go straight into the payload buffer.
    const bool direct = rx.in_payload && rx.payload.size() - rx.payload_got >= rx.stage.size();
    void* dst = direct ? static_cast<void*>(rx.payload.data() + rx.payload_got) : rx.stage.data();
    const std::size_t cap = direct ? rx.payload.size() - rx.payload_got : rx.stage.size();
    const ssize_t got = ::recv(p.fd.get(), dst, cap, MSG_DONTWAIT);
    if (got == 0) return lost("connection closed");
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return lost(is_closed_errno(errno) ? "connection closed (" + errno_text(errno) + ")"
                                         : errno_text(errno));
    }
    const auto n = static_cast<std::size_t>(got);
    wire_received_.fetch_add(n);
    budget -= std::min(budget, n);
    if (direct) {
      rx.payload_got += n;
      if (rx.payload_got == rx.payload.size()) dispatch(k);
      continue;
    }
    std::size_t pos = 0;
    while (pos < n && rx.open) {
      if (!rx.in_payload) {
        const std::size_t take = std::min(sizeof(FrameHeader) - rx.hdr_got, n - pos);
        std::memcpy(reinterpret_cast<std::byte*>(&rx.hdr) + rx.hdr_got, rx.stage.data() + pos, take);
        rx.hdr_got += take;
        pos += take;
        if (rx.hdr_got < sizeof(FrameHeader)) break;
        const FrameHeader& h = rx.hdr;
        if (h.kind < static_cast<std::uint32_t>(Kind::data) ||
            h.kind > static_cast<std::uint32_t>(Kind::get_resp) || h.bytes > kMaxFrameBytes) {
          return lost("protocol error (bad frame header)");
        }
        rx.payload = ByteBuf::allocate(h.bytes);
        if (!rx.payload.ok()) {
          return lost("out of memory for a " + std::to_string(h.bytes) + "-byte message");
        }
        rx.payload_got = 0;
        rx.in_payload = true;
        if (h.bytes == 0) dispatch(k);
      } else {
        const std::size_t take = std::min(rx.payload.size() - rx.payload_got, n - pos);
        std::memcpy(rx.payload.data() + rx.payload_got, rx.stage.data() + pos, take);
        rx.payload_got += take;
        pos += take;
        if (rx.payload_got == rx.payload.size()) dispatch(k);
      }
    }
  }
}

void TcpComm::dispatch(int k) {
  Peer& p = *peers_[static_cast<std::size_t>(k)];
  RxState& rx = p.rx;
  const FrameHeader h = rx.hdr;
  ByteBuf payload = std::move(rx.payload);
  rx.in_payload = false;
  rx.hdr_got = 0;
  rx.payload_got = 0;
  switch (static_cast<Kind>(h.kind)) {
    case Kind::data: {
      bytes_received_.fetch_add(payload.size());
      {
        std::lock_guard lk(mu_);
        p.p2p[h.tag].push_back(std::move(payload));
      }
      cv_.notify_all();
      return;
    }
    case Kind::coll: {
      bytes_received_.fetch_add(payload.size());
      detail::CollMsg m;
      m.desc.op = h.op;
      m.desc.phase = h.phase;
      m.desc.bad = h.bad;
      m.desc.root = h.root;
      m.desc.seq = h.id;
      m.desc.count = h.arg;
      m.desc.payload_bytes = h.bytes;
      m.payload = std::move(payload);
      {
        std::lock_guard lk(mu_);
        p.coll[std::make_pair(h.id, h.phase)] = std::move(m);
      }
      cv_.notify_all();
      return;
    }
    case Kind::get_req: {
      GetRequest req;
      req.peer = k;
      req.id = h.id;
      req.offset = h.arg;
      if (payload.size() < sizeof(std::uint64_t)) {
        rx.open = false;
        mark_dead(k, "protocol error (short get request)");
        return;
      }
      std::memcpy(&req.bytes, payload.data(), sizeof req.bytes);
      req.name.assign(reinterpret_cast<const char*>(payload.data()) + sizeof req.bytes,
                      payload.size() - sizeof req.bytes);
      {
        std::lock_guard lk(mu_);
        requests_.push_back(std::move(req));
      }
      resp_cv_.notify_one();
      return;
    }
    case Kind::get_resp: {
      bytes_received_.fetch_add(payload.size());
      {
        std::lock_guard lk(mu_);
        auto it = pending_.find(h.id);
        if (it == pending_.end()) return;  // the get gave up
        it->second.done = true;
        it->second.status = h.status;
        it->second.region_bytes = h.arg;
        it->second.data = std::move(payload);
      }
      cv_.notify_all();
      return;
    }
  }
}

void TcpComm::respond_loop() {
  for (;;) {
    GetRequest req;
    {
      std::unique_lock lk(mu_);
      resp_cv_.wait(lk, [&] { return stop_.load() || !requests_.empty(); });
      if (stop_.load()) return;
      req = std::move(requests_.front());
      requests_.pop_front();
    }
    FrameHeader h;
    h.kind = static_cast<std::uint32_t>(Kind::get_resp);
    h.id = req.id;
    const void* src = nullptr;
    Region* region = nullptr;
    {
      std::lock_guard lk(regions_mu_);
      auto it = regions_.find(req.name);
      if (it == regions_.end()) {
        h.status = kGetNotFound;
      } else {
        h.arg = it->second.bytes;
        if (req.offset > it->second.bytes || req.bytes > it->second.bytes - req.offset) {
          h.status = kGetOutside;
        } else {
          h.status = kGetOk;
          h.bytes = req.bytes;
          region = &it->second;
          src = static_cast<const std::byte*>(region->data) + req.offset;
          ++region->inflight;  // unexpose waits until the answer is written
        }
      }
    }
    const Status st = send_frame(req.peer, h, src, deadline_after(timeout()), "get (answer)");
    if (st.ok()) bytes_sent_.fetch_add(h.bytes);
    if (region) {
      {
        std::lock_guard lk(regions_mu_);
        --region->inflight;
      }
      regions_cv_.notify_all();
    }
  }
}

}  // namespace shardline::comm::tcp_detail
