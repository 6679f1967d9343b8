#pragma once
/// \file
/// TCP communicator backend: the ranks of a group are processes (or, in
/// tests, threads) on one or several hosts connected by a full mesh of TCP
/// connections.
///
/// Why plain POSIX sockets + poll: this is Shardline's own data path, and the
/// collective libraries Debian packages do not give the Communicator contract:
/// Gloo (libgloo-dev, a 2022 snapshot) sums in ring order (not rank order, so
/// not bit-identical to the in-process backend), reports failures by throwing,
/// and needs a separate key-value store for rendezvous; Open MPI needs its
/// launcher and, by default, aborts the whole job when a peer dies. The
/// socket layer is small and keeps timeouts, dead peers and the deterministic
/// reductions under our control.
///
///   // rank 0                                   // rank k (other process)
///   TcpOptions o{.rank = 0, .world_size = 4};   TcpOptions o{.rank = k, .world_size = 4,
///   auto g = TcpGroup::listen(o).value();                    .master_port = port};
///   int port = g.port();  // tell the others    auto comm = TcpGroup::create(o).value();
///   auto comm = g.connect().value();
///
/// Rendezvous (TcpGroup::connect, bounded by TcpOptions::timeout):
///  1. Every rank listens on a socket of its own (rank 0's is the master
///     socket at master_host:master_port; port 0 picks a free port).
///  2. Ranks 1.. connect to the master (retrying while it is not up yet),
///     pass the handshake (below) and register their listening address;
///     that connection becomes their data connection with rank 0.
///  3. Once all have registered, rank 0 sends every rank the address table
///     and a random session id.
///  4. Rank k connects to ranks 1..k-1 and accepts ranks k+1..world-1 (the
///     higher rank always connects), with the handshake, session id included.
///  5. Every rank reports "meshed" to rank 0, which answers "go" once all have:
///     connect() succeeds on every rank or fails on every rank.
/// A listening address of "0.0.0.0" (or "") is advertised as the address
/// rank 0 saw the registration come from.
///
/// Handshake: the connecting side sends a hello (protocol version, world
/// size, both ranks, session id, a 32-byte random nonce); the accepting side
/// answers with its own nonce and, when a key is set, proves knowledge of it
/// with HMAC-SHA256(key, "acceptor" | hello | nonce); the connecting side
/// checks that and proves its own with HMAC-SHA256(key, "connector" | hello |
/// nonce). Both sides must use a key or both none. A rank with a wrong key is
/// refused: its connect() fails with invalid_argument ("... wrong key ...");
/// the accepting side drops that connection and keeps waiting for the right
/// rank (its error, if the wait then times out, lists the refused attempts).
/// The key authenticates who joins; it does not encrypt or sign the data
/// that follows, so run groups on a trusted network.
///
/// Data path: every message is a frame (40-byte header: kind, tag, payload
/// bytes, collective sequence / request id, count, root, ...; host byte
/// order, little-endian hosts only) written whole under a per-connection
/// mutex. One receiver thread per group reads all connections with poll and
/// queues the frames per (peer, tag) for recv and per (peer, collective
/// sequence) for collectives; one responder thread answers gets from the
/// exposed regions. Because the receiver always drains, sends never wait for
/// the matching recv. Collectives are the direct exchanges of comm/exchange.hpp
/// (deterministic rank-order sums, bit-identical to the in-process backend),
/// on a frame kind of their own, so they use no user tags.
///
/// Failures: a connection that closes or resets (EOF, ECONNRESET, EPIPE)
/// marks its peer dead; calls that need it fail with io naming op, rank and
/// peer, and messages the peer sent before dying are still delivered. Every
/// wait is bounded by the timeout. A collective that fails with io poisons
/// the group: it may have completed on some ranks and not on others, so every
/// later collective fails with io at once ("poisoned by ...") — destroy the
/// communicators and rebuild the group. (invalid_argument does not poison.)
/// Point to point and get with live peers keep working after poisoning.
///
/// Threads: unlike the interface's general rule, send, recv, expose,
/// unexpose, get and set_timeout of a TcpCommunicator may be called from
/// several threads at once (so several sub-groups over one TCP group can run
/// concurrently); collectives must still come from one thread at a time.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "common/result.hpp"

