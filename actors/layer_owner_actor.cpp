// The SiDP layer-owner actor (seed 002 §4.1): a thin behaviour around one
// rank's model::sidp::LayerOwner inside the node's engine::SidpNodeGroup.
#include <spdlog/spdlog.h>

#include "actors/actors.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

namespace {

struct OwnerState {
  LayerOwnerConfig config;
  bool loaded = false;
  /// A kill (or a crash) withdraws and frees the layers: ranks reading them
  /// wait until the supervisor's respawn loads them again.
  ~OwnerState() {
    if (loaded && config.sidp) config.sidp->unload_owner(config.rank);
  }
  static inline const char* name = "shardline.layer_owner";
};

using OwnerActor = caf::stateful_actor<OwnerState>;

void say_hello(OwnerActor* self) {
  const OwnerState& st = self->state;
  const engine::SidpOwnerState owner = st.config.sidp->owner_state(st.config.rank);
  messages::LayerOwnerHello hello;
  hello.owner_name = st.config.name;
  hello.node = st.config.node_name;
  hello.group = st.config.group_name;
  hello.rank = static_cast<std::uint32_t>(st.config.rank);
  for (int l : owner.layers) hello.layers.push_back(static_cast<std::uint32_t>(l));
  hello.loaded = owner.loaded;
  hello.weight_bytes = hello.loaded ? owner.weight_bytes : 0;
  hello.loads = static_cast<std::uint32_t>(owner.loads);
  const Signed s = sign(*st.config.key, messages::encode(messages::OrchestratorMsg{std::move(hello)}));
  self->send(st.config.orchestrator, msg_atom::value, s.tag, s.bytes);
}

caf::behavior owner_behavior(OwnerActor* self, LayerOwnerConfig config) {
  self->state.config = std::move(config);
  OwnerState& st = self->state;
  // Pack the owned layers from the host copy of the model and expose them.
  if (Status ok = st.config.sidp->load_owner(st.config.rank); !ok) {
    spdlog::error("layer owner {}: cannot load its layers: {}", st.config.name, ok.error().to_string());
    self->quit(caf::exit_reason::unhandled_exception);  // the supervisor tries again
    return {};
  }
  st.loaded = true;
  const engine::SidpOwnerState owner = st.config.sidp->owner_state(st.config.rank);
  spdlog::info("layer owner {}: {} FFN layers loaded and exposed ({} bytes{}, load #{})", st.config.name,
               owner.layers.size(), owner.weight_bytes, st.config.sidp->cuda() ? " of GPU memory" : "", owner.loads);
  say_hello(self);
  self->delayed_send(self, std::chrono::milliseconds(st.config.heartbeat_ms), beat_atom::value);
  return {
      [self](beat_atom) {
        say_hello(self);
        self->delayed_send(self, std::chrono::milliseconds(self->state.config.heartbeat_ms), beat_atom::value);
      },
      [](const std::string&) {},  // the orchestrator's replies
  };
}

}  // namespace

caf::actor spawn_layer_owner(caf::actor_system& sys, LayerOwnerConfig config) {
  return sys.spawn<caf::detached>(owner_behavior, std::move(config));
}

}  // namespace shardline::actors
