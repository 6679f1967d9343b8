#include "actors/kv_client.hpp"

#include "actors/protocol.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

Result<messages::KvStoreReply> ask_kv_store(caf::actor_system& system, const caf::actor& store, const ClusterKey& key,
                                            const messages::KvStoreMsg& msg, std::chrono::milliseconds timeout) {
  if (!store) return make_error(ErrorCode::io, "no KV store now (it is restarting)");
  const Signed s = sign(key, messages::encode(msg));
  caf::scoped_actor self{system};
  Result<messages::KvStoreReply> out = make_error(ErrorCode::io, "no reply from the KV store");
  self->request(store, timeout, msg_atom::value, s.tag, s.bytes)
      .receive(
          [&out, &key, &s](std::string& sealed) {
            auto bytes = open_reply(key, s.tag, sealed);
            if (!bytes) {
              out = make_error(ErrorCode::io, "KV store reply: " + bytes.error().message);
              return;
            }
            auto reply = messages::decode_kvstore_reply(*bytes);
            if (!reply) {
              out = make_error(ErrorCode::io, "KV store reply: " + reply.error().to_string());
              return;
            }
            if (auto* e = std::get_if<Error>(&*reply)) {
              out = *e;
              return;
            }
            out = std::move(reply).value();
          },
          [&out, &system](caf::error& e) {
            out = make_error(ErrorCode::io, "KV store: " + system.render(e));
          });
  return out;
}

Result<messages::KvPrefixData> fetch_kv_prefix(caf::actor_system& system, const caf::actor& store,
                                               const ClusterKey& key, std::uint64_t job_id, std::uint64_t request_id,
                                               int max_tokens, std::chrono::milliseconds timeout) {
  auto reply =
      ask_kv_store(system, store, key, messages::FetchPrefix{job_id, request_id, max_tokens, true}, timeout);
  if (!reply) return std::move(reply).error();
  auto* data = std::get_if<messages::KvPrefixData>(&*reply);
  if (data == nullptr) return make_error(ErrorCode::io, "KV store: unexpected reply to fetchPrefix");
  return std::move(*data);
}

ActorKvTarget::ActorKvTarget(caf::actor_system& system, std::shared_ptr<KvStoreLink> link,
                             std::shared_ptr<const ClusterKey> key, std::chrono::milliseconds timeout)
    : system_(system), link_(std::move(link)), key_(std::move(key)), timeout_(timeout) {}

Status ActorKvTarget::flush(const kvstore::KvChunkKey& key, std::span<const std::byte> chunk) {
  const kvstore::KvChunkRef ref{key, 0, chunk.size()};
  return flush_batch(std::span<const kvstore::KvChunkRef>(&ref, 1), chunk);
}

Result<std::vector<std::byte>> ActorKvTarget::fetch(const kvstore::KvChunkKey&) {
  return make_error(ErrorCode::unsupported, "ActorKvTarget: fetch a request's prefix with fetch_kv_prefix");
}

Status ActorKvTarget::flush_batch(std::span<const kvstore::KvChunkRef> chunks, std::span<const std::byte> buffer) {
  return flush_linked(chunks, buffer, {});
}

Status ActorKvTarget::flush_linked(std::span<const kvstore::KvChunkRef> chunks, std::span<const std::byte> buffer,
                                   std::span<const kvstore::PrefixLinkWrite> links) {
  messages::PutChunks put;
  put.links.reserve(links.size());
  for (const kvstore::PrefixLinkWrite& l : links)
    put.links.push_back(messages::PrefixLinkData{l.job_id, l.request_id, l.salt, l.root,
                                                 std::vector<std::uint64_t>(l.names.begin(), l.names.end()),
                                                 std::vector<std::int32_t>(l.tokens.begin(), l.tokens.end())});
  put.chunks.reserve(chunks.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const kvstore::KvChunkRef& c = chunks[i];
    if (Status ok = kvstore::check_chunk_ref(c, i, buffer.size()); !ok) return ok;
    const std::byte* p = buffer.data() + c.offset;
    put.chunks.push_back(messages::KvChunkData{c.key, std::vector<std::byte>(p, p + c.bytes)});
  }
  const auto sent_at = std::chrono::steady_clock::now();
  auto reply = ask_kv_store(system_, link_->get(), *key_, put, timeout_);
  if (!reply) return reply.error();
  auto* acked = std::get_if<messages::ChunksAcked>(&*reply);
  if (acked == nullptr) return make_error(ErrorCode::io, "KV store: unexpected reply to putChunks");
  for (const messages::KvAck& a : acked->acks) acks_.push_back(worker::KvStoreAck{a.job_id, a.request_id, a.tokens});
  for (const messages::LinkWaitData& w : acked->waits)
    waits_.push_back(worker::KvLinkWait{w.job_id, w.request_id, w.name, sent_at});
  return Status::ok_status();
}

