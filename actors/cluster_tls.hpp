#pragma once
/// \file
/// Mutual TLS on the node port. Every process that holds the cluster key
/// derives the same TLS identity from it (comm/tls_identity.hpp: an Ed25519
/// key from ClusterKey::derive("shardline node tls v1") and a self-signed
/// certificate that is also the only trusted CA), and every BASP connection
/// of the process's actor system (the port a node publishes, a joined node's
/// link, a CLI client) runs over TLS 1.3 with certificates required and
/// verified on both sides. A peer without the key fails the handshake before
/// one BASP byte is read, so it can neither send an actor a message (signed
/// or not, an exit, a link, a routed message naming a local sender) nor
/// read the traffic, which is encrypted. Failed handshakes are logged with
/// the peer's address and counted (shardline_tls_handshake_failures_total).
///
/// Why the transport and not the actors: CAF 0.17's BASP trusts its peers;
/// it takes a routed message's sender node from the header (a peer can name
/// a local actor as the sender), lets a peer link its proxy to any actor,
/// and makes exit_reason::kill fatal before any handler (docs/cluster.md,
/// "Threat model").
///
/// Why not CAF's own OpenSSL module (libcaf_openssl 0.17.6): it never clears
/// OpenSSL's per-thread error queue (its only drain is a log statement,
/// compiled out in Debian's build), so one failed or abruptly closed
/// connection made SSL_get_error misreport the next read of a healthy one,
/// which was then dropped: every `shardline actor list` cut a joined node
/// off. It also loads its identity from files for every connection, and
/// spins on writes while a handshake waits for the peer. This file plugs
/// its own TLS scribe and doorman into CAF's middleman instead (a
/// caf::io::middleman_actor_impl subclass, as libcaf_openssl does).

#include <caf/all.hpp>
#include <caf/io/middleman_actor.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "actors/auth.hpp"
#include "actors/metrics.hpp"
#include "common/result.hpp"

namespace shardline::actors {

struct TlsContext;  // the SSL_CTX and what sessions share (cluster_tls.cpp)

/// The TLS transport of one actor system.
class ClusterTls {
 public:
  /// Derives the identity from `key` and builds the TLS context (TLS 1.3
  /// only, the identity's certificate and key, it as the only trust anchor,
  /// peer certificates required). `metrics`: where failed handshakes are
  /// counted (may be null). Errors: internal (OpenSSL).
  [[nodiscard]] static Result<std::shared_ptr<ClusterTls>> create(const ClusterKey& key,
                                                                 std::shared_ptr<MetricsRegistry> metrics);
  ClusterTls(const ClusterTls&) = delete;
  ClusterTls& operator=(const ClusterTls&) = delete;
  ~ClusterTls();

  /// Spawns the TLS middleman actor in `system` (needs CAF's io::middleman
  /// loaded). Call once, before publish() or connect(); call stop() before
  /// `system` is destroyed.
  void start(caf::actor_system& system);
  /// Stops the TLS middleman actor and waits for it. Idempotent.
  void stop();

  /// Publishes `actor` on HOST:PORT (port 0: any free one) over TLS; returns
  /// the port. SO_REUSEADDR only (a restarted node rebinds at once; a port
  /// another process listens on is an error). Errors: io (names the
  /// address), internal (not started).
  [[nodiscard]] Result<std::uint16_t> publish(const caf::actor& actor, const std::string& host,
                                              std::uint16_t port);
  /// The actor published at HOST:PORT, over TLS. Errors: io ("cannot reach
  /// a node at HOST:PORT: ..."; a node of another cluster key, or a port
  /// that does not speak TLS, fails the handshake: the message says so),
  /// internal (not started).
  [[nodiscard]] Result<caf::actor> connect(const std::string& host, std::uint16_t port);

  /// SHA-256 of the certificate (hex): equal on every node of one cluster.
  [[nodiscard]] const std::string& fingerprint_sha256() const;

 private:
  explicit ClusterTls(std::shared_ptr<TlsContext> context) : context_(std::move(context)) {}
  std::shared_ptr<TlsContext> context_;
  caf::actor_system* system_ = nullptr;
  caf::io::middleman_actor middleman_;
};

}  // namespace shardline::actors
