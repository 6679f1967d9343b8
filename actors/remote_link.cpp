// The joined node's link to the orchestrator's node: a stable local address
// for its workers and KV store that forwards each (msg_atom, tag, bytes) to
// the remote relay as sent by the original sender (send_as: the
// orchestrator answers and registers the worker itself, not this link).
// When the connection is lost (the orchestrator's node was killed) it
// queues what arrives and reconnects every `retry`; once the node is back,
// the queue goes out and the workers' next heartbeats make the new
// orchestrator ask them to say hello again with the lines they hold.
#include <spdlog/spdlog.h>

#include <caf/io/all.hpp>

#include <deque>

#include "actors/actors.hpp"
#include "actors/cluster_tls.hpp"
#include "actors/protocol.hpp"
#include "comm/address.hpp"

namespace shardline::actors {

namespace {

using connect_atom = caf::atom_constant<caf::atom("slconn")>;

struct Queued {
  caf::actor sender;  ///< null: sent anonymously
  std::string tag;
  std::string bytes;
};

struct LinkState {
  LinkState() = default;
  std::string host;
  std::uint16_t port = 0;
  std::shared_ptr<ClusterTls> tls;  ///< how to reach it
  caf::actor remote;  ///< the orchestrator node's relay; null while disconnected
  std::deque<Queued> queue;
  bool connecting = false;
  static inline const char* name = "shardline.remote_link";
};

using LinkActor = caf::stateful_actor<LinkState>;

/// At most this many messages wait for a reconnect (heartbeats and results
/// of a few workers for minutes); older ones are dropped (heartbeats come
/// again; a dropped result's line is run again).
constexpr std::size_t kMaxQueued = 100'000;
constexpr auto kRetry = std::chrono::milliseconds(500);

void deliver(LinkActor* self, Queued q) {
  if (q.sender)
    caf::send_as(q.sender, self->state.remote, msg_atom::value, std::move(q.tag), std::move(q.bytes));
  else
    caf::anon_send(self->state.remote, msg_atom::value, std::move(q.tag), std::move(q.bytes));
}

void adopt(LinkActor* self, caf::actor remote) {
  LinkState& st = self->state;
  st.remote = std::move(remote);
  self->monitor(st.remote);
  std::deque<Queued> q;
  q.swap(st.queue);
  if (!q.empty()) spdlog::info("link to {}:{}: connected; {} queued messages sent", st.host, st.port, q.size());
  for (Queued& m : q) deliver(self, std::move(m));
}

caf::behavior link_behavior(LinkActor* self, std::shared_ptr<ClusterTls> tls, std::string host, std::uint16_t port,
                            caf::actor remote) {
  LinkState& st = self->state;
  st.tls = std::move(tls);
  st.host = std::move(host);
  st.port = port;
  self->set_down_handler([self](caf::down_msg& dm) {
    LinkState& st = self->state;
    if (!st.remote || st.remote.address() != dm.source) return;
    spdlog::warn("link to {}:{}: the orchestrator's node is gone ({}); reconnecting", st.host, st.port,
                 caf::to_string(dm.reason));
    st.remote = caf::actor();
    if (!st.connecting) {
      st.connecting = true;
      self->delayed_send(self, kRetry, connect_atom::value);
    }
  });
  adopt(self, std::move(remote));
  return {
      [self](msg_atom, std::string& tag, std::string& bytes) {
        LinkState& st = self->state;
        Queued q{caf::actor_cast<caf::actor>(self->current_sender()), std::move(tag), std::move(bytes)};
        if (st.remote) return deliver(self, std::move(q));
        if (st.queue.size() >= kMaxQueued) st.queue.pop_front();
        st.queue.push_back(std::move(q));
      },
      [self](connect_atom) {
        LinkState& st = self->state;
        // Blocks this (detached) actor's thread for the attempt.
        auto remote = st.tls->connect(st.host, st.port);
        if (!remote) {
          self->delayed_send(self, kRetry, connect_atom::value);
          return;
        }
        st.connecting = false;
        adopt(self, std::move(*remote));
      },
  };
}

}  // namespace

Result<caf::actor> spawn_remote_link(caf::actor_system& sys, std::shared_ptr<ClusterTls> tls,
                                     const std::string& host_port) {
  auto hp = comm::parse_host_port(host_port);
  if (!hp) return std::move(hp).error();
  const auto port = static_cast<std::uint16_t>(hp->second);
  auto remote = tls->connect(hp->first, port);
  if (!remote) return std::move(remote).error();
  return sys.spawn<caf::detached>(link_behavior, std::move(tls), hp->first, port, *remote);
}

}  // namespace shardline::actors
