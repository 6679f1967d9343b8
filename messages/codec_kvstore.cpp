// The tables of kvstore.capnp: KvStoreMessage <-> KvStoreMsg, KvStoreReply
// <-> KvStoreReply (see messages/codec_detail.hpp).
#include "messages/codec.hpp"
#include "messages/codec_detail.hpp"
#include "messages/kvstore.capnp.h"

namespace shardline::messages {

namespace detail {

namespace {

capnp::Data::Reader bytes_of(const std::vector<std::byte>& v) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(v.data()), v.size());
}

std::vector<std::byte> bytes_from(capnp::Data::Reader d) {
  const auto* p = reinterpret_cast<const std::byte*>(d.begin());
  return std::vector<std::byte>(p, p + d.size());
}

std::string request_field(const char* what, std::size_t i) { return at(what, i); }

void put_prefix_blocks(capnp::List<wire::PrefixBlock>::Builder list, const std::vector<PrefixBlockData>& blocks) {
  for (unsigned i = 0; i < blocks.size(); ++i) {
    const PrefixBlockData& b = blocks[i];
    list[i].setName(b.name);
    list[i].setParent(b.parent);
    auto tokens = list[i].initTokens(static_cast<unsigned>(b.tokens.size()));
    for (unsigned t = 0; t < b.tokens.size(); ++t) tokens.set(t, b.tokens[t]);
    list[i].setChunk(bytes_of(b.chunk));
  }
}

/// The blocks of a prefix-block message; every block needs tokens (the
/// store checks the chunk against its model shape).
std::vector<PrefixBlockData> get_prefix_blocks(capnp::List<wire::PrefixBlock>::Reader list) {
  check_len(list, "blocks");
  std::vector<PrefixBlockData> out;
  out.reserve(list.size());
  for (unsigned i = 0; i < list.size(); ++i) {
    const auto r = list[i];
    const auto tokens = r.getTokens();
    check_len(tokens, at("blocks", i) + ".tokens");
    if (tokens.size() == 0) fail(ErrorCode::invalid_argument, at("blocks", i) + ".tokens is empty");
    PrefixBlockData b;
    b.name = r.getName();
    b.parent = r.getParent();
    b.tokens.reserve(tokens.size());
    for (const std::int32_t t : tokens) b.tokens.push_back(t);
    b.chunk = bytes_from(r.getChunk());
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

void put(wire::KvStoreStats::Builder b, const KvStoreStats& m) {
  b.setNumEntries(m.num_entries);
  b.setBytesUsed(m.bytes_used);
  b.setBytesCapacity(m.bytes_capacity);
  b.setDiskBytes(m.disk_bytes);
  b.setRequests(m.requests);
  b.setChunks(m.chunks);
  b.setReplica(text(m.replica));
  b.setLagTokens(m.lag_tokens);
  b.setReplicatedTokens(m.replicated_tokens);
  b.setStoreName(text(m.store_name));
  b.setPrefixBlocks(m.prefix_blocks);
  b.setPrefixBytes(m.prefix_bytes);
  b.setPrefixLinks(m.prefix_links);
  b.setLinkedTokens(m.linked_tokens);
}

KvStoreStats get(wire::KvStoreStats::Reader r) {
  KvStoreStats m;
  m.num_entries = r.getNumEntries();
  m.bytes_used = r.getBytesUsed();
  m.bytes_capacity = r.getBytesCapacity();
  m.disk_bytes = r.getDiskBytes();
  m.requests = r.getRequests();
  m.chunks = r.getChunks();
  m.replica = str(r.getReplica());
  m.lag_tokens = r.getLagTokens();
  m.replicated_tokens = r.getReplicatedTokens();
  m.store_name = str(r.getStoreName());
  m.prefix_blocks = r.getPrefixBlocks();
  m.prefix_bytes = r.getPrefixBytes();
  m.prefix_links = r.getPrefixLinks();
  m.linked_tokens = r.getLinkedTokens();
  return m;
}

// ============================================================================
// KvStoreMessage
// ============================================================================

using KM = wire::KvStoreMessage;

template <>
struct Member<KM, PutBlocks> {
  static constexpr auto which = KM::PUT_BLOCKS;
  static void put(KM::Builder root, const PutBlocks& m) {
    auto b = root.initPutBlocks();
    b.setKey(text(m.key));
    b.setData(data(m.data));
  }
  static PutBlocks get(KM::Reader root) {
    auto r = root.getPutBlocks();
    return PutBlocks{str(r.getKey()), str(r.getData())};
  }
};

template <>
struct Member<KM, GetBlocks> {
  static constexpr auto which = KM::GET_BLOCKS;
  static void put(KM::Builder root, const GetBlocks& m) { root.initGetBlocks().setKey(text(m.key)); }
  static GetBlocks get(KM::Reader root) { return GetBlocks{str(root.getGetBlocks().getKey())}; }
};

template <>
struct Member<KM, DropBlocks> {
  static constexpr auto which = KM::DROP_BLOCKS;
  static void put(KM::Builder root, const DropBlocks& m) { root.initDropBlocks().setKey(text(m.key)); }
  static DropBlocks get(KM::Reader root) { return DropBlocks{str(root.getDropBlocks().getKey())}; }
};

template <>
struct Member<KM, StatsQuery> {
  static constexpr auto which = KM::STATS_QUERY;
  static void put(KM::Builder root, const StatsQuery&) { root.setStatsQuery(); }
  static StatsQuery get(KM::Reader) { return {}; }
};

template <>
struct Member<KM, PutChunks> {
  static constexpr auto which = KM::PUT_CHUNKS;
  static void put(KM::Builder root, const PutChunks& m) {
    auto b = root.initPutChunks();
    auto list = b.initChunks(static_cast<unsigned>(m.chunks.size()));
    for (unsigned i = 0; i < m.chunks.size(); ++i) {
      const kvstore::KvChunkKey& k = m.chunks[i].key;
      list[i].setJobId(k.job_id);
      list[i].setRequestId(k.request_id);
      list[i].setLayerBegin(k.range.layer_begin);
      list[i].setLayerEnd(k.range.layer_end);
      list[i].setTokenBegin(k.range.token_begin);
      list[i].setTokenEnd(k.range.token_end);
      list[i].setChunk(bytes_of(m.chunks[i].chunk));
    }
    b.setFromPeer(text(m.from_peer));
    auto links = b.initLinks(static_cast<unsigned>(m.links.size()));
    for (unsigned i = 0; i < m.links.size(); ++i) {
      const PrefixLinkData& l = m.links[i];
      links[i].setJobId(l.job_id);
      links[i].setRequestId(l.request_id);
      links[i].setSalt(l.salt);
      links[i].setRoot(l.root);
      auto names = links[i].initNames(static_cast<unsigned>(l.names.size()));
      for (unsigned j = 0; j < l.names.size(); ++j) names.set(j, l.names[j]);
      auto tokens = links[i].initTokens(static_cast<unsigned>(l.tokens.size()));
      for (unsigned j = 0; j < l.tokens.size(); ++j) tokens.set(j, l.tokens[j]);
    }
  }
  static PutChunks get(KM::Reader root) {
    auto r = root.getPutChunks();
    auto list = r.getChunks();
    check_len(list, "chunks");
    PutChunks m;
    m.chunks.reserve(list.size());
    for (unsigned i = 0; i < list.size(); ++i) {
      const auto c = list[i];
      KvChunkData d;
      d.key.job_id = c.getJobId();
      d.key.request_id = c.getRequestId();
      d.key.range = kvstore::KvRange{c.getLayerBegin(), c.getLayerEnd(), c.getTokenBegin(), c.getTokenEnd()};
      // The store checks the range against its model shape; here only what
      // no shape allows.
      if (d.key.range.layer_begin < 0 || d.key.range.layer_end <= d.key.range.layer_begin ||
          d.key.range.token_begin < 0 || d.key.range.token_end <= d.key.range.token_begin)
        fail(ErrorCode::invalid_argument, request_field("chunks", i) + ": empty or negative range");
      d.chunk = bytes_from(c.getChunk());
      m.chunks.push_back(std::move(d));
    }
    m.from_peer = str(r.getFromPeer());
    auto links = r.getLinks();
    check_len(links, "links");
    m.links.reserve(links.size());
    for (unsigned i = 0; i < links.size(); ++i) {
      const auto l = links[i];
      PrefixLinkData d{l.getJobId(), l.getRequestId(), l.getSalt(), l.getRoot(), {}, {}};
      const auto names = l.getNames();
      const auto tokens = l.getTokens();
      check_len(names, request_field("links", i) + ".names");
      check_len(tokens, request_field("links", i) + ".tokens");
      // The store checks the blocks; here only what no store takes.
      // Job ids never have the top bit (the store keeps it for prefix
      // blocks and refuses the whole batch): refused here, not retried.
      if ((d.job_id >> 63) != 0)
        fail(ErrorCode::invalid_argument, request_field("links", i) + ": a job id with the top bit");
      if (names.size() == 0 || tokens.size() == 0 || tokens.size() % names.size() != 0)
        fail(ErrorCode::invalid_argument, request_field("links", i) + ": " + std::to_string(names.size()) +
                                              " names for " + std::to_string(tokens.size()) +
                                              " tokens (expected >= 1, the same tokens per name)");
      d.names.reserve(names.size());
      for (const std::uint64_t n : names) d.names.push_back(n);
      d.tokens.reserve(tokens.size());
      for (const std::int32_t t : tokens) d.tokens.push_back(t);
      m.links.push_back(std::move(d));
    }
    return m;
  }
};

template <>
struct Member<KM, FetchPrefix> {
  static constexpr auto which = KM::FETCH_PREFIX;
  static void put(KM::Builder root, const FetchPrefix& m) {
    auto b = root.initFetchPrefix();
    b.setJobId(m.job_id);
    b.setRequestId(m.request_id);
    b.setMaxTokens(m.max_tokens);
    b.setAskPeers(m.ask_peers);
  }
  static FetchPrefix get(KM::Reader root) {
    auto r = root.getFetchPrefix();
    if (r.getMaxTokens() < 0) fail(ErrorCode::invalid_argument, "maxTokens must be >= 0");
    return FetchPrefix{r.getJobId(), r.getRequestId(), r.getMaxTokens(), r.getAskPeers()};
  }
};

template <>
struct Member<KM, DropRequests> {
  static constexpr auto which = KM::DROP_REQUESTS;
  static void put(KM::Builder root, const DropRequests& m) {
    auto b = root.initDropRequests();
    b.setJobId(m.job_id);
    auto ids = b.initRequestIds(static_cast<unsigned>(m.request_ids.size()));
    for (unsigned i = 0; i < m.request_ids.size(); ++i) ids.set(i, m.request_ids[i]);
    b.setFromPeer(text(m.from_peer));
  }
  static DropRequests get(KM::Reader root) {
    auto r = root.getDropRequests();
    auto ids = r.getRequestIds();
    check_len(ids, "requestIds");
    DropRequests m;
    m.job_id = r.getJobId();
    m.request_ids.reserve(ids.size());
    for (const std::uint64_t id : ids) m.request_ids.push_back(id);
    m.from_peer = str(r.getFromPeer());
    return m;
  }
};

template <>
struct Member<KM, SetRing> {
  static constexpr auto which = KM::SET_RING;
  static void put(KM::Builder root, const SetRing& m) {
    set_texts(root.initSetRing().initNames(static_cast<unsigned>(m.names.size())), m.names);
  }
  static SetRing get(KM::Reader root) { return SetRing{get_texts(root.getSetRing().getNames(), "names")}; }
};

template <>
struct Member<KM, PutPrefixBlocks> {
  static constexpr auto which = KM::PUT_PREFIX_BLOCKS;
  static void put(KM::Builder root, const PutPrefixBlocks& m) {
    auto b = root.initPutPrefixBlocks();
    b.setSalt(m.salt);
    put_prefix_blocks(b.initBlocks(static_cast<unsigned>(m.blocks.size())), m.blocks);
    b.setFromPeer(text(m.from_peer));
  }
  static PutPrefixBlocks get(KM::Reader root) {
    auto r = root.getPutPrefixBlocks();
    return PutPrefixBlocks{r.getSalt(), get_prefix_blocks(r.getBlocks()), str(r.getFromPeer())};
  }
};

template <>
struct Member<KM, FetchPrefixBlocks> {
  static constexpr auto which = KM::FETCH_PREFIX_BLOCKS;
  static void put(KM::Builder root, const FetchPrefixBlocks& m) {
    auto b = root.initFetchPrefixBlocks();
    b.setSalt(m.salt);
    put_prefix_blocks(b.initBlocks(static_cast<unsigned>(m.blocks.size())), m.blocks);
  }
  static FetchPrefixBlocks get(KM::Reader root) {
    auto r = root.getFetchPrefixBlocks();
    return FetchPrefixBlocks{r.getSalt(), get_prefix_blocks(r.getBlocks())};
  }
};

// ============================================================================
// KvStoreReply (Ack / Error: codec_detail.hpp)
// ============================================================================

using KR = wire::KvStoreReply;

template <>
struct Member<KR, BlocksData> {
  static constexpr auto which = KR::BLOCKS_DATA;
  static void put(KR::Builder root, const BlocksData& m) {
    auto b = root.initBlocksData();
    b.setKey(text(m.key));
    b.setData(data(m.data));
    b.setFound(m.found);
  }
  static BlocksData get(KR::Reader root) {
    auto r = root.getBlocksData();
    return BlocksData{str(r.getKey()), str(r.getData()), r.getFound()};
  }
};

template <>
struct Member<KR, KvStoreStats> {
  static constexpr auto which = KR::STATS;
  static void put(KR::Builder root, const KvStoreStats& m) { detail::put(root.initStats(), m); }
  static KvStoreStats get(KR::Reader root) { return detail::get(root.getStats()); }
};

template <>
struct Member<KR, ChunksAcked> {
  static constexpr auto which = KR::CHUNKS_ACKED;
  static void put(KR::Builder root, const ChunksAcked& m) {
    auto b = root.initChunksAcked();
    auto list = b.initAcks(static_cast<unsigned>(m.acks.size()));
    for (unsigned i = 0; i < m.acks.size(); ++i) {
      list[i].setJobId(m.acks[i].job_id);
      list[i].setRequestId(m.acks[i].request_id);
      list[i].setTokens(m.acks[i].tokens);
    }
    auto waits = b.initWaits(static_cast<unsigned>(m.waits.size()));
    for (unsigned i = 0; i < m.waits.size(); ++i) {
      waits[i].setJobId(m.waits[i].job_id);
      waits[i].setRequestId(m.waits[i].request_id);
      waits[i].setName(m.waits[i].name);
    }
  }
  static ChunksAcked get(KR::Reader root) {
    auto list = root.getChunksAcked().getAcks();
    check_len(list, "acks");
    ChunksAcked m;
    m.acks.reserve(list.size());
    for (unsigned i = 0; i < list.size(); ++i) {
      KvAck a{list[i].getJobId(), list[i].getRequestId(), list[i].getTokens()};
      if (a.tokens < 0) fail(ErrorCode::invalid_argument, at("acks", i) + ".tokens must be >= 0");
      m.acks.push_back(a);
    }
    auto waits = root.getChunksAcked().getWaits();
    check_len(waits, "waits");
    m.waits.reserve(waits.size());
    for (unsigned i = 0; i < waits.size(); ++i)
      m.waits.push_back(LinkWaitData{waits[i].getJobId(), waits[i].getRequestId(), waits[i].getName()});
    return m;
  }
};

template <>
struct Member<KR, KvPrefixData> {
  static constexpr auto which = KR::PREFIX_DATA;
  static void put(KR::Builder root, const KvPrefixData& m) {
    auto b = root.initPrefixData();
    b.setTokens(m.tokens);
    b.setChunk(bytes_of(m.chunk));
    b.setSource(text(m.source));
  }
  static KvPrefixData get(KR::Reader root) {
    auto r = root.getPrefixData();
    if (r.getTokens() < 0) fail(ErrorCode::invalid_argument, "tokens must be >= 0");
    return KvPrefixData{r.getTokens(), bytes_from(r.getChunk()), str(r.getSource())};
  }
};

template <>
struct Member<KR, PrefixBlocksData> {
  static constexpr auto which = KR::PREFIX_BLOCKS;
  static void put(KR::Builder root, const PrefixBlocksData& m) {
    auto b = root.initPrefixBlocks();
    put_prefix_blocks(b.initBlocks(static_cast<unsigned>(m.blocks.size())), m.blocks);
    b.setStored(m.stored);
    auto kept = b.initKept(static_cast<unsigned>(m.kept.size()));
    for (unsigned i = 0; i < m.kept.size(); ++i) kept.set(i, m.kept[i]);
  }
  static PrefixBlocksData get(KR::Reader root) {
    auto r = root.getPrefixBlocks();
    if (r.getStored() < 0) fail(ErrorCode::invalid_argument, "stored must be >= 0");
    const auto kept = r.getKept();
    check_len(kept, "kept");
    PrefixBlocksData m{get_prefix_blocks(r.getBlocks()), r.getStored(), {}};
    m.kept.reserve(kept.size());
    for (const std::uint64_t n : kept) m.kept.push_back(n);
    return m;
  }
};

}  // namespace detail

std::string encode(const KvStoreMsg& msg) { return detail::encode_table<wire::KvStoreMessage>(msg); }

std::string encode(const KvStoreReply& msg) { return detail::encode_table<wire::KvStoreReply>(msg); }

Result<KvStoreMsg> decode_kvstore(std::string_view bytes) noexcept {
  return detail::decode_table<wire::KvStoreMessage, KvStoreMsg>(bytes, "kvstore message");
}

Result<KvStoreReply> decode_kvstore_reply(std::string_view bytes) noexcept {
  return detail::decode_table<wire::KvStoreReply, KvStoreReply>(bytes, "kvstore reply");
}

const char* kind_name(const KvStoreMsg& msg) noexcept { return detail::wire_name<wire::KvStoreMessage>(msg.index()); }

const char* kind_name(const KvStoreReply& msg) noexcept { return detail::wire_name<wire::KvStoreReply>(msg.index()); }

}  // namespace shardline::messages
