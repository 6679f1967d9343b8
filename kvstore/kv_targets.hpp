#pragma once
/// \file
/// KvTargets of DéjàVuLib (kvstore/kv_stream.hpp): `MemoryKvTarget`, chunks in
/// host memory under an optional byte budget, and `CommKvTarget`, chunks sent
/// to / fetched from a remote rank over a comm::Communicator, whose side runs
/// `serve_kv_request` over a MemoryKvTarget.
///
/// Wire format (point-to-point messages; integers in host byte order, which
/// is little-endian on every supported platform). Client -> server, on
/// KvWireTags::request, in this order:
///   1. the request header, kKvRequestHeaderBytes:
///        u32 magic 'KVS1', u32 op (1 flush, 2 fetch, 3 flush_batch),
///        u64 job_id, u64 request_id, i32 layer_begin, i32 layer_end,
///        i32 token_begin, i32 token_end  (the key; zero for flush_batch),
///        u64 count (chunks: 1, or the batch's), u64 bytes (payload length);
///   2. flush_batch only: the key table, count * kKvTableEntryBytes:
///        u64 job_id, u64 request_id, 4 x i32 range, u64 bytes per chunk
///        (the chunks lie back to back in the payload, in table order);
///   3. flush / flush_batch with bytes > 0: the payload.
/// Server -> client, on KvWireTags::reply: the reply header,
/// kKvReplyHeaderBytes: u32 magic 'KVR1', i32 code (-1 ok, else the
/// ErrorCode), u64 bytes; then, when bytes > 0, the fetched chunk (ok) or
/// the error message (not ok).

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "kvstore/kv_stream.hpp"

namespace shardline::kvstore {

// ---- MemoryKvTarget -------------------------------------------------------------

struct MemoryKvStats {
  std::uint64_t bytes = 0;         ///< payload bytes stored
  std::uint64_t chunks = 0;        ///< chunks stored
  std::uint64_t budget_bytes = 0;  ///< the budget (0: none)
};

/// Chunks in host memory, keyed by KvChunkKey. Thread-safe (one mutex).
class MemoryKvTarget final : public KvTarget {
 public:
  /// `budget_bytes`: most payload bytes held at once; 0 means no budget.
  explicit MemoryKvTarget(std::uint64_t budget_bytes = 0) : budget_(budget_bytes) {}

  /// Stores a copy of `chunk` (replacing an equal key). Errors:
  /// out_of_memory when the budget would be exceeded (nothing changes).
  [[nodiscard]] Status flush(const KvChunkKey& key, std::span<const std::byte> chunk) override;
  /// A copy of the chunk. Errors: not_found.
  [[nodiscard]] Result<std::vector<std::byte>> fetch(const KvChunkKey& key) override;
  /// All chunks or none: errors (chunk outside `buffer`, over the budget)
  /// leave the target unchanged. A key repeated in the batch: the last wins.
  [[nodiscard]] Status flush_batch(std::span<const KvChunkRef> chunks,
                                   std::span<const std::byte> buffer) override;

  /// Removes one chunk; false when absent.
  bool erase(const KvChunkKey& key);
  /// Removes every chunk of (job, request); returns how many.
  std::uint64_t erase_request(std::uint64_t job_id, std::uint64_t request_id);
  [[nodiscard]] bool contains(const KvChunkKey& key) const;
  [[nodiscard]] MemoryKvStats stats() const;

 private:
  struct KeyLess {
    bool operator()(const KvChunkKey& a, const KvChunkKey& b) const noexcept;
  };
  std::uint64_t budget_;
  mutable std::mutex mu_;
  std::uint64_t bytes_ = 0;
  std::map<KvChunkKey, std::vector<std::byte>, KeyLess> chunks_;
};

// ---- CommKvTarget and its server ---------------------------------------------------

/// Point-to-point tags of the KV wire protocol (distinct from the engine
/// group's 101..104, engine/group/parallel_executor.hpp).
struct KvWireTags {
  int request = 201;  ///< client -> server
  int reply = 202;    ///< server -> client
};

inline constexpr std::size_t kKvRequestHeaderBytes = 56;
inline constexpr std::size_t kKvTableEntryBytes = 40;
inline constexpr std::size_t kKvReplyHeaderBytes = 16;
/// Largest payload or message a server or client accepts (a corrupt header
/// must not make it allocate without bound); a flush_batch also carries at
/// most 2^24 chunks.
inline constexpr std::uint64_t kKvMaxWireBytes = std::uint64_t{4} << 30;

/// A KvTarget on another rank: each flush / fetch / flush_batch is one
/// request and one reply over `comm` with `peer`, which must run
/// serve_kv_request. Waits up to the communicator's timeout. Not
/// thread-safe (the communicator is used by one thread at a time). After an
/// io or corrupt error the channel may hold stale messages; make a new
/// communicator (or peer) before using it again.
class CommKvTarget final : public KvTarget {
 public:
  CommKvTarget(comm::Communicator& comm, int peer, KvWireTags tags = {})
      : comm_(comm), peer_(peer), tags_(tags) {}

  /// Errors: the server's store's (out_of_memory, ...), io (peer dead or
  /// timed out), corrupt (a malformed reply).
  [[nodiscard]] Status flush(const KvChunkKey& key, std::span<const std::byte> chunk) override;
  /// Errors: not_found (the server has no such chunk), io, corrupt.
  [[nodiscard]] Result<std::vector<std::byte>> fetch(const KvChunkKey& key) override;
  /// One request carrying every chunk (one payload message). Errors: as flush;
  /// invalid_argument (a chunk outside `buffer`).
  [[nodiscard]] Status flush_batch(std::span<const KvChunkRef> chunks,
                                   std::span<const std::byte> buffer) override;

 private:
  /// Receives the reply header and its body (a chunk or an error message).
  Result<std::vector<std::byte>> reply(const char* op);
  comm::Communicator& comm_;
  int peer_;
  KvWireTags tags_;
};

/// Handles exactly one request (flush, fetch or flush_batch) from `peer`
/// against `store` and sends the reply. Waits for the request up to the
/// communicator's timeout. The store's answer, errors included (not_found,
/// out_of_memory), goes to the client; the return value is about the exchange
/// itself. Errors: io (no request within the timeout, peer dead), corrupt (a
/// malformed request: bad magic or op, sizes that disagree or exceed
/// kKvMaxWireBytes; the client gets a corrupt reply when possible).
[[nodiscard]] Status serve_kv_request(comm::Communicator& comm, int peer, MemoryKvTarget& store,
                                      KvWireTags tags = {});

}  // namespace shardline::kvstore
