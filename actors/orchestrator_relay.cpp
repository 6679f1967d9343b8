// The orchestrator relay: the node's stable address of its current
// orchestrator. Workers, clients and joined nodes send to it; it asks the
// orchestrator (a request, so that a message the orchestrator never handled
// comes back as request_receiver_down) and hands the reply to the sender.
// Between a kill and the restart it queues. It holds the orchestrator's
// handle, and the orchestrator never holds the relay's (no cycle).
//
// The relay is what the node port publishes, so anyone who can reach the
// port can send it anything. Its control messages (which orchestrator to
// forward to) and exit messages are taken only from actors of this node:
// a remote or anonymous `(orchestrator_atom, actor)` once redirected the
// orchestrator's traffic to a keyless intruder (issue 46, item 1). Refused
// ones are logged and counted (shardline_relay_refused_total). CAF makes
// exit_reason::kill fatal before any handler runs, so only the transport
// can keep a kill out: keyless peers never get past the node port's mutual
// TLS (actors/cluster_tls.hpp; docs/cluster.md, "Threat model").
#include <spdlog/spdlog.h>

#include <deque>
#include <memory>
#include <string>

#include "actors/actors.hpp"
#include "actors/protocol.hpp"

namespace shardline::actors {

namespace {

/// A message waiting for an orchestrator.
struct Pending {
  caf::response_promise promise;
  caf::strong_actor_ptr sender;
  std::string tag;
  std::string bytes;
};

struct RelayState {
  // Not an aggregate: stateful_actor would construct it from the actor
  // pointer (C++20 parenthesized aggregate init) and make `target` itself.
  RelayState() = default;
  caf::actor target;  ///< the current orchestrator; null between a kill and the restart
  std::deque<Pending> pending;
  std::shared_ptr<MetricsRegistry> metrics;  ///< counts refused messages; may be null
  static inline const char* name = "shardline.orchestrator_relay";
};

using RelayActor = caf::stateful_actor<RelayState>;

/// Queued messages at most; beyond, requests are answered with an error and
/// worker messages dropped (their heartbeats and hellos come again).
constexpr std::size_t kMaxPending = 100'000;

void forward(RelayActor* self, Pending p);

void hold(RelayActor* self, Pending p) {
  if (self->state.pending.size() >= kMaxPending) {
    if (!p.promise.async()) p.promise.deliver(caf::make_error(caf::sec::request_receiver_down));
    return;
  }
  self->state.pending.push_back(std::move(p));
}

void forward(RelayActor* self, Pending p) {
  if (!self->state.target) return hold(self, std::move(p));
  const caf::actor target = self->state.target;
  self->request(target, caf::infinite, relayed_atom::value, p.sender, p.tag, p.bytes)
      .then(
          [p](std::string& reply) mutable {
            if (!p.promise.async()) p.promise.deliver(std::move(reply));
          },
          [self, p, target](caf::error& e) mutable {
            // The orchestrator died before it handled this: the next one will.
            if (e == caf::sec::request_receiver_down) {
              if (self->state.target == target) self->state.target = caf::actor();
              return forward(self, std::move(p));
            }
            if (!p.promise.async()) p.promise.deliver(std::move(e));
          });
}

/// Who sent the message being handled, for the log: "node N", or
/// "an anonymous sender".
std::string sender_text(const caf::strong_actor_ptr& s) {
  return s ? "actor " + std::to_string(s->id()) + " of node " + caf::to_string(s->node()) : "an anonymous sender";
}

/// Logs and counts a message refused because it did not come from an actor
/// of this node.
void refuse(RelayActor* self, const std::string& what, const std::string& from) {
  spdlog::warn("orchestrator relay: refused {} from {}: only this node's actors may send it", what, from);
  if (self->state.metrics) self->state.metrics->add("shardline_relay_refused_total", "", 1);
}

/// True when `s` is an actor of this node (not anonymous, not remote).
bool of_this_node(const RelayActor* self, const caf::strong_actor_ptr& s) { return s && s->node() == self->node(); }

caf::behavior relay_behavior(RelayActor* self, std::shared_ptr<MetricsRegistry> metrics) {
  self->state.metrics = std::move(metrics);
  self->set_down_handler([self](caf::down_msg& dm) {
    if (self->state.target && self->state.target.address() == dm.source) self->state.target = caf::actor();
  });
  self->set_exit_handler([self](caf::exit_msg& em) {
    // anon_send_exit names the receiver itself as the source (CAF 0.17
    // send.hpp), also when a peer sends it: so the relay's own address is
    // an anonymous sender here.
    const caf::strong_actor_ptr source = caf::actor_cast<caf::strong_actor_ptr>(em.source);
    const bool anonymous = em.source == self->address();
    if (anonymous || !of_this_node(self, source))
      return refuse(self, "an exit message (" + caf::to_string(em.reason) + ")",
                    anonymous ? sender_text(nullptr) : sender_text(source));
    self->quit(em.reason);
  });
  return {
      [self](msg_atom, std::string& tag, std::string& bytes) {
        // Before make_response_promise(), which moves the sender out of the
        // mailbox element.
        caf::strong_actor_ptr sender = self->current_sender();
        caf::response_promise promise = self->make_response_promise();
        forward(self, Pending{std::move(promise), std::move(sender), std::move(tag), std::move(bytes)});
      },
      [self](orchestrator_atom, caf::actor orchestrator) {
        if (!of_this_node(self, self->current_sender()))
          return refuse(self, "a new orchestrator", sender_text(self->current_sender()));
        RelayState& st = self->state;
        if (st.target) self->demonitor(st.target);
        st.target = std::move(orchestrator);
        self->monitor(st.target);
        std::deque<Pending> queued;
        queued.swap(st.pending);
        if (!queued.empty()) spdlog::info("orchestrator relay: {} queued messages to the new orchestrator", queued.size());
        for (Pending& p : queued) forward(self, std::move(p));
      },
  };
}

}  // namespace

caf::actor spawn_orchestrator_relay(caf::actor_system& sys, std::shared_ptr<MetricsRegistry> metrics) {
  return sys.spawn(relay_behavior, std::move(metrics));
}

}  // namespace shardline::actors
