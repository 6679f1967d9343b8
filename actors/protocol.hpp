#pragma once
/// \file
/// How actors talk: every message is `(shardline_msg_atom, tag, bytes)` where
/// `bytes` is an encoded Cap'n Proto message (messages/codec.hpp) for the
/// receiving actor and `tag` is its signature, valid once: signing time,
/// nonce and HMAC-SHA256 under the cluster key (actors/replay_guard.hpp).
/// A reply to a request is its encoded bytes sealed to the request's tag
/// (seal_reply; the requester checks it with open_reply). Internal timers
/// use their own atoms and never leave the actor; the node-local relay and
/// supervisor atoms never leave the node.

#include <caf/all.hpp>

#include <string>

#include "actors/auth.hpp"
#include "actors/replay_guard.hpp"

namespace shardline::actors {

using msg_atom = caf::atom_constant<caf::atom("slmsg")>;      ///< (msg_atom, tag, bytes)
using step_atom = caf::atom_constant<caf::atom("slstep")>;    ///< worker: run one engine step
using beat_atom = caf::atom_constant<caf::atom("slbeat")>;    ///< worker: send a heartbeat
using tick_atom = caf::atom_constant<caf::atom("sltick")>;    ///< orchestrator: periodic work
/// relay -> orchestrator: (relayed_atom, original sender, tag, bytes); the
/// orchestrator's reply goes back through the relay.
using relayed_atom = caf::atom_constant<caf::atom("slrelay")>;
/// supervisor -> relay: (orchestrator_atom, actor), the current orchestrator.
using orchestrator_atom = caf::atom_constant<caf::atom("slorch")>;
/// orchestrator -> KV store: (ring_atom, tag, bytes, std::vector<caf::actor>)
/// where bytes is a signed KvStoreMessage setRing and the handles are the
/// stores it names, in its order.
using ring_atom = caf::atom_constant<caf::atom("slring")>;

/// A signed message ready to send: (msg_atom, tag, bytes).
struct Signed {
  std::string tag;
  std::string bytes;
};

[[nodiscard]] inline Signed sign(const ClusterKey& key, std::string bytes) {
  std::string tag = make_message_tag(key, bytes);
  return Signed{std::move(tag), std::move(bytes)};
}

}  // namespace shardline::actors
