#include "kvstore/kv_targets.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

namespace shardline::kvstore {
namespace {

static_assert(std::endian::native == std::endian::little, "the KV wire format is little-endian");

constexpr std::uint32_t kRequestMagic = 0x3153564bu;  // "KVS1"
constexpr std::uint32_t kReplyMagic = 0x3152564bu;    // "KVR1"
enum class Op : std::uint32_t { flush = 1, fetch = 2, flush_batch = 3 };
constexpr std::uint64_t kMaxBatchChunks = std::uint64_t{1} << 24;  // a corrupt count must not allocate without bound

/// Appends / reads fixed-width fields in host (little-endian) order.
class Writer {
 public:
  explicit Writer(std::byte* p) : p_(p) {}
  template <typename T>
  void put(T v) {
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }
  void put_key(const KvChunkKey& k) {
    put(k.job_id);
    put(k.request_id);
    put(static_cast<std::int32_t>(k.range.layer_begin));
    put(static_cast<std::int32_t>(k.range.layer_end));
    put(static_cast<std::int32_t>(k.range.token_begin));
    put(static_cast<std::int32_t>(k.range.token_end));
  }

 private:
  std::byte* p_;
};

class Reader {
 public:
  explicit Reader(const std::byte* p) : p_(p) {}
  template <typename T>
  T get() {
    T v;
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  KvChunkKey get_key() {
    KvChunkKey k;
    k.job_id = get<std::uint64_t>();
    k.request_id = get<std::uint64_t>();
    k.range.layer_begin = get<std::int32_t>();
    k.range.layer_end = get<std::int32_t>();
    k.range.token_begin = get<std::int32_t>();
    k.range.token_end = get<std::int32_t>();
    return k;
  }

 private:
  const std::byte* p_;
};

using RequestHeader = std::array<std::byte, kKvRequestHeaderBytes>;
using ReplyHeader = std::array<std::byte, kKvReplyHeaderBytes>;

RequestHeader request_header(Op op, const KvChunkKey& key, std::uint64_t count, std::uint64_t bytes) {
  RequestHeader h{};
  Writer w(h.data());
  w.put(kRequestMagic);
  w.put(static_cast<std::uint32_t>(op));
  w.put_key(key);
  w.put(count);
  w.put(bytes);
  return h;
}

Status send_bytes(comm::Communicator& c, std::span<const std::byte> bytes, int peer, int tag) {
  if (bytes.empty()) return {};
  return c.send(bytes.data(), bytes.size(), peer, tag);
}

Error wire(const std::string& what) { return make_error(ErrorCode::corrupt, what); }

/// Sends a reply: ok with `body` (a chunk, maybe empty) or an error with its message.
Status send_reply(comm::Communicator& c, int peer, int tag, const Status& st, std::span<const std::byte> body) {
  std::string message;
  std::span<const std::byte> payload = body;
  if (!st) {
    message = st.error().message;
    payload = std::as_bytes(std::span<const char>(message.data(), message.size()));
  }
  ReplyHeader h{};
  Writer w(h.data());
  w.put(kReplyMagic);
  w.put(static_cast<std::int32_t>(st ? -1 : static_cast<int>(st.error().code)));
  w.put(static_cast<std::uint64_t>(payload.size()));
  if (Status s = c.send(h.data(), h.size(), peer, tag); !s) return s;
  return send_bytes(c, payload, peer, tag);
}

Status serve_flush_batch(comm::Communicator& c, int peer, MemoryKvTarget& store, KvWireTags tags,
                         std::uint64_t count, std::uint64_t bytes) {
  if (count > kMaxBatchChunks) {
    Status st = wire("kv server: flush_batch of " + std::to_string(count) + " chunks is too large");
    (void)send_reply(c, peer, tags.reply, st, {});
    return st;
  }
  std::vector<std::byte> table(count * kKvTableEntryBytes);
  if (!table.empty()) {
    if (Status st = c.recv(table.data(), table.size(), peer, tags.request); !st) return st;
  }
  std::vector<KvChunkRef> refs(count);
  Reader r(table.data());
  std::uint64_t offset = 0;
  bool sizes_ok = true;
  for (KvChunkRef& ref : refs) {
    ref.key = r.get_key();
    ref.bytes = r.get<std::uint64_t>();
    ref.offset = offset;
    if (ref.bytes > bytes - offset) {  // also catches sums past 2^64
      sizes_ok = false;
      break;
    }
    offset += ref.bytes;
  }
  std::vector<std::byte> payload(bytes);
  if (!payload.empty()) {
    if (Status st = c.recv(payload.data(), payload.size(), peer, tags.request); !st) return st;
  }
  if (!sizes_ok || offset != bytes) {
    Status st = wire("kv server: flush_batch chunk sizes do not add up to the payload's " +
                     std::to_string(bytes) + " bytes");
    (void)send_reply(c, peer, tags.reply, st, {});
    return st;
  }
  return send_reply(c, peer, tags.reply, store.flush_batch(refs, payload), {});
}

}  // namespace

// ---- MemoryKvTarget -------------------------------------------------------------

bool MemoryKvTarget::KeyLess::operator()(const KvChunkKey& a, const KvChunkKey& b) const noexcept {
  return std::tie(a.job_id, a.request_id, a.range.layer_begin, a.range.layer_end, a.range.token_begin,
                  a.range.token_end) < std::tie(b.job_id, b.request_id, b.range.layer_begin, b.range.layer_end,
                                                b.range.token_begin, b.range.token_end);
}

Status MemoryKvTarget::flush(const KvChunkKey& key, std::span<const std::byte> chunk) {
  std::lock_guard lock(mu_);
  auto it = chunks_.find(key);
  const std::uint64_t old = it == chunks_.end() ? 0 : it->second.size();
  if (budget_ != 0 && bytes_ - old + chunk.size() > budget_)
    return make_error(ErrorCode::out_of_memory,
                      "kv memory target: a chunk of " + std::to_string(chunk.size()) + " bytes does not fit (" +
                          std::to_string(bytes_) + " of " + std::to_string(budget_) + " bytes used)");
  if (it == chunks_.end()) {
    chunks_.emplace(key, std::vector<std::byte>(chunk.begin(), chunk.end()));
  } else {
    it->second.assign(chunk.begin(), chunk.end());
  }
  bytes_ = bytes_ - old + chunk.size();
  return {};
}

Result<std::vector<std::byte>> MemoryKvTarget::fetch(const KvChunkKey& key) {
  std::lock_guard lock(mu_);
  auto it = chunks_.find(key);
  if (it == chunks_.end())
    return make_error(ErrorCode::not_found,
                      "kv memory target: no chunk for job " + std::to_string(key.job_id) + " request " +
                          std::to_string(key.request_id) + " layers [" + std::to_string(key.range.layer_begin) +
                          ", " + std::to_string(key.range.layer_end) + ") tokens [" +
                          std::to_string(key.range.token_begin) + ", " + std::to_string(key.range.token_end) + ")");
  return it->second;
}

Status MemoryKvTarget::flush_batch(std::span<const KvChunkRef> chunks, std::span<const std::byte> buffer) {
  std::lock_guard lock(mu_);
  // Net growth over the budget check, counting each key's old size once and
  // the last of a repeated key.
  std::map<KvChunkKey, std::uint64_t, KeyLess> final_size;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const KvChunkRef& c = chunks[i];
    if (Status st = check_chunk_ref(c, i, buffer.size()); !st) return st;
    final_size[c.key] = c.bytes;
  }
  std::uint64_t after = bytes_;
  for (const auto& [key, size] : final_size) {
    auto it = chunks_.find(key);
    after = after - (it == chunks_.end() ? 0 : it->second.size()) + size;
  }
  if (budget_ != 0 && after > budget_)
    return make_error(ErrorCode::out_of_memory,
                      "kv memory target: a batch of " + std::to_string(chunks.size()) + " chunks needs " +
                          std::to_string(after) + " bytes, over the budget of " + std::to_string(budget_));
  for (const KvChunkRef& c : chunks) {
    const auto part = buffer.subspan(c.offset, c.bytes);
    auto [it, inserted] = chunks_.try_emplace(c.key);
    it->second.assign(part.begin(), part.end());
  }
  bytes_ = after;
  return {};
}

bool MemoryKvTarget::erase(const KvChunkKey& key) {
  std::lock_guard lock(mu_);
  auto it = chunks_.find(key);
  if (it == chunks_.end()) return false;
  bytes_ -= it->second.size();
  chunks_.erase(it);
  return true;
}

std::uint64_t MemoryKvTarget::erase_request(std::uint64_t job_id, std::uint64_t request_id) {
  std::lock_guard lock(mu_);
  std::uint64_t n = 0;
  KvChunkKey lo{job_id, request_id, {INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN}};
  for (auto it = chunks_.lower_bound(lo);
       it != chunks_.end() && it->first.job_id == job_id && it->first.request_id == request_id; ++n) {
    bytes_ -= it->second.size();
    it = chunks_.erase(it);
  }
  return n;
}

bool MemoryKvTarget::contains(const KvChunkKey& key) const {
  std::lock_guard lock(mu_);
  return chunks_.count(key) != 0;
}

MemoryKvStats MemoryKvTarget::stats() const {
  std::lock_guard lock(mu_);
  return {bytes_, chunks_.size(), budget_};
}

// ---- CommKvTarget -----------------------------------------------------------------

Result<std::vector<std::byte>> CommKvTarget::reply(const char* op) {
  ReplyHeader h{};
  if (Status st = comm_.recv(h.data(), h.size(), peer_, tags_.reply); !st) return st.error();
  Reader r(h.data());
  const auto magic = r.get<std::uint32_t>();
  const auto code = r.get<std::int32_t>();
  const auto bytes = r.get<std::uint64_t>();
  if (magic != kReplyMagic || code < -1 || code > static_cast<int>(ErrorCode::internal) || bytes > kKvMaxWireBytes)
    return wire(std::string(op) + ": malformed reply from rank " + std::to_string(peer_));
  std::vector<std::byte> body(bytes);
  if (!body.empty()) {
    if (Status st = comm_.recv(body.data(), body.size(), peer_, tags_.reply); !st) return st.error();
  }
  if (code == -1) return body;
  return make_error(static_cast<ErrorCode>(code),
                    std::string(op) + " at rank " + std::to_string(peer_) + ": " +
                        std::string(reinterpret_cast<const char*>(body.data()), body.size()));
}

Status CommKvTarget::flush(const KvChunkKey& key, std::span<const std::byte> chunk) {
  const RequestHeader h = request_header(Op::flush, key, 1, chunk.size());
  if (Status st = comm_.send(h.data(), h.size(), peer_, tags_.request); !st) return st;
  if (Status st = send_bytes(comm_, chunk, peer_, tags_.request); !st) return st;
  auto r = reply("kv flush");
  if (!r) return r.error();
  if (!r->empty()) return wire("kv flush: reply from rank " + std::to_string(peer_) + " carries a body");
  return {};
}

Result<std::vector<std::byte>> CommKvTarget::fetch(const KvChunkKey& key) {
  const RequestHeader h = request_header(Op::fetch, key, 1, 0);
  if (Status st = comm_.send(h.data(), h.size(), peer_, tags_.request); !st) return st.error();
  return reply("kv fetch");
}

Status CommKvTarget::flush_batch(std::span<const KvChunkRef> chunks, std::span<const std::byte> buffer) {
  // The payload is the chunks back to back in table order: send `buffer` as
  // is when it already is that (stream_out_batch's), else pack a copy.
  bool packed = true;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    const KvChunkRef& c = chunks[i];
    if (Status st = check_chunk_ref(c, i, buffer.size()); !st) return st;
    packed = packed && c.offset == total;
    total += c.bytes;
  }
  std::vector<std::byte> copy;
  std::span<const std::byte> payload = buffer.first(packed ? total : 0);
  if (!packed) {
    copy.reserve(total);
    for (const KvChunkRef& c : chunks) {
      const auto part = buffer.subspan(c.offset, c.bytes);
      copy.insert(copy.end(), part.begin(), part.end());
    }
    payload = copy;
  }
  std::vector<std::byte> table(chunks.size() * kKvTableEntryBytes);
  Writer w(table.data());
  for (const KvChunkRef& c : chunks) {
    w.put_key(c.key);
    w.put(static_cast<std::uint64_t>(c.bytes));
  }
  const RequestHeader h = request_header(Op::flush_batch, KvChunkKey{}, chunks.size(), total);
  if (Status st = comm_.send(h.data(), h.size(), peer_, tags_.request); !st) return st;
  if (Status st = send_bytes(comm_, table, peer_, tags_.request); !st) return st;
  if (Status st = send_bytes(comm_, payload, peer_, tags_.request); !st) return st;
  auto r = reply("kv flush_batch");
  if (!r) return r.error();
  if (!r->empty()) return wire("kv flush_batch: reply from rank " + std::to_string(peer_) + " carries a body");
  return {};
}

