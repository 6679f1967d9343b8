#pragma once
// A test's stand-in for a node or client process on the network: its own
// CAF actor system (middleman loaded, CAF's console log quiet) with the
// cluster TLS transport of `key` started (actors/cluster_tls.hpp).

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdint>
#include <memory>

#include "actors/cluster_tls.hpp"

namespace shardline::actors {

struct TlsEndpoint {
  explicit TlsEndpoint(const ClusterKey& key, std::shared_ptr<MetricsRegistry> metrics = nullptr) {
    cfg.load<caf::io::middleman>();
    cfg.set("logger.console-verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    auto made = ClusterTls::create(key, std::move(metrics));
    EXPECT_TRUE(made);
    if (made) tls = *made;
    if (tls) tls->start(*sys);
  }
  ~TlsEndpoint() {
    if (tls) tls->stop();
    sys.reset();
  }
  TlsEndpoint(const TlsEndpoint&) = delete;
  TlsEndpoint& operator=(const TlsEndpoint&) = delete;

  /// The actor published on 127.0.0.1:`port`, over TLS.
  [[nodiscard]] Result<caf::actor> connect(int port) {
    if (!tls) return make_error(ErrorCode::internal, "no TLS transport");
    return tls->connect("127.0.0.1", static_cast<std::uint16_t>(port));
  }

  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<ClusterTls> tls;
};

}  // namespace shardline::actors