namespace shardline::comm {

struct TcpOptions {
  int rank = 0;        ///< this process's rank, in [0, world_size)
  int world_size = 1;  ///< >= 1
  /// Where rank 0 listens and the others connect. Rank 0 binds it (port 0:
  /// any free port, read it back with TcpGroup::port()); other ranks need the
  /// actual port (> 0).
  std::string master_host = "127.0.0.1";
  int master_port = 0;
  /// Bounds the whole rendezvous, and is the communicator's initial
  /// timeout (Communicator::set_timeout changes the latter).
  std::chrono::milliseconds timeout = kDefaultTimeout;
  /// Address this rank's own listening socket binds (ranks != 0) and
  /// advertises to its peers; "0.0.0.0" or "" binds all interfaces and lets
  /// rank 0 advertise the address it sees.
  std::string listen_host = "127.0.0.1";
  /// Shared secret every rank must know (any bytes); empty = no check.
  std::string key;
};

/// The TCP communicator of one rank. Adds traffic counters and health to the
/// Communicator interface.
class TcpCommunicator : public Communicator {
 public:
  /// Payload bytes received from peers (recv payloads, collective shares,
  /// get answers) since creation; the counterpart of bytes_sent().
  [[nodiscard]] virtual std::uint64_t bytes_received() const noexcept = 0;
  /// Bytes written to / read from the sockets since the rendezvous ended,
  /// frame headers included.
  [[nodiscard]] virtual std::uint64_t wire_bytes_sent() const noexcept = 0;
  [[nodiscard]] virtual std::uint64_t wire_bytes_received() const noexcept = 0;
  /// Whether this rank's connection to `peer` is gone (false for self and
  /// out-of-range peers).
  [[nodiscard]] virtual bool peer_dead(int peer) const = 0;
  /// Empty while collectives can run; otherwise why the group is poisoned.
  [[nodiscard]] virtual std::string poisoned() const = 0;
};

/// Rendezvous in two steps, so that a test (or a launcher) can bind rank 0's
/// master port first, read it, and only then start the other ranks.
class TcpGroup {
 public:
  /// Checks the options and binds this rank's listening socket (rank 0: the
  /// master socket). Does not block. Errors: invalid_argument (rank,
  /// world_size, ports, timeout), io (the address cannot be resolved or
  /// bound).
  [[nodiscard]] static Result<TcpGroup> listen(TcpOptions options);

  /// listen() then connect().
  [[nodiscard]] static Result<std::unique_ptr<TcpCommunicator>> create(TcpOptions options);

  TcpGroup(TcpGroup&&) noexcept;
  TcpGroup& operator=(TcpGroup&&) noexcept;
  ~TcpGroup();

  /// The port this rank listens on: on rank 0 the master port actually bound
  /// (the one the other ranks must be given); 0 for a group of 1.
  [[nodiscard]] int port() const noexcept;
  [[nodiscard]] int rank() const noexcept;
  [[nodiscard]] int world_size() const noexcept;

  /// Runs the rendezvous (blocks up to options.timeout) and returns the
  /// communicator; the listening socket is closed afterwards. Once only.
  /// Errors: io (a rank did not show up in time, a connection failed; the
  /// message names the missing ranks), invalid_argument (wrong or missing
  /// key, mismatched world size or duplicate rank — reported to the rank at
  /// fault; called twice).
  [[nodiscard]] Result<std::unique_ptr<TcpCommunicator>> connect();

  struct State;  // comm/tcp_rendezvous.cpp

 private:
  explicit TcpGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace shardline::comm