// ---- the server -----------------------------------------------------------------------

Status serve_kv_request(comm::Communicator& comm, int peer, MemoryKvTarget& store, KvWireTags tags) {
  RequestHeader h{};
  if (Status st = comm.recv(h.data(), h.size(), peer, tags.request); !st) return st;
  Reader r(h.data());
  const auto magic = r.get<std::uint32_t>();
  const auto op = r.get<std::uint32_t>();
  const KvChunkKey key = r.get_key();
  const auto count = r.get<std::uint64_t>();
  const auto bytes = r.get<std::uint64_t>();
  if (magic != kRequestMagic || op < 1 || op > 3 || bytes > kKvMaxWireBytes ||
      (op != static_cast<std::uint32_t>(Op::flush_batch) && count != 1) ||
      (op == static_cast<std::uint32_t>(Op::fetch) && bytes != 0)) {
    Status st = wire("kv server: malformed request header from rank " + std::to_string(peer));
    (void)send_reply(comm, peer, tags.reply, st, {});
    return st;
  }
  switch (static_cast<Op>(op)) {
    case Op::flush: {
      std::vector<std::byte> chunk(bytes);
      if (!chunk.empty()) {
        if (Status st = comm.recv(chunk.data(), chunk.size(), peer, tags.request); !st) return st;
      }
      return send_reply(comm, peer, tags.reply, store.flush(key, chunk), {});
    }
    case Op::fetch: {
      auto chunk = store.fetch(key);
      if (!chunk) return send_reply(comm, peer, tags.reply, chunk.error(), {});
      return send_reply(comm, peer, tags.reply, Status{}, *chunk);
    }
    case Op::flush_batch:
      return serve_flush_batch(comm, peer, store, tags, count, bytes);
  }
  return {};
}

}  // namespace shardline::kvstore
