// The KV-store actor: a thin behaviour around kvstore::HostKvStore.
#include "actors/actors.hpp"
#include "actors/inbox.hpp"
#include "actors/protocol.hpp"
#include "kvstore/host_kv_store.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

namespace {

struct KvStoreState {
  KvStoreConfig config;
  std::unique_ptr<kvstore::HostKvStore> store;
  Inbox inbox;
  static inline const char* name = "shardline.kvstore";
};

using Reply = messages::KvStoreReply;

Reply handle(KvStoreState& st, messages::PutBlocks& m) {
  const Status s = st.store->put(m.key, std::move(m.data));
  return s.ok() ? Reply{messages::Ack{}} : Reply{s.error()};
}

Reply handle(KvStoreState& st, const messages::GetBlocks& m) {
  const std::string* d = st.store->get(m.key);
  return messages::BlocksData{m.key, d ? *d : std::string(), d != nullptr};
}

Reply handle(KvStoreState& st, const messages::DropBlocks& m) {
  st.store->drop(m.key);
  return messages::Ack{};
}

Reply handle(KvStoreState& st, const messages::StatsQuery&) {
  const kvstore::HostKvStats s = st.store->stats();
  return messages::KvStoreStats{s.num_entries, s.bytes_used, s.bytes_capacity};
}

caf::behavior kvstore_behavior(caf::stateful_actor<KvStoreState>* self, KvStoreConfig config) {
  self->state.config = std::move(config);
  self->state.store = std::make_unique<kvstore::HostKvStore>(self->state.config.capacity_bytes);
  // Refusals are not counted: the KV store has no metrics registry.
  self->state.inbox = Inbox("kvstore " + self->state.config.name, self->state.config.key, nullptr);
  return {
      [self](msg_atom, const std::string& tag, const std::string& bytes) -> std::string {
        KvStoreState& st = self->state;
        return st.inbox.serve(self->current_sender(), tag, bytes, messages::decode_kvstore,
                              [&st](auto& msg) { return handle(st, msg); });
      },
  };
}

}  // namespace

caf::actor spawn_kvstore(caf::actor_system& sys, KvStoreConfig config) {
  return sys.spawn(kvstore_behavior, std::move(config));
}

}  // namespace shardline::actors
