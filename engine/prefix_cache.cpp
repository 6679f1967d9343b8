#include "engine/prefix_cache.hpp"

#include <algorithm>
#include <string>

namespace shardline::engine {

namespace {
std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::uint64_t prefix_root_hash(std::uint64_t salt) noexcept { return mix(salt ^ 0x5368617264C1ULL); }

std::uint64_t prefix_block_hash(std::uint64_t parent, std::span<const std::int32_t> tokens) noexcept {
  std::uint64_t h = mix(parent);
  for (std::int32_t t : tokens) h = mix(h ^ static_cast<std::uint32_t>(t));
  return mix(h ^ tokens.size());
}

PrefixCache::PrefixCache(int num_blocks) {
  const auto n = static_cast<std::size_t>(std::max(num_blocks, 0));
  hash_.assign(n, 0);
  parent_.assign(n, 0);
  tokens_.resize(n);
  named_.assign(n, 0);
  evictable_.assign(n, 0);
  lru_pos_.resize(n);
  child_pos_.resize(n);
}

int PrefixCache::find(std::uint64_t hash, std::uint64_t parent, std::span<const std::int32_t> tokens) const {
  const auto it = index_.find(hash);
  if (it == index_.end()) return -1;
  const auto b = static_cast<std::size_t>(it->second);
  if (parent_[b] != parent || !std::equal(tokens.begin(), tokens.end(), tokens_[b].begin(), tokens_[b].end()))
    return -1;  // a collision: never another prefix's KV
  return it->second;
}

PrefixCache::PartialMatch PrefixCache::find_partial(std::uint64_t parent, std::span<const std::int32_t> tokens) const {
  PartialMatch best;
  const auto it = children_.find(parent);
  if (it == children_.end() || tokens.empty()) return best;
  const std::list<int>& kids = it->second;
  int scanned = 0;
  for (auto k = kids.rbegin(); k != kids.rend() && scanned < kMaxPartialScan; ++k, ++scanned) {
    const std::vector<std::int32_t>& have = tokens_[static_cast<std::size_t>(*k)];
    const auto n = static_cast<int>(std::mismatch(tokens.begin(), tokens.end(), have.begin(), have.end()).first -
                                    tokens.begin());
    if (n > best.num_tokens) best = {*k, n};
    if (best.num_tokens == static_cast<int>(tokens.size())) break;
  }
  return best;
}

bool PrefixCache::insert(int block, std::uint64_t hash, std::uint64_t parent, std::span<const std::int32_t> tokens) {
  const auto b = static_cast<std::size_t>(block);
  if (named_[b] != 0 || !index_.emplace(hash, block).second) return false;
  named_[b] = 1;
  hash_[b] = hash;
  parent_[b] = parent;
  tokens_[b].assign(tokens.begin(), tokens.end());
  std::list<int>& kids = children_[parent];
  child_pos_[b] = kids.insert(kids.end(), block);
  return true;
}

void PrefixCache::release(int block) {
  const auto b = static_cast<std::size_t>(block);
  if (named_[b] == 0 || evictable_[b] != 0) return;
  lru_pos_[b] = lru_.insert(lru_.end(), block);
  evictable_[b] = 1;
}

void PrefixCache::hold(int block) {
  const auto b = static_cast<std::size_t>(block);
  if (evictable_[b] == 0) return;
  lru_.erase(lru_pos_[b]);
  evictable_[b] = 0;
}

NamedBlock PrefixCache::named_block(int block) const {
  const auto b = static_cast<std::size_t>(block);
  return NamedBlock{block, hash_[b], parent_[b], tokens_[b]};
}

int PrefixCache::evict(NamedBlock* evicted) {
  if (lru_.empty()) return -1;
  const int block = lru_.front();
  lru_.pop_front();
  const auto b = static_cast<std::size_t>(block);
  if (evicted != nullptr) *evicted = named_block(block);
  evictable_[b] = 0;
  named_[b] = 0;
  index_.erase(hash_[b]);
  tokens_[b].clear();
  const auto kids = children_.find(parent_[b]);
  kids->second.erase(child_pos_[b]);
  if (kids->second.empty()) children_.erase(kids);
  ++evictions_;
  return block;
}

Status PrefixCache::check_integrity() const {
  auto fail = [](const std::string& m) { return make_error(ErrorCode::internal, "prefix cache: " + m); };
  std::size_t named = 0;
  for (std::size_t b = 0; b < named_.size(); ++b) {
    if (named_[b] == 0) {
      if (evictable_[b] != 0) return fail("block " + std::to_string(b) + " is evictable but not named");
      continue;
    }
    ++named;
    const auto it = index_.find(hash_[b]);
    if (it == index_.end() || it->second != static_cast<int>(b))
      return fail("named block " + std::to_string(b) + " is not indexed under its name");
  }
  if (named != index_.size()) return fail("the index holds blocks that are not named");
  std::vector<int> listed(named_.size(), 0);
  for (const auto& [parent, kids] : children_)
    for (int k : kids) {
      const auto b = static_cast<std::size_t>(k);
      if (named_[b] == 0 || parent_[b] != parent)
        return fail("block " + std::to_string(k) + " is listed as a child of a block that is not its parent");
      ++listed[b];
    }
  for (std::size_t b = 0; b < named_.size(); ++b)
    if (listed[b] != (named_[b] != 0 ? 1 : 0))
      return fail("block " + std::to_string(b) + " is listed " + std::to_string(listed[b]) + " times as a child");
  std::size_t evictable = 0;
  for (char e : evictable_) evictable += e != 0 ? 1 : 0;
  if (evictable != lru_.size()) return fail("the LRU list and the evictable flags disagree");
  return Status::ok_status();
}

void ComputingPrefixes::drop(std::uint64_t name) {
  const auto it = count_.find(name);
  if (it != count_.end() && --it->second <= 0) count_.erase(it);
}

void ComputingPrefixes::start(std::uint64_t seq_id, std::vector<std::uint64_t> names, int first_block) {
  stop(seq_id);
  if (names.empty()) return;
  for (std::uint64_t n : names) ++count_[n];
  of_[seq_id] = Entry{std::move(names), first_block, 0};
}

void ComputingPrefixes::progress(std::uint64_t seq_id, int num_full_blocks) {
  const auto it = of_.find(seq_id);
  if (it == of_.end()) return;
  Entry& e = it->second;
  while (e.next < e.names.size() && e.first_block + static_cast<int>(e.next) < num_full_blocks) drop(e.names[e.next++]);
  if (e.next == e.names.size()) of_.erase(it);
}

void ComputingPrefixes::stop(std::uint64_t seq_id) {
  const auto it = of_.find(seq_id);
  if (it == of_.end()) return;
  for (std::size_t i = it->second.next; i < it->second.names.size(); ++i) drop(it->second.names[i]);
  of_.erase(it);
}

std::size_t ComputingPrefixes::num_pending() const {
  std::size_t n = 0;
  for (const auto& [name, count] : count_) n += static_cast<std::size_t>(count);
  return n;
}

}  // namespace shardline::engine
