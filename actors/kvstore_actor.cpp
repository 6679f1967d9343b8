// The KV-store actor (DéjàVu, seed 003 §4.2.3, issue "KV-store actors with
// RocksDB"): a thin behaviour around kvstore::KvStore (RocksDB under
// DATA/kv plus a host-memory tier) and kvstore::AckTracker (replication
// acks). A worker's PutChunks is stored here, then forwarded to the next
// store of the ring; the reply to the worker carries, per request, the
// positions held by this store and every replica that counts (the paper's
// (x, j, t)). The ring comes from the orchestrator (SetRing, signed, with the
// stores' handles beside it); the store registers through its heartbeats.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "actors/actors.hpp"
#include "actors/inbox.hpp"
#include "actors/protocol.hpp"
#include "kvstore/kv_store.hpp"
#include "kvstore/replication.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {

namespace {

/// How long a store waits for a peer (replication, fetch) before it answers
/// without it.
constexpr auto kPeerTimeout = std::chrono::seconds(3);

struct KvStoreState {
  KvStoreState() = default;
  KvStoreConfig config;
  std::unique_ptr<kvstore::KvStore> store;
  /// Null until the first ring arrives: until then nothing is acknowledged
  /// (the replicas are unknown) and fetches that may ask the ring wait.
  std::unique_ptr<kvstore::AckTracker> tracker;
  std::vector<std::string> ring;               ///< every store, ring order
  std::map<std::string, caf::actor> peers;     ///< every other store of the ring (null: down)
  /// Fetches waiting for the first ring (at most kPeerTimeout).
  struct WaitingFetch {
    messages::FetchPrefix fetch;
    caf::response_promise promise;
    std::string tag;  ///< of the fetch message: its reply is sealed to it
  };
  std::vector<WaitingFetch> waiting_fetches;
  std::uint64_t replicated_tokens = 0;         ///< acked positions since open
  /// Prefix blocks (salt, name) forwarded to each replica since it joined
  /// (a replaced replica starts empty): a catch-up's link sends the others
  /// first. Forgotten wholesale past kMaxForwardedBlocks (sent again).
  std::map<std::string, std::set<std::pair<std::uint64_t, std::uint64_t>>> blocks_at_replica;
  bool refusing = false;  ///< the last put failed (a full disk or the disk budget): logged once until one works
  Inbox inbox;
  static inline const char* name = "shardline.kvstore";
};

using KvStoreActor = caf::stateful_actor<KvStoreState>;
using KvStoreReply = messages::KvStoreReply;

/// `r` encoded and sealed as the reply to the message tagged `tag`
/// (seal_reply).
std::string reply(const KvStoreState& st, std::string_view tag, const KvStoreReply& r) {
  return seal_reply(*st.config.key, tag, messages::encode(r));
}

using ring_timeout_atom = caf::atom_constant<caf::atom("slkvring")>;

constexpr std::size_t kMaxForwardedBlocks = 1u << 20;
/// Chunk bytes of one PutPrefixBlocks a store forwards at most (a message
/// stays well under messages::kMaxMessageBytes).
constexpr std::uint64_t kMaxForwardBlockBytes = 16ull << 20;

void note_forwarded(KvStoreState& st, const std::string& replica, std::uint64_t salt, std::uint64_t name) {
  auto& sent = st.blocks_at_replica[replica];
  if (sent.size() >= kMaxForwardedBlocks) sent.clear();
  sent.insert({salt & ~kvstore::kPrefixBlockJobBit, name});
}

void send_signed(caf::event_based_actor* self, const KvStoreState& st, const caf::actor& to,
                 const messages::KvStoreMsg& m) {
  const Signed sg = sign(*st.config.key, messages::encode(m));
  self->send(to, msg_atom::value, sg.tag, sg.bytes);
}

/// The replica that counts (f = 2: the ring successor): its name ("" when
/// there is none: a single-store ring) and its handle (null while it is
/// down: the orchestrator keeps a dead store in the ring, so that nothing
/// is acknowledged past what the replica holds).
std::pair<std::string, caf::actor> replica_of(const KvStoreState& st) {
  if (!st.tracker || st.tracker->replicas().empty()) return {};
  const std::string& name = st.tracker->replicas().front();
  auto it = st.peers.find(name);
  if (it == st.peers.end()) return {name, caf::actor()};
  return {it->first, it->second};
}

using RequestKey = std::pair<std::uint64_t, std::uint64_t>;

std::vector<RequestKey> requests_of(const messages::PutChunks& m) {
  std::set<RequestKey> keys;
  for (const auto& c : m.chunks) keys.insert({c.key.job_id, c.key.request_id});
  for (const auto& l : m.links) keys.insert({l.job_id, l.request_id});
  return {keys.begin(), keys.end()};
}

/// Stores the chunks and prefix links; returns each distinct request's
/// durable tokens here.
Result<std::map<RequestKey, int>> put_local(KvStoreState& st, const messages::PutChunks& m) {
  std::vector<kvstore::KvChunkWrite> writes;
  writes.reserve(m.chunks.size());
  for (const auto& c : m.chunks) writes.push_back(kvstore::KvChunkWrite{c.key, c.chunk});
  std::vector<kvstore::PrefixLinkWrite> links;
  links.reserve(m.links.size());
  for (const auto& l : m.links)
    links.push_back(kvstore::PrefixLinkWrite{l.job_id, l.request_id, l.salt, l.root, l.names, l.tokens});
  auto durable = st.store->put_many(writes, links);
  if (!durable) return std::move(durable).error();
  std::map<RequestKey, int> out;
  for (std::size_t i = 0; i < m.chunks.size(); ++i)
    out[{m.chunks[i].key.job_id, m.chunks[i].key.request_id}] = (*durable)[i];
  for (std::size_t i = 0; i < m.links.size(); ++i)
    out[{m.links[i].job_id, m.links[i].request_id}] = (*durable)[m.chunks.size() + i];
  return out;
}

/// The requests of `requests` whose prefix link waits here for a block.
std::vector<messages::LinkWaitData> link_waits(const KvStoreState& st, const std::vector<RequestKey>& requests) {
  std::vector<messages::LinkWaitData> out;
  for (const auto& [job, req] : requests)
    if (const std::optional<std::uint64_t> name = st.store->waiting_link_block(job, req))
      out.push_back({job, req, *name});
  return out;
}

messages::ChunksAcked acked(const KvStoreState& st, const std::vector<RequestKey>& requests) {
  messages::ChunksAcked a;
  for (const auto& [job, req] : requests)
    a.acks.push_back({job, req, st.tracker ? st.tracker->acked_tokens(job, req) : 0});
  a.waits = link_waits(st, requests);
  return a;
}

void count_replicated(KvStoreState& st, const std::vector<RequestKey>& requests, const std::map<RequestKey, int>& before) {
  std::uint64_t delta = 0;
  for (const auto& k : requests) {
    const int now = st.tracker->acked_tokens(k.first, k.second);
    auto it = before.find(k);
    const int was = it == before.end() ? 0 : it->second;
    if (now > was) delta += static_cast<std::uint64_t>(now - was);
  }
  st.replicated_tokens += delta;
  if (delta > 0 && st.config.metrics)
    st.config.metrics->add("shardline_kv_replicated_tokens_total", "store=\"" + st.config.name + "\"",
                           static_cast<double>(delta));
}

/// Sends `replica` the blocks of `link` this store keeps and has not
/// forwarded to it since it joined (a replica that started empty, or lost
/// them), ahead of the link (messages between two actors keep their order).
void send_link_blocks(caf::event_based_actor* self, KvStoreState& st, const std::string& replica,
                      const caf::actor& replica_handle, const kvstore::StoredPrefixLink& link) {
  if (link.names.empty() || link.tokens.size() % link.names.size() != 0) return;
  const std::size_t bt = link.tokens.size() / link.names.size();
  const auto& sent = st.blocks_at_replica[replica];
  std::vector<kvstore::PrefixBlockQuery> queries;
  for (std::size_t i = 0; i < link.names.size(); ++i) {
    if (sent.count({link.salt, link.names[i]}) != 0) continue;
    queries.push_back(kvstore::PrefixBlockQuery{link.names[i], i == 0 ? link.root : link.names[i - 1],
                                                std::span<const std::int32_t>(link.tokens).subspan(i * bt, bt)});
  }
  if (queries.empty()) return;
  auto found = st.store->fetch_prefix_blocks(link.salt, queries);
  if (!found) {
    spdlog::warn("kvstore {}: blocks of a link for {}: {}", st.config.name, replica, found.error().to_string());
    return;
  }
  messages::PutPrefixBlocks out;
  out.salt = link.salt;
  out.from_peer = st.config.name;
  std::uint64_t bytes = 0;
  for (kvstore::StoredPrefixBlock& b : *found) {
    if (!out.blocks.empty() && bytes + b.chunk.size() > kMaxForwardBlockBytes) {
      send_signed(self, st, replica_handle, messages::KvStoreMsg{out});
      out.blocks.clear();
      bytes = 0;
    }
    note_forwarded(st, replica, link.salt, b.name);
    bytes += b.chunk.size();
    out.blocks.push_back(messages::PrefixBlockData{b.name, b.parent, std::move(b.tokens), std::move(b.chunk)});
  }
  if (!out.blocks.empty()) send_signed(self, st, replica_handle, messages::KvStoreMsg{out});
}

/// What goes to the replica: the chunks and links, except that a request
/// the replica holds less of than the batch starts at (it restarted, missed
/// a batch while it was down, or waits for a linked block) gets what this
/// store holds of it instead (catch-up): its prefix link, if it has one
/// (the replica links the blocks it keeps: this store forwards every
/// prefix block put here), and its durable positions after the link as
/// one chunk. A link in the batch starts its request at position 0.
messages::PutChunks forward_of(caf::event_based_actor* self, KvStoreState& st, const std::string& replica,
                               const caf::actor& replica_handle, messages::PutChunks m) {
  std::map<RequestKey, int> first;
  const auto note = [&first](const RequestKey& k, int begin) {
    auto it = first.find(k);
    if (it == first.end() || begin < it->second) first[k] = begin;
  };
  for (const auto& c : m.chunks) note({c.key.job_id, c.key.request_id}, c.key.range.token_begin);
  for (const auto& l : m.links) note({l.job_id, l.request_id}, 0);
  std::set<RequestKey> catch_up;
  for (const auto& [k, begin] : first)
    if (st.tracker->replica_tokens(replica, k.first, k.second) < begin) catch_up.insert(k);
  messages::PutChunks out;
  out.from_peer = st.config.name;
  for (auto& l : m.links)
    if (!catch_up.count({l.job_id, l.request_id})) out.links.push_back(std::move(l));
  std::set<RequestKey> merged;  // caught up with a chunk of their durable positions
  for (const RequestKey& k : catch_up) {
    int after_link = 0;
    if (std::optional<kvstore::StoredPrefixLink> link = st.store->prefix_link(k.first, k.second)) {
      after_link = static_cast<int>(link->tokens.size());
      send_link_blocks(self, st, replica, replica_handle, *link);
      out.links.push_back(messages::PrefixLinkData{k.first, k.second, link->salt, link->root, std::move(link->names),
                                                   std::move(link->tokens)});
    }
    const int t = st.store->durable_tokens(k.first, k.second);
    auto prefix = st.store->fetch_prefix(k.first, k.second, t, after_link);
    if (!prefix || prefix->chunk.empty()) continue;
    const kvstore::KvRange range{0, st.config.shape.num_layers, after_link, prefix->tokens};
    out.chunks.push_back(messages::KvChunkData{kvstore::KvChunkKey{k.first, k.second, range}, std::move(prefix->chunk)});
    merged.insert(k);
  }
  // The batch's own chunks, but for requests the merged chunk covers (a
  // request whose link still waits here has nothing durable past it: its
  // chunks go as they came).
  for (auto& c : m.chunks)
    if (!merged.count({c.key.job_id, c.key.request_id})) out.chunks.push_back(std::move(c));
  return out;
}

caf::result<std::string> handle_put(KvStoreActor* self, messages::PutChunks& m, const std::string& tag) {
  KvStoreState& st = self->state;
  const std::vector<RequestKey> requests = requests_of(m);
  auto local = put_local(st, m);
  if (!local) {
    // A cache that cannot store: the writers keep their chunks queued and
    // retry, acks stop, a failed line recomputes what was not stored.
    if (!st.refusing)
      spdlog::warn("kvstore {}: {}; acks stop until a write works again", st.config.name,
                   local.error().to_string());
    st.refusing = true;
    return reply(st, tag, local.error());
  }
  if (st.refusing) spdlog::warn("kvstore {}: stores chunks again", st.config.name);
  st.refusing = false;
  if (!m.from_peer.empty()) {
    // A peer replicating to us: answer with what we hold, and the links
    // that wait for a block it should send again.
    messages::ChunksAcked a;
    for (const auto& [k, t] : *local) a.acks.push_back({k.first, k.second, t});  // put_many's acks
    a.waits = link_waits(st, requests);
    return reply(st, tag, a);
  }
  // No ring yet: stored, not acknowledged (the tracker takes what RocksDB
  // holds when the ring comes).
  if (!st.tracker) return reply(st, tag, acked(st, requests));
  std::map<RequestKey, int> before;
  for (const auto& k : requests) before[k] = st.tracker->acked_tokens(k.first, k.second);
  for (const auto& [k, t] : *local) st.tracker->on_local(k.first, k.second, t);
  auto [replica_name, replica] = replica_of(st);
  if (replica_name.empty()) {  // a single-store ring: its own RocksDB is the copy
    count_replicated(st, requests, before);
    return reply(st, tag, acked(st, requests));
  }
  if (!replica) return reply(st, tag, acked(st, requests));  // the replica is down: no new acks
  const Signed fwd = sign(*st.config.key,
                          messages::encode(messages::KvStoreMsg{forward_of(self, st, replica_name, replica, std::move(m))}));
  auto rp = self->make_response_promise<std::string>();
  self->request(replica, kPeerTimeout, msg_atom::value, fwd.tag, fwd.bytes)
      .then(
          [self, rp, requests, before, replica_name, replica, tag, fwd_tag = fwd.tag](std::string& sealed) mutable {
            KvStoreState& st = self->state;
            auto opened = open_reply(*st.config.key, fwd_tag, sealed);
            if (!opened) spdlog::warn("kvstore {}: replica {}: {}", st.config.name, replica_name, opened.error().message);
            auto r = opened ? messages::decode_kvstore_reply(*opened) : Result<KvStoreReply>(opened.error());
            if (r) {
              if (auto* a = std::get_if<messages::ChunksAcked>(&*r)) {
                for (const messages::KvAck& ack : a->acks)
                  (void)st.tracker->on_replica(replica_name, ack.job_id, ack.request_id, ack.tokens);
                // The replica lacks a linked block it was sent (its budget
                // dropped it, or skipped it): send it again, and the link's
                // blocks after it (which it may have lost as well).
                for (const messages::LinkWaitData& w : a->waits)
                  if (std::optional<kvstore::StoredPrefixLink> link = st.store->prefix_link(w.job_id, w.request_id)) {
                    auto& sent = st.blocks_at_replica[replica_name];
                    const auto from = std::find(link->names.begin(), link->names.end(), w.name);
                    for (auto n = from; n != link->names.end(); ++n) sent.erase({link->salt, *n});
                    send_link_blocks(self, st, replica_name, replica, *link);
                  }
              } else if (auto* e = std::get_if<Error>(&*r))
                spdlog::warn("kvstore {}: replica {} refused a batch: {}", st.config.name, replica_name, e->to_string());
            }
            count_replicated(st, requests, before);
            rp.deliver(reply(st, tag, acked(st, requests)));
          },
          [self, rp, requests, replica_name, tag](caf::error& e) mutable {
            // The replica is down or slow: the chunks are stored here, the
            // acks do not advance; catch-up resends them later.
            spdlog::debug("kvstore {}: replica {} did not answer: {}", self->state.config.name, replica_name,
                          self->system().render(e));
            rp.deliver(reply(self->state, tag, acked(self->state, requests)));
          });
  return rp;
}

/// Answers a fetch into `rp`: this store's prefix, or when it holds fewer
/// positions and `ask_peers`, the longest any live store of the ring holds.
void fetch_into(KvStoreActor* self, const messages::FetchPrefix& m, caf::response_promise rp, const std::string& tag) {
  KvStoreState& st = self->state;
  auto local = st.store->fetch_prefix(m.job_id, m.request_id, m.max_tokens);
  auto best = std::make_shared<messages::KvPrefixData>();
  best->source = st.config.name;
  if (local) {
    best->tokens = local->tokens;
    best->chunk = std::move(local->chunk);
  } else {
    spdlog::warn("kvstore {}: fetch of ({}, {}): {}", st.config.name, m.job_id, m.request_id, local.error().to_string());
  }
  std::vector<caf::actor> live;
  for (const auto& [name, peer] : st.peers)
    if (peer) live.push_back(peer);
  if (best->tokens >= m.max_tokens || !m.ask_peers || live.empty()) {
    rp.deliver(reply(st, tag, std::move(*best)));
    return;
  }
  // Short here: the nearest stores of the ring may hold it (a replica of a
  // failed node's store).
  auto pending = std::make_shared<std::size_t>(live.size());
  messages::FetchPrefix ask = m;
  ask.ask_peers = false;
  const Signed s = sign(*st.config.key, messages::encode(messages::KvStoreMsg{ask}));
  auto done = [self, rp, best, pending, tag]() mutable {
    if (--*pending == 0) rp.deliver(reply(self->state, tag, std::move(*best)));
  };
  for (const caf::actor& peer : live) {
    self->request(peer, kPeerTimeout, msg_atom::value, s.tag, s.bytes)
        .then(
            [self, best, done, ask_tag = s.tag](std::string& sealed) mutable {
              auto opened = open_reply(*self->state.config.key, ask_tag, sealed);
              auto r = opened ? messages::decode_kvstore_reply(*opened) : Result<KvStoreReply>(opened.error());
              if (r)
                if (auto* d = std::get_if<messages::KvPrefixData>(&*r); d && d->tokens > best->tokens) *best = std::move(*d);
              done();
            },
            [done](caf::error&) mutable { done(); });
  }
}

caf::result<std::string> handle_fetch(KvStoreActor* self, const messages::FetchPrefix& m, const std::string& tag) {
  KvStoreState& st = self->state;
  auto rp = self->make_response_promise();
  if (!st.tracker && m.ask_peers) {
    // Just started: the ring (where the other copies are) comes with the
    // orchestrator's answer to the first heartbeat.
    st.waiting_fetches.push_back({m, rp, tag});
    return rp;
  }
  fetch_into(self, m, rp, tag);
  return rp;
}

void serve_waiting_fetches(KvStoreActor* self) {
  auto waiting = std::move(self->state.waiting_fetches);
  self->state.waiting_fetches.clear();
  for (auto& w : waiting) fetch_into(self, w.fetch, std::move(w.promise), w.tag);
}

KvStoreReply handle_drop(KvStoreActor* self, const messages::DropRequests& m) {
  KvStoreState& st = self->state;
  Status s = Status::ok_status();
  if (m.request_ids.empty()) {
    s = st.store->drop_job(m.job_id);
    if (st.tracker) st.tracker->forget_job(m.job_id);
  } else {
    for (std::uint64_t r : m.request_ids) {
      Status one = st.store->drop_request(m.job_id, r);
      if (!one && s) s = one;
      if (st.tracker) st.tracker->forget(m.job_id, r);
    }
  }
  if (m.from_peer.empty()) {
    auto [name, replica] = replica_of(st);
    if (replica) {
      messages::DropRequests fwd = m;
      fwd.from_peer = st.config.name;
      send_signed(self, st, replica, messages::KvStoreMsg{fwd});
    }
  }
  if (!s) return s.error();
  return messages::Ack{};
}

/// The persistent prefix tier's blocks (kvstore/kv_store.hpp "Prefix
/// blocks"). A worker's put is forwarded to the replica (no answer
/// awaited): requests' prefix links are forwarded too, and the replica
/// counts a link's positions only with its blocks. The answer names the
/// blocks kept here after the put.
KvStoreReply handle_put_prefix_blocks(KvStoreActor* self, messages::PutPrefixBlocks& m) {
  KvStoreState& st = self->state;
  std::vector<kvstore::PrefixBlockWrite> writes;
  writes.reserve(m.blocks.size());
  for (const messages::PrefixBlockData& b : m.blocks)
    writes.push_back(kvstore::PrefixBlockWrite{m.salt, b.name, b.parent, b.tokens, b.chunk});
  auto stored = st.store->put_prefix_blocks(writes);
  if (!stored) {
    spdlog::debug("kvstore {}: prefix blocks not kept: {}", st.config.name, stored.error().to_string());
    return stored.error();
  }
  // Links that waited for these blocks count now: the acks that follow
  // say so (the worker hears at its request's next batch).
  for (const kvstore::KvRequestCoverage& r : st.store->take_woken_links())
    if (st.tracker) st.tracker->on_local(r.job_id, r.request_id, r.durable_tokens);
  messages::PrefixBlocksData out{{}, *stored, {}};
  for (const messages::PrefixBlockData& b : m.blocks)
    if (st.store->keeps_prefix_block(m.salt, b.name, b.tokens.size())) out.kept.push_back(b.name);
  if (m.from_peer.empty())
    if (auto [name, replica] = replica_of(st); replica) {
      // Only what the replica says it kept counts as forwarded: a block its
      // budget skipped goes again with a link's catch-up.
      m.from_peer = st.config.name;
      const Signed sg = sign(*st.config.key, messages::encode(messages::KvStoreMsg{m}));
      self->request(replica, kPeerTimeout, msg_atom::value, sg.tag, sg.bytes)
          .then(
              [self, name = name, salt = m.salt, fwd_tag = sg.tag](std::string& sealed) {
                KvStoreState& st = self->state;
                auto opened = open_reply(*st.config.key, fwd_tag, sealed);
                auto r = opened ? messages::decode_kvstore_reply(*opened) : Result<KvStoreReply>(opened.error());
                if (!r) return;
                if (auto* d = std::get_if<messages::PrefixBlocksData>(&*r))
                  for (const std::uint64_t kept : d->kept) note_forwarded(st, name, salt, kept);
              },
              [](caf::error&) {});  // not noted: a link's catch-up sends them
    }
  return out;
}

KvStoreReply handle_fetch_prefix_blocks(KvStoreState& st, const messages::FetchPrefixBlocks& m) {
  std::vector<kvstore::PrefixBlockQuery> queries;
  queries.reserve(m.blocks.size());
  for (const messages::PrefixBlockData& b : m.blocks)
    queries.push_back(kvstore::PrefixBlockQuery{b.name, b.parent, b.tokens});
  auto found = st.store->fetch_prefix_blocks(m.salt, queries);
  if (!found) {
    spdlog::warn("kvstore {}: fetch of prefix blocks: {}", st.config.name, found.error().to_string());
    return found.error();
  }
  messages::PrefixBlocksData out;
  out.blocks.reserve(found->size());
  for (kvstore::StoredPrefixBlock& b : *found)
    out.blocks.push_back(messages::PrefixBlockData{b.name, b.parent, std::move(b.tokens), std::move(b.chunk)});
  return out;
}

messages::KvStoreStats stats_of(const KvStoreState& st) {
  messages::KvStoreStats out;
  out.store_name = st.config.name;
  auto s = st.store->stats();
  if (s) {
    out.num_entries = s->memory_chunks;
    out.bytes_used = s->memory_bytes;
    out.bytes_capacity = s->memory_budget;
    out.disk_bytes = s->disk_bytes;
    out.requests = s->requests;
    out.chunks = s->chunks;
    out.prefix_blocks = s->prefix_blocks;
    out.prefix_bytes = s->prefix_bytes;
    out.prefix_links = s->prefix_links;
    out.linked_tokens = s->linked_tokens;
  }
  const auto lag = st.tracker ? st.tracker->lag() : std::vector<kvstore::ReplicaLag>{};
  if (!lag.empty()) {
    out.replica = lag.front().replica;
    out.lag_tokens = lag.front().tokens_behind;
  }
  out.replicated_tokens = st.replicated_tokens;
  return out;
}

/// The orchestrator's ring: every store in ring order with its handle.
void set_ring(KvStoreActor* self, const messages::SetRing& m, const std::vector<caf::actor>& handles) {
  KvStoreState& st = self->state;
  if (handles.size() != m.names.size()) {
    spdlog::error("kvstore {}: a ring of {} names with {} handles: ignored", st.config.name, m.names.size(),
                  handles.size());
    return;
  }
  auto replicas = kvstore::replica_peers(m.names, st.config.name, st.config.replication_factor);
  if (!replicas) {
    spdlog::warn("kvstore {}: not in the ring: {}", st.config.name, replicas.error().to_string());
    return;
  }
  std::map<std::string, caf::actor> peers;
  for (std::size_t i = 0; i < m.names.size(); ++i)
    if (m.names[i] != st.config.name) peers[m.names[i]] = handles[i];
  const bool first = !st.tracker;
  if (first) {
    // The replicas are known now: what survived in RocksDB counts as held
    // here, and acknowledgements wait for the replica.
    st.tracker = std::make_unique<kvstore::AckTracker>(st.config.replication_factor, *replicas);
    for (const kvstore::KvRequestCoverage& r : st.store->requests())
      st.tracker->on_local(r.job_id, r.request_id, r.durable_tokens);
  }
  const std::vector<std::string> old = first ? std::vector<std::string>{} : st.tracker->replicas();
  for (const std::string& r : *replicas) {
    auto was = st.peers.find(r);
    // Same name, another incarnation (or back from down): it restarted
    // from its RocksDB, which may lack what it missed: start over with it.
    if (was != st.peers.end() && was->second != peers[r]) {
      st.tracker->replica_replaced(r);
      st.blocks_at_replica.erase(r);
    }
  }
  st.tracker->set_replicas(*replicas);
  st.peers = std::move(peers);
  st.ring = m.names;
  if (first || old != *replicas)
    spdlog::info("kvstore {}: replicates to [{}]", st.config.name, fmt::join(*replicas, ", "));
  if (first) serve_waiting_fetches(self);
}

void heartbeat(KvStoreActor* self) {
  KvStoreState& st = self->state;
  const messages::KvStoreStats s = stats_of(st);
  if (st.config.metrics) {
    const std::string l = "store=\"" + st.config.name + "\"";
    st.config.metrics->set("shardline_kv_store_memory_bytes", l, static_cast<double>(s.bytes_used));
    st.config.metrics->set("shardline_kv_store_disk_bytes", l, static_cast<double>(s.disk_bytes));
    st.config.metrics->set("shardline_kv_replication_lag_tokens", l, static_cast<double>(s.lag_tokens));
    st.config.metrics->set("shardline_kv_store_prefix_bytes", l, static_cast<double>(s.prefix_bytes));
    st.config.metrics->set("shardline_kv_linked_tokens_total", l, static_cast<double>(s.linked_tokens));
  }
  if (st.config.orchestrator) {
    const Signed sg = sign(*st.config.key, messages::encode(messages::OrchestratorMsg{messages::KvStoreHeartbeat{s}}));
    self->send(st.config.orchestrator, msg_atom::value, sg.tag, sg.bytes);
  }
}

/// DIR.corrupt-<unix ms>, not yet taken.
std::string quarantine_path(const std::string& dir) {
  std::filesystem::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // trailing '/'
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  for (int i = 0;; ++i) {
    std::string candidate = p.string() + ".corrupt-" + std::to_string(ms) + (i ? "-" + std::to_string(i) : "");
    std::error_code ec;
    if (!std::filesystem::exists(candidate, ec)) return candidate;
  }
}

Result<std::unique_ptr<kvstore::KvStore>> open_store(const KvStoreConfig& c) {
  kvstore::KvStoreOptions o;
  o.shape = c.shape;
  o.host_bytes = c.capacity_bytes;
  o.disk_budget_bytes = c.disk_budget_bytes;
  o.disk_reserve_bytes = c.disk_reserve_bytes;
  o.sync = c.sync;
  o.prefix_budget_bytes = c.prefix_budget_bytes;
  std::error_code mk;
  std::filesystem::create_directories(c.dir, mk);  // a joined node's data dir may not exist yet
  auto store = kvstore::KvStore::open(c.dir, o);
  if (store || store.error().code != ErrorCode::corrupt) return store;
  // A damaged store (a garbled .sst or MANIFEST) or KV of another model: it
  // is a cache of recomputable state, so it is moved aside and the store
  // starts empty; the lines recompute. Failing instead made the store die
  // and restart in a loop (issue 46, item 11). Moved, not deleted: what is
  // in it may matter to whoever debugs the damage.
  const std::string aside = quarantine_path(c.dir);
  std::error_code ec;
  std::filesystem::rename(c.dir, aside, ec);
  if (ec) {
    spdlog::error("kvstore {}: {}; cannot move {} aside ({}): deleting it and starting empty", c.name,
                  store.error().to_string(), c.dir, ec.message());
    std::filesystem::remove_all(c.dir, ec);
  } else {
    spdlog::error("kvstore {}: {}; moved {} to {} and starting empty (delete it when it is of no more use)", c.name,
                  store.error().to_string(), c.dir, aside);
  }
  std::filesystem::create_directories(c.dir, mk);
  return kvstore::KvStore::open(c.dir, o);
}

caf::behavior kvstore_behavior(KvStoreActor* self, KvStoreConfig config) {
  KvStoreState& st = self->state;
  st.config = std::move(config);
  auto store = open_store(st.config);
  if (!store) {
    spdlog::error("kvstore {}: cannot open {}: {}", st.config.name, st.config.dir, store.error().to_string());
    self->quit(caf::exit_reason::unhandled_exception);  // the supervisor tries again
    return {};
  }
  st.store = std::move(store).value();
  st.inbox = Inbox("kvstore " + st.config.name, st.config.key, st.config.metrics);
  spdlog::info("kvstore {} ready: {} ({} requests held, sync {}, replication factor {})", st.config.name,
               st.config.dir, st.store->requests().size(), kvstore::kv_sync_policy_name(st.config.sync),
               st.config.replication_factor);
  heartbeat(self);
  // Fetches that wait for the ring wait this long at most.
  self->delayed_send(self, kPeerTimeout, ring_timeout_atom::value);
  self->delayed_send(self, std::chrono::milliseconds(st.config.heartbeat_ms), beat_atom::value);
  return {
      [self](msg_atom, const std::string& tag, const std::string& bytes) -> caf::result<std::string> {
        KvStoreState& st = self->state;
        if (Status ok = st.inbox.authenticate(self->current_sender(), tag, bytes); !ok)
          return reply(st, tag, ok.error());
        auto msg = messages::decode_kvstore(bytes);
        if (!msg) return reply(st, tag, msg.error());
        if (auto* put = std::get_if<messages::PutChunks>(&*msg)) return handle_put(self, *put, tag);
        if (auto* fetch = std::get_if<messages::FetchPrefix>(&*msg)) return handle_fetch(self, *fetch, tag);
        if (auto* drop = std::get_if<messages::DropRequests>(&*msg)) return reply(st, tag, handle_drop(self, *drop));
        if (auto* put = std::get_if<messages::PutPrefixBlocks>(&*msg))
          return reply(st, tag, handle_put_prefix_blocks(self, *put));
        if (auto* fetch = std::get_if<messages::FetchPrefixBlocks>(&*msg))
          return reply(st, tag, handle_fetch_prefix_blocks(st, *fetch));
        if (std::holds_alternative<messages::StatsQuery>(*msg)) return reply(st, tag, stats_of(st));
        return reply(st, tag, Error{ErrorCode::unsupported, std::string("kvstore: ") + messages::kind_name(*msg) +
                                                       " is not served (putBlocks/getBlocks/dropBlocks are retired; "
                                                       "setRing comes with the stores' handles)"});
      },
      [self](ring_atom, const std::string& tag, const std::string& bytes, const std::vector<caf::actor>& handles) {
        KvStoreState& st = self->state;
        if (Status ok = st.inbox.authenticate(self->current_sender(), tag, bytes); !ok) return;
        auto msg = messages::decode_kvstore(bytes);
        if (!msg || !std::holds_alternative<messages::SetRing>(*msg)) {
          spdlog::error("kvstore {}: a ring message that is not a setRing: ignored", st.config.name);
          return;
        }
        set_ring(self, std::get<messages::SetRing>(*msg), handles);
      },
      [self](ring_timeout_atom) {
        if (!self->state.waiting_fetches.empty())
          spdlog::warn("kvstore {}: no ring after {} s; answering {} fetches from this store alone",
                       self->state.config.name, std::chrono::seconds(kPeerTimeout).count(),
                       self->state.waiting_fetches.size());
        serve_waiting_fetches(self);
      },
      [self](beat_atom) {
        heartbeat(self);
        self->delayed_send(self, std::chrono::milliseconds(self->state.config.heartbeat_ms), beat_atom::value);
      },
      [](const std::string&) {},  // replies to our drops and heartbeats
  };
}

}  // namespace

caf::actor spawn_kvstore(caf::actor_system& sys, KvStoreConfig config) {
  // Detached: RocksDB writes (a synced WAL) and compactions block.
  return sys.spawn<caf::detached>(kvstore_behavior, std::move(config));
}

}  // namespace shardline::actors
