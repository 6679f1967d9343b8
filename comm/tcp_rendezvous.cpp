// TcpGroup (comm/tcp.hpp): checks the options, binds the listening socket,
// runs the rendezvous that builds the full mesh of handshaken connections
// (steps 1-5 in comm/tcp.hpp) and hands them to the data path (TcpComm,
// comm/tcp_comm.hpp).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "comm/tcp.hpp"
#include "comm/tcp_comm.hpp"
#include "comm/tcp_handshake.hpp"
#include "comm/tcp_socket.hpp"

namespace shardline::comm {
namespace tcp_detail {
namespace {

std::string io_text(const IoResult& r, std::chrono::milliseconds timeout) {
  if (r.fail == IoFail::timeout) return "timed out after " + ms_text(timeout);
  return r.text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

std::string refusals_text(const std::vector<std::string>& refused) {
  if (refused.empty()) return {};
  std::string s = "; refused " + std::to_string(refused.size()) + " connection(s): ";
  for (std::size_t i = 0; i < refused.size(); ++i) s += (i ? "; " : "") + refused[i];
  return s;
}

/// Accepts connections until every rank in `expect` has passed the handshake
/// (refusing strangers, wrong keys, duplicates). `on_hello` records a peer.
Status accept_ranks(int listen_fd, const TcpOptions& o, std::uint64_t session,
                    std::vector<int> expect, Clock::time_point deadline,
                    std::vector<Fd>& conns, std::vector<std::string>* hosts,
                    std::vector<int>* ports, const std::string& where, const char* waiting_for) {
  std::vector<std::string> refused;
  while (!expect.empty()) {
    Fd fd;
    IoResult a = accept_until(listen_fd, deadline, fd);
    if (!a.ok()) {
      return make_error(ErrorCode::io,
                        where + (a.fail == IoFail::timeout
                                     ? " timed out after " + ms_text(o.timeout)
                                     : ": " + a.text) +
                            " waiting for rank(s) " + rank_list(expect) + " " + waiting_for +
                            refusals_text(refused));
    }
    const auto hs_deadline = std::min(deadline, Clock::now() + kHandshakeSlice);
    auto h = acceptor_handshake(fd.get(), o, hs_deadline, [&](const Hello& hello) -> std::optional<Error> {
      if (hello.session != session) {
        return make_error(ErrorCode::invalid_argument, "belongs to another group (session differs)");
      }
      if (hello.from < 0 || hello.from >= o.world_size) {
        return make_error(ErrorCode::invalid_argument, "rank " + std::to_string(hello.from) +
                                                           " is out of range [0, " +
                                                           std::to_string(o.world_size) + ")");
      }
      if (conns[static_cast<std::size_t>(hello.from)].valid()) {
        return make_error(ErrorCode::invalid_argument,
                          "rank " + std::to_string(hello.from) +
                              " is already connected (two processes claim that rank)");
      }
      if (std::find(expect.begin(), expect.end(), hello.from) == expect.end()) {
        return make_error(ErrorCode::invalid_argument,
                          "rank " + std::to_string(hello.from) + " does not connect to rank " +
                              std::to_string(o.rank) + " at this stage");
      }
      return std::nullopt;
    });
    if (!h.ok()) {
      refused.push_back(h.error().message);
      continue;
    }
    const int from = h->from;
    if (hosts) {
      (*hosts)[static_cast<std::size_t>(from)] =
          is_wildcard(h->listen_host) ? peer_host(fd.get()) : h->listen_host;
      (*ports)[static_cast<std::size_t>(from)] = h->listen_port;
    }
    conns[static_cast<std::size_t>(from)] = std::move(fd);
    expect.erase(std::find(expect.begin(), expect.end(), from));
  }
  return Status();
}

/// Best effort: tell `fd` that the rendezvous failed.
void send_abort(int fd, const Error& e) {
  if (fd < 0) return;
  (void)send_msg(fd, reject_body(e.code, e.message),
                 Clock::now() + std::chrono::milliseconds(500));
}

/// Rank 0: accepts every rank's registration, sends the address table and
/// session id, awaits every "ready" and answers "go" (steps 2, 3, 5).
Status rendezvous_master(const TcpOptions& o, int listen_fd, int port, Clock::time_point deadline,
                         std::vector<Fd>& conns) {
  const int w = o.world_size;
  const std::string where = "TcpGroup::connect: rank 0";
  std::vector<std::string> hosts(static_cast<std::size_t>(w));
  std::vector<int> ports(static_cast<std::size_t>(w), 0);
  std::vector<int> expect;
  for (int k = 1; k < w; ++k) expect.push_back(k);
  const std::string waiting = "to register at " + endpoint(o.master_host, port);
  if (Status st = accept_ranks(listen_fd, o, 0, expect, deadline, conns, &hosts, &ports, where,
                               waiting.c_str());
      !st.ok()) {
    return st;
  }
  auto abort_all = [&](const Error& e) {
    for (int k = 1; k < w; ++k) send_abort(conns[static_cast<std::size_t>(k)].get(), e);
    return e;
  };
  std::string session_bytes = nonce_bytes(sizeof(std::uint64_t));
  std::uint64_t session = 0;
  std::memcpy(&session, session_bytes.data(), sizeof session);
  if (session == 0) session = 1;
  Writer table;
  table.u8(kTable).u64(session).u32(static_cast<std::uint32_t>(w));
  for (int k = 0; k < w; ++k) {
    table.str(hosts[static_cast<std::size_t>(k)]).u32(static_cast<std::uint32_t>(ports[static_cast<std::size_t>(k)]));
  }
  for (int k = 1; k < w; ++k) {
    if (IoResult r = send_msg(conns[static_cast<std::size_t>(k)].get(), table.b, deadline); !r.ok()) {
      return abort_all(make_error(ErrorCode::io, where + ": sending the address table to rank " +
                                                     std::to_string(k) + " failed: " +
                                                     io_text(r, o.timeout)));
    }
  }
  for (int k = 1; k < w; ++k) {
    std::string m;
    IoResult r = recv_msg(conns[static_cast<std::size_t>(k)].get(), deadline, m);
    if (!r.ok()) {
      return abort_all(make_error(
          ErrorCode::io, where + (r.fail == IoFail::timeout
                                      ? " timed out after " + ms_text(o.timeout) +
                                            " waiting for rank " + std::to_string(k) +
                                            " to connect to its peers"
                                      : ": rank " + std::to_string(k) +
                                            " failed while connecting to its peers: " + r.text)));
    }
    if (static_cast<std::uint8_t>(m[0]) == kReject) {
      return abort_all(rejected(m, where + ": rank " + std::to_string(k) + " could not join"));
    }
    if (static_cast<std::uint8_t>(m[0]) != kReady) {
      return abort_all(make_error(ErrorCode::io, where + ": protocol error from rank " +
                                                     std::to_string(k) + " (expected ready)"));
    }
  }
  const std::string go = Writer().u8(kGo).b;
  for (int k = 1; k < w; ++k) {
    if (IoResult r = send_msg(conns[static_cast<std::size_t>(k)].get(), go, deadline); !r.ok()) {
      return abort_all(make_error(ErrorCode::io, where + ": rank " + std::to_string(k) +
                                                     " went away at the end of the rendezvous: " +
                                                     io_text(r, o.timeout)));
    }
  }
  return Status();
}

/// Rank k > 0: registers with rank 0, connects to ranks 1..k-1, accepts
/// ranks k+1.., reports ready and awaits "go" (steps 2, 4, 5).
Status rendezvous_member(const TcpOptions& o, int listen_fd, int port, Clock::time_point deadline,
                         std::vector<Fd>& conns) {
  const int w = o.world_size;
  const int r = o.rank;
  const std::string where = "TcpGroup::connect: rank " + std::to_string(r);
  const std::string master = endpoint(o.master_host, o.master_port);
  auto fd0 = connect_to(o.master_host, o.master_port, deadline);
  if (!fd0.ok()) {
    return make_error(ErrorCode::io, where + ": cannot reach rank 0 within " + ms_text(o.timeout) +
                                         ": " + fd0.error().message);
  }
  if (Status st = connector_handshake(fd0->get(), o, 0, 0, port, deadline,
                                      where + ": handshake with rank 0 at " + master);
      !st.ok()) {
    return st;
  }
  const int master_fd = fd0->get();
  conns[0] = std::move(fd0).value();
  auto fail = [&](Error e) {
    send_abort(master_fd, e);
    return e;
  };

  std::string m;
  if (IoResult rr = recv_msg(master_fd, deadline, m); !rr.ok()) {
    return make_error(ErrorCode::io,
                      where + (rr.fail == IoFail::timeout
                                   ? " timed out after " + ms_text(o.timeout) +
                                         " waiting for rank 0's address table (other ranks missing?)"
                                   : ": lost rank 0 while waiting for the address table: " + rr.text));
  }
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, where + ": rank 0 aborted the rendezvous");
  Reader rd{m};
  const std::uint8_t type = rd.u8();
  const std::uint64_t session = rd.u64();
  const std::uint32_t n = rd.u32();
  std::vector<std::string> hosts;
  std::vector<int> ports;
  for (std::uint32_t k = 0; k < n && rd.ok && k < 1u << 20; ++k) {
    hosts.push_back(rd.str());
    ports.push_back(static_cast<int>(rd.u32()));
  }
  if (!rd.ok || type != kTable || n != static_cast<std::uint32_t>(w)) {
    return fail(make_error(ErrorCode::io, where + ": protocol error (bad address table from rank 0)"));
  }
  for (int j = 1; j < r; ++j) {
    const std::string peer = endpoint(hosts[static_cast<std::size_t>(j)], ports[static_cast<std::size_t>(j)]);
    auto fd = connect_to(hosts[static_cast<std::size_t>(j)], ports[static_cast<std::size_t>(j)], deadline);
    if (!fd.ok()) {
      return fail(make_error(ErrorCode::io, where + ": cannot reach rank " + std::to_string(j) + ": " +
                                                fd.error().message));
    }
    if (Status st = connector_handshake(fd->get(), o, j, session, port, deadline,
                                        where + ": handshake with rank " + std::to_string(j) + " at " + peer);
        !st.ok()) {
      return fail(st.error());
    }
    conns[static_cast<std::size_t>(j)] = std::move(fd).value();
  }
  std::vector<int> expect;
  for (int k = r + 1; k < w; ++k) expect.push_back(k);
  if (Status st = accept_ranks(listen_fd, o, session, expect, deadline, conns, nullptr, nullptr,
                               where, "to connect");
      !st.ok()) {
    return fail(st.error());
  }
  if (IoResult rr = send_msg(master_fd, Writer().u8(kReady).b, deadline); !rr.ok()) {
    return make_error(ErrorCode::io, where + ": lost rank 0: " + io_text(rr, o.timeout));
  }
  if (IoResult rr = recv_msg(master_fd, deadline, m); !rr.ok()) {
    return make_error(ErrorCode::io,
                      where + (rr.fail == IoFail::timeout
                                   ? " timed out after " + ms_text(o.timeout) +
                                         " waiting for the other ranks to finish connecting"
                                   : ": lost rank 0 at the end of the rendezvous: " + rr.text));
  }
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, where + ": rank 0 aborted the rendezvous");
  if (static_cast<std::uint8_t>(m[0]) != kGo) {
    return make_error(ErrorCode::io, where + ": protocol error (expected go from rank 0)");
  }
  return Status();
}

}  // namespace
}  // namespace tcp_detail

