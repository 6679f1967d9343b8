#pragma once
/// \file
/// A tier below the device's prefix cache (issue 42, step 5, in part): the
/// KV of full prefix blocks the device cache evicts is spilled here, and a
/// request whose leading blocks are neither on the device nor being
/// computed fetches them from here instead of computing them again (the
/// engine restores them as it restores a resumed request's KV). LMCache and
/// vLLM's CPU offloading keep evicted prefix blocks in host memory the same
/// way.
///
/// A block is kept under its name (engine/prefix_cache.hpp: the hash chain
/// of its tokens over its parent's name, at epoch 0) with its parent's name
/// and its tokens, which a fetch compares, so a 64-bit name collision never
/// hands a request another prefix's KV. The salt in the name must cover
/// whatever else changes the KV (model, KV dtype) when a tier outlives one
/// engine's model.
///
/// Here: the interface and HostPrefixTier, a host-memory LRU under a byte
/// budget, which an engine uses across its own evictions and which a second
/// engine given the same tier uses after the first is gone. The tier in the
/// node's KV store, which survives a node restart, is the worker's
/// (worker/store_prefix_tier.hpp: a HostPrefixTier in front of the store).

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace shardline::engine {

class PrefixTier {
 public:
  virtual ~PrefixTier() = default;
  /// Keeps the KV of the full block named `name`: `chunk` is the canonical
  /// chunk (kvstore/kv_stream.hpp) of all layers x its block_size positions.
  /// A block kept already is only marked used.
  virtual void put(std::uint64_t name, std::uint64_t parent, std::span<const std::int32_t> tokens,
                   std::vector<std::byte> chunk) = 0;
  /// Marks the block named `name` used when it is kept; false when it is
  /// not (a spill then copies its KV out and puts it).
  [[nodiscard]] virtual bool touch(std::uint64_t name) = 0;
  /// The chunk of the block named `name` whose parent and tokens are these;
  /// nullopt when none is kept (or only a colliding one).
  [[nodiscard]] virtual std::optional<std::vector<std::byte>> get(std::uint64_t name, std::uint64_t parent,
                                                                  std::span<const std::int32_t> tokens) = 0;
  /// Whether a block is also offered (touch, else put) the first time a
  /// second request shares it, not only when the cache evicts it: a tier
  /// that outlives the process (the node's KV store) then holds a shared
  /// prefix even when the process is killed while the prefix is still on
  /// the device. Default: eviction only.
  [[nodiscard]] virtual bool keeps_shared_blocks() const { return false; }
};

/// Counters of a HostPrefixTier (monotonic, but bytes and blocks).
struct PrefixTierStats {
  std::uint64_t puts = 0;       ///< blocks stored (not counting ones kept already)
  std::uint64_t hits = 0;       ///< blocks fetched
  std::uint64_t misses = 0;     ///< fetches of a block not kept
  std::uint64_t evictions = 0;  ///< blocks dropped for the budget
  std::uint64_t bytes = 0;      ///< chunk bytes kept now
  std::uint64_t blocks = 0;     ///< blocks kept now (filled by stats())
};

/// The host-memory tier: blocks in an LRU (a fetch or a put of a kept
/// block marks it used) under `budget_bytes` of chunks; the least recently
/// used go first. Safe from several threads (engines of one node).
class HostPrefixTier final : public PrefixTier {
 public:
  explicit HostPrefixTier(std::uint64_t budget_bytes) : budget_bytes_(budget_bytes) {}
  void put(std::uint64_t name, std::uint64_t parent, std::span<const std::int32_t> tokens,
           std::vector<std::byte> chunk) override;
  [[nodiscard]] bool touch(std::uint64_t name) override;
  [[nodiscard]] std::optional<std::vector<std::byte>> get(std::uint64_t name, std::uint64_t parent,
                                                          std::span<const std::int32_t> tokens) override;
  [[nodiscard]] PrefixTierStats stats() const;

 private:
  bool touch_locked(std::uint64_t name);  ///< touch() under mu_
  struct Block {
    std::uint64_t name = 0;
    std::uint64_t parent = 0;
    std::vector<std::int32_t> tokens;
    std::vector<std::byte> chunk;
  };
  mutable std::mutex mu_;
  std::uint64_t budget_bytes_;
  std::list<Block> lru_;  ///< least recently used first
  std::unordered_map<std::uint64_t, std::list<Block>::iterator> index_;  ///< name -> block
  PrefixTierStats stats_;
};

}  // namespace shardline::engine
