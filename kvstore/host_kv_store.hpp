#pragma once
/// \file
/// Host-memory tier of the KV cache: named blobs of KV blocks (a sequence's
/// blocks, serialized by the worker that swaps them out) under a byte
/// capacity. The KV-store actor serves it (messages/kvstore.capnp); Seesaw's
/// tiered buffer and DéjàVu's swap space build on it. Plain class, not
/// thread-safe (its actor serialises access).

#include <cstdint>
#include <map>
#include <string>

#include "common/result.hpp"

namespace shardline::kvstore {

struct HostKvStats {
  std::uint64_t num_entries = 0;
  std::uint64_t bytes_used = 0;
  std::uint64_t bytes_capacity = 0;
};

class HostKvStore {
 public:
  explicit HostKvStore(std::uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  /// Stores (or replaces) `key`. Errors: invalid_argument (empty key),
  /// out_of_memory (would exceed the capacity; nothing changes).
  [[nodiscard]] Status put(const std::string& key, std::string data);
  /// The blob, or nullptr when absent.
  [[nodiscard]] const std::string* get(const std::string& key) const;
  /// Removes `key`; false when absent.
  bool drop(const std::string& key);
  [[nodiscard]] HostKvStats stats() const;

 private:
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::map<std::string, std::string> blobs_;
};

}  // namespace shardline::kvstore