// ---- TcpGroup ----------------------------------------------------------------------

struct TcpGroup::State {
  TcpOptions opts;
  tcp_detail::Fd listener;
  int port = 0;
  bool connected = false;
};

TcpGroup::TcpGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
TcpGroup::TcpGroup(TcpGroup&&) noexcept = default;
TcpGroup& TcpGroup::operator=(TcpGroup&&) noexcept = default;
TcpGroup::~TcpGroup() = default;

int TcpGroup::port() const noexcept { return state_ ? state_->port : 0; }
int TcpGroup::rank() const noexcept { return state_ ? state_->opts.rank : 0; }
int TcpGroup::world_size() const noexcept { return state_ ? state_->opts.world_size : 0; }

Result<TcpGroup> TcpGroup::listen(TcpOptions o) {
  const std::string where = "TcpGroup::listen: rank " + std::to_string(o.rank);
  if (o.world_size < 1) {
    return make_error(ErrorCode::invalid_argument,
                      where + ": world_size must be >= 1, got " + std::to_string(o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return make_error(ErrorCode::invalid_argument, where + ": rank is out of range [0, " +
                                                       std::to_string(o.world_size) + ")");
  }
  if (o.master_port < 0 || o.master_port > 65535 || (o.rank != 0 && o.master_port == 0 && o.world_size > 1)) {
    return make_error(ErrorCode::invalid_argument,
                      where + ": master_port " + std::to_string(o.master_port) +
                          (o.rank != 0 ? " (ranks other than 0 need rank 0's actual port, 1-65535)"
                                       : " is out of range [0, 65535]"));
  }
  if (o.timeout.count() <= 0) {
    return make_error(ErrorCode::invalid_argument, where + ": timeout must be positive");
  }
  auto state = std::make_unique<State>();
  if (o.world_size > 1) {
    const std::string& host = o.rank == 0 ? o.master_host : o.listen_host;
    auto fd = tcp_detail::listen_on(host, o.rank == 0 ? o.master_port : 0);
    if (!fd.ok()) return make_error(fd.error().code, where + ": " + fd.error().message);
    state->port = tcp_detail::bound_port(fd->get());
    state->listener = std::move(fd).value();
  }
  state->opts = std::move(o);
  return TcpGroup(std::move(state));
}

Result<std::unique_ptr<TcpCommunicator>> TcpGroup::create(TcpOptions options) {
  auto g = listen(std::move(options));
  if (!g.ok()) return std::move(g).error();
  return g->connect();
}

Result<std::unique_ptr<TcpCommunicator>> TcpGroup::connect() {
  if (!state_) return make_error(ErrorCode::invalid_argument, "TcpGroup::connect: moved-from group");
  if (state_->connected) {
    return make_error(ErrorCode::invalid_argument, "TcpGroup::connect: rank " +
                                                       std::to_string(state_->opts.rank) +
                                                       ": already called");
  }
  state_->connected = true;
  const TcpOptions& o = state_->opts;
  const auto deadline = tcp_detail::deadline_after(o.timeout);
  std::vector<tcp_detail::Fd> conns(static_cast<std::size_t>(o.world_size));
  if (o.world_size > 1) {
    Status st = o.rank == 0
                    ? tcp_detail::rendezvous_master(o, state_->listener.get(), state_->port, deadline, conns)
                    : tcp_detail::rendezvous_member(o, state_->listener.get(), state_->port, deadline, conns);
    state_->listener.reset();
    if (!st.ok()) return st.error();
  }
  return std::unique_ptr<TcpCommunicator>(
      std::make_unique<tcp_detail::TcpComm>(o.rank, o.world_size, std::move(conns), o.timeout));
}

}  // namespace shardline::comm
