#pragma once
/// \file
/// How actors talk: every message is `(shardline_msg_atom, tag, bytes)` where
/// `bytes` is an encoded Cap'n Proto message (messages/codec.hpp) for the
/// receiving actor and `tag` is HMAC-SHA256(cluster secret, bytes)
/// (actors/auth.hpp). Replies are plain encoded bytes. Internal timers use
/// their own atoms and never leave the actor.

#include <caf/all.hpp>

#include <string>

#include "actors/auth.hpp"

namespace shardline::actors {

using msg_atom = caf::atom_constant<caf::atom("slmsg")>;      ///< (msg_atom, tag, bytes)
using step_atom = caf::atom_constant<caf::atom("slstep")>;    ///< worker: run one engine step
using beat_atom = caf::atom_constant<caf::atom("slbeat")>;    ///< worker: send a heartbeat
using tick_atom = caf::atom_constant<caf::atom("sltick")>;    ///< orchestrator: periodic work

/// A signed message ready to send: (msg_atom, tag, bytes).
struct Signed {
  std::string tag;
  std::string bytes;
};

[[nodiscard]] inline Signed sign(const ClusterKey& key, std::string bytes) {
  std::string tag = key.sign(bytes);
  return Signed{std::move(tag), std::move(bytes)};
}

}  // namespace shardline::actors
