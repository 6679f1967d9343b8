#include "engine/prefix_tier.hpp"

#include <algorithm>

namespace shardline::engine {

void HostPrefixTier::put(std::uint64_t name, std::uint64_t parent, std::span<const std::int32_t> tokens,
                         std::vector<std::byte> chunk) {
  std::lock_guard lock(mu_);
  if (touch_locked(name)) return;  // kept already (the same KV): used now
  if (chunk.size() > budget_bytes_) return;
  while (stats_.bytes + chunk.size() > budget_bytes_ && !lru_.empty()) {
    stats_.bytes -= lru_.front().chunk.size();
    index_.erase(lru_.front().name);
    lru_.pop_front();
    ++stats_.evictions;
  }
  stats_.bytes += chunk.size();
  lru_.push_back(Block{name, parent, std::vector<std::int32_t>(tokens.begin(), tokens.end()), std::move(chunk)});
  index_[name] = std::prev(lru_.end());
  ++stats_.puts;
}

bool HostPrefixTier::touch_locked(std::uint64_t name) {
  const auto it = index_.find(name);
  if (it == index_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second);
  return true;
}

bool HostPrefixTier::touch(std::uint64_t name) {
  std::lock_guard lock(mu_);
  return touch_locked(name);
}

std::optional<std::vector<std::byte>> HostPrefixTier::get(std::uint64_t name, std::uint64_t parent,
                                                          std::span<const std::int32_t> tokens) {
  std::lock_guard lock(mu_);
  const auto it = index_.find(name);
  if (it == index_.end() || it->second->parent != parent ||
      !std::equal(tokens.begin(), tokens.end(), it->second->tokens.begin(), it->second->tokens.end())) {
    ++stats_.misses;
    return std::nullopt;
  }
  lru_.splice(lru_.end(), lru_, it->second);
  ++stats_.hits;
  return it->second->chunk;
}

PrefixTierStats HostPrefixTier::stats() const {
  std::lock_guard lock(mu_);
  PrefixTierStats s = stats_;
  s.blocks = lru_.size();
  return s;
}

}  // namespace shardline::engine
