// The tables of kvstore.capnp: KvStoreMessage <-> KvStoreMsg, KvStoreReply
// <-> KvStoreReply (see messages/codec_detail.hpp).
#include "messages/codec.hpp"
#include "messages/codec_detail.hpp"
#include "messages/kvstore.capnp.h"

namespace shardline::messages {

namespace detail {

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
  static void put(KR::Builder root, const KvStoreStats& m) {
    auto b = root.initStats();
    b.setNumEntries(m.num_entries);
    b.setBytesUsed(m.bytes_used);
    b.setBytesCapacity(m.bytes_capacity);
  }
  static KvStoreStats get(KR::Reader root) {
    auto r = root.getStats();
    return KvStoreStats{r.getNumEntries(), r.getBytesUsed(), r.getBytesCapacity()};
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
