// The KV-store actor: a thin behaviour around kvstore::HostKvStore.
#include <spdlog/spdlog.h>

#include "actors/actors.hpp"
#include "actors/protocol.hpp"
#include "kvstore/host_kv_store.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

namespace {

using messages::KvStoreMsg;
using messages::KvStoreReply;

struct KvStoreState {
  KvStoreConfig config;
  std::unique_ptr<kvstore::HostKvStore> store;
  static inline const char* name = "shardline.kvstore";
};

caf::behavior kvstore_behavior(caf::stateful_actor<KvStoreState>* self, KvStoreConfig config) {
  self->state.config = std::move(config);
  self->state.store = std::make_unique<kvstore::HostKvStore>(self->state.config.capacity_bytes);
  return {
      [self](msg_atom, const std::string& tag, const std::string& bytes) -> std::string {
        KvStoreState& st = self->state;
        if (!st.config.key->verify(bytes, tag)) {
          spdlog::warn("kvstore {}: refused a message with a bad cluster key tag from {}", st.config.name,
                       caf::to_string(self->current_sender()));
          return messages::encode(KvStoreReply::of(
              make_error(ErrorCode::invalid_argument, "unauthenticated: wrong or missing cluster key")));
        }
        auto msg = messages::decode_kvstore(bytes);
        if (!msg) return messages::encode(KvStoreReply::of(msg.error()));
        switch (msg->kind) {
          case KvStoreMsg::Kind::put_blocks: {
            const Status s = st.store->put(msg->put_blocks.key, std::move(msg->put_blocks.data));
            return messages::encode(s.ok() ? KvStoreReply::of(messages::Ack{}) : KvStoreReply::of(s.error()));
          }
          case KvStoreMsg::Kind::get_blocks: {
            const std::string* d = st.store->get(msg->get_blocks.key);
            return messages::encode(KvStoreReply::of(
                messages::BlocksData{msg->get_blocks.key, d ? *d : std::string(), d != nullptr}));
          }
          case KvStoreMsg::Kind::drop_blocks:
            st.store->drop(msg->drop_blocks.key);
            return messages::encode(KvStoreReply::of(messages::Ack{}));
          case KvStoreMsg::Kind::stats_query: {
            const kvstore::HostKvStats s = st.store->stats();
            return messages::encode(KvStoreReply::of(messages::KvStoreStats{s.num_entries, s.bytes_used, s.bytes_capacity}));
          }
        }
        return messages::encode(KvStoreReply::of(make_error(ErrorCode::internal, "unknown message kind")));
      },
  };
}

}  // namespace

caf::actor spawn_kvstore(caf::actor_system& sys, KvStoreConfig config) {
  return sys.spawn(kvstore_behavior, std::move(config));
}

}  // namespace shardline::actors