std::vector<worker::KvLinkWait> ActorKvTarget::take_link_waits() { return std::exchange(waits_, {}); }

std::vector<worker::KvStoreAck> ActorKvTarget::take_acks() {
  std::vector<worker::KvStoreAck> out;
  out.swap(acks_);
  return out;
}

ActorResumeKvSource::ActorResumeKvSource(caf::actor_system& system, std::shared_ptr<KvStoreLink> link,
                                         std::shared_ptr<const ClusterKey> key, std::chrono::milliseconds timeout)
    : system_(system), link_(std::move(link)), key_(std::move(key)), timeout_(timeout) {}

Result<worker::KvPrefix> ActorResumeKvSource::fetch_prefix(std::uint64_t job_id, std::uint64_t request_id,
                                                           int max_tokens) {
  auto data = fetch_kv_prefix(system_, link_->get(), *key_, job_id, request_id, max_tokens, timeout_);
  if (!data) return std::move(data).error();
  return worker::KvPrefix{data->tokens, std::move(data->chunk), std::move(data->source)};
}

void ActorResumeKvSource::drop_job(std::uint64_t job_id) {
  const caf::actor store = link_->get();
  if (!store) return;  // it restarts; the orchestrator drops the job's KV when the job ends
  const std::vector<std::uint64_t> request_ids;  // the whole job
  const Signed s =
      sign(*key_, messages::encode(messages::KvStoreMsg{messages::DropRequests{job_id, request_ids, ""}}));
  caf::anon_send(store, msg_atom::value, s.tag, s.bytes);
}

ActorPrefixBlockStore::ActorPrefixBlockStore(caf::actor_system& system, std::shared_ptr<KvStoreLink> link,
                                             std::shared_ptr<const ClusterKey> key, std::chrono::milliseconds timeout,
                                             std::chrono::milliseconds fetch_timeout)
    : system_(system), link_(std::move(link)), key_(std::move(key)), timeout_(timeout), fetch_timeout_(fetch_timeout) {}

Result<worker::PrefixPutAck> ActorPrefixBlockStore::put_blocks(std::uint64_t salt,
                                                               std::span<const kvstore::PrefixBlockWrite> blocks) {
  messages::PutPrefixBlocks put;
  put.salt = salt;
  put.blocks.reserve(blocks.size());
  for (const kvstore::PrefixBlockWrite& b : blocks)
    put.blocks.push_back(messages::PrefixBlockData{b.name, b.parent, {b.tokens.begin(), b.tokens.end()},
                                                   {b.chunk.begin(), b.chunk.end()}});
  auto reply = ask_kv_store(system_, link_->get(), *key_, put, timeout_);
  if (!reply) return std::move(reply).error();
  auto* data = std::get_if<messages::PrefixBlocksData>(&*reply);
  if (data == nullptr) return make_error(ErrorCode::io, "KV store: unexpected reply to putPrefixBlocks");
  return worker::PrefixPutAck{data->stored, std::move(data->kept)};
}

Result<std::vector<kvstore::StoredPrefixBlock>> ActorPrefixBlockStore::fetch_blocks(
    std::uint64_t salt, std::span<const kvstore::PrefixBlockQuery> queries) {
  messages::FetchPrefixBlocks fetch;
  fetch.salt = salt;
  fetch.blocks.reserve(queries.size());
  for (const kvstore::PrefixBlockQuery& q : queries)
    fetch.blocks.push_back(messages::PrefixBlockData{q.name, q.parent, {q.tokens.begin(), q.tokens.end()}, {}});
  auto reply = ask_kv_store(system_, link_->get(), *key_, fetch, fetch_timeout_);
  if (!reply) return std::move(reply).error();
  auto* data = std::get_if<messages::PrefixBlocksData>(&*reply);
  if (data == nullptr) return make_error(ErrorCode::io, "KV store: unexpected reply to fetchPrefixBlocks");
  std::vector<kvstore::StoredPrefixBlock> out;
  out.reserve(data->blocks.size());
  for (messages::PrefixBlockData& b : data->blocks)
    out.push_back(kvstore::StoredPrefixBlock{b.name, b.parent, std::move(b.tokens), std::move(b.chunk)});
  return out;
}

}  // namespace shardline::actors
