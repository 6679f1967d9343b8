#include "engine/block_manager.hpp"

#include <algorithm>
#include <string>

namespace shardline::engine {

BlockManager::BlockManager(int num_blocks, int block_size) : BlockManager(num_blocks, block_size, {false, 0}) {}

BlockManager::BlockManager(int num_blocks, int block_size, PrefixCacheConfig prefix)
    : num_blocks_(std::max(num_blocks, 0)), block_size_(std::max(block_size, 1)) {
  free_list_.reserve(static_cast<std::size_t>(num_blocks_));
  for (int b = num_blocks_ - 1; b >= 0; --b) free_list_.push_back(b);  // block 0 handed out first
  refs_.assign(static_cast<std::size_t>(num_blocks_), 0);
  offered_.assign(static_cast<std::size_t>(num_blocks_), 0);
  if (prefix.enabled) {
    cache_ = std::make_unique<PrefixCache>(num_blocks_);
    salt_ = prefix.salt;
    root_name_ = prefix_root_hash(salt_);
  }
}

void BlockManager::new_prefix_epoch() noexcept {
  if (!cache_) return;
  root_name_ = prefix_root_hash(salt_ ^ (++epoch_ * 0x9e3779b97f4a7c15ULL));
}

std::int32_t BlockManager::take_block() {
  std::int32_t b = -1;
  if (!free_list_.empty()) {
    b = free_list_.back();
    free_list_.pop_back();
  } else if (spill_ && epoch_ == 0) {
    NamedBlock evicted;
    b = cache_->evict(&evicted);  // callers checked num_free_blocks()
    evicted_.push_back(std::move(evicted));
  } else {
    b = cache_->evict();
  }
  ++refs_[static_cast<std::size_t>(b)];
  return b;
}

int BlockManager::blocks_for_tokens(int num_tokens) const {
  return num_tokens <= 0 ? 0 : (num_tokens + block_size_ - 1) / block_size_;
}

bool BlockManager::can_allocate(int num_tokens) const {
  return blocks_for_tokens(num_tokens) <= num_free_blocks();
}

int BlockManager::num_missing_blocks(std::uint64_t seq_id, int num_total_tokens) const {
  const auto it = seqs_.find(seq_id);
  const int have = it == seqs_.end() ? 0 : static_cast<int>(it->second.table.size());
  return std::max(0, blocks_for_tokens(num_total_tokens) - have);
}

bool BlockManager::can_grow(std::uint64_t seq_id, int num_total_tokens) const {
  return num_missing_blocks(seq_id, num_total_tokens) <= num_free_blocks();
}

Status BlockManager::allocate_slots(std::uint64_t seq_id, int num_total_tokens) {
  if (num_total_tokens < 0)
    return make_error(ErrorCode::invalid_argument,
                      "allocate_slots: negative token count " + std::to_string(num_total_tokens));
  const int missing = num_missing_blocks(seq_id, num_total_tokens);
  if (missing > num_free_blocks())
    return make_error(ErrorCode::out_of_memory,
                      "allocate_slots: sequence " + std::to_string(seq_id) + " needs " +
                          std::to_string(missing) + " more KV blocks, " +
                          std::to_string(num_free_blocks()) + " free");
  SeqBlocks& s = seqs_[seq_id];
  for (int i = 0; i < missing; ++i) s.table.push_back(take_block());
  s.num_tokens = std::max(s.num_tokens, num_total_tokens);
  return Status::ok_status();
}

void BlockManager::free(std::uint64_t seq_id) {
  const auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  const auto& table = it->second.table;
  // Last blocks first: with caching they are the first evicted (a prefix's
  // head outlives its tail, as in vLLM).
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    if (--refs_[static_cast<std::size_t>(*b)] > 0) continue;
    if (cache_ && cache_->is_named(*b)) cache_->release(*b);
    else free_list_.push_back(*b);
  }
  seqs_.erase(it);
}

int BlockManager::acquire_cached_prefix(std::uint64_t seq_id, const Tokens& tokens, int max_tokens) {
  return acquire_cached_prefix(seq_id, tokens, max_tokens, nullptr);
}

int BlockManager::acquire_cached_prefix(std::uint64_t seq_id, const Tokens& tokens, int max_tokens,
                                        std::optional<std::uint64_t>* miss_name) {
  if (miss_name != nullptr) miss_name->reset();
  if (!cache_ || seqs_.count(seq_id) != 0) return 0;
  SeqBlocks s;
  cached_chain(tokens, max_tokens, s.table, s.names, miss_name);
  for (std::int32_t b : s.table) {
    cache_->hold(b);
    ++refs_[static_cast<std::size_t>(b)];
    // Shared for the first time since it was named: offered to the tier.
    if (spill_ && spill_shared_ && epoch_ == 0 && offered_[static_cast<std::size_t>(b)] == 0) {
      offered_[static_cast<std::size_t>(b)] = 1;
      evicted_.push_back(cache_->named_block(b));
    }
  }
  if (s.table.empty()) return 0;
  s.num_tokens = static_cast<int>(s.table.size()) * block_size_;
  const int hit = s.num_tokens;
  seqs_.emplace(seq_id, std::move(s));
  return hit;
}

void BlockManager::cached_chain(const Tokens& tokens, int max_tokens, std::vector<std::int32_t>& blocks,
                                std::vector<std::uint64_t>& names, std::optional<std::uint64_t>* miss_name) const {
  const int full = std::min(max_tokens, tokens.size()) / block_size_;
  std::vector<std::int32_t> ids;
  std::uint64_t parent = root_name_;
  for (int i = 0; i < full; ++i) {
    const std::uint64_t name = name_block(tokens, i, parent, ids);
    const int b = cache_->find(name, parent, ids);
    if (b < 0) {
      if (miss_name != nullptr) *miss_name = name;
      return;
    }
    blocks.push_back(b);
    names.push_back(name);
    parent = name;
  }
}

bool BlockManager::shared_head_end(std::uint64_t seq_id, std::size_t& block, std::uint64_t& parent) const {
  const auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) {  // no hit: from the first block
    block = 0;
    parent = root_name_;
    return true;
  }
  if (it->second.names.size() != it->second.table.size()) return false;  // it computed blocks of its own
  block = it->second.table.size();
  parent = parent_name(it->second, block);
  return true;
}

BlockManager::PartialBlockHit BlockManager::acquire_partial_block(std::uint64_t seq_id, const Tokens& tokens,
                                                                  int max_tokens) {
  std::size_t k = 0;
  std::uint64_t parent = 0;
  if (!cache_ || !shared_head_end(seq_id, k, parent)) return {};
  const int begin = static_cast<int>(k) * block_size_;
  const int end = std::min({begin + block_size_, max_tokens, tokens.size()});
  if (end <= begin) return {};
  std::vector<std::int32_t> want(static_cast<std::size_t>(end - begin));
  for (int t = begin; t < end; ++t) want[static_cast<std::size_t>(t - begin)] = tokens.at(t);
  const PrefixCache::PartialMatch m = cache_->find_partial(parent, want);
  if (m.block < 0 || m.num_tokens < min_partial_tokens()) return {};
  cache_->hold(m.block);
  ++refs_[static_cast<std::size_t>(m.block)];
  pins_.push_back(m.block);
  return {m.block, m.num_tokens};
}

void BlockManager::release_pins() {
  for (std::int32_t b : pins_)
    if (--refs_[static_cast<std::size_t>(b)] == 0) cache_->release(b);  // pinned blocks are named
  pins_.clear();
}

void BlockManager::unpin(std::int32_t block) {
  const auto it = std::find(pins_.rbegin(), pins_.rend(), block);
  if (it == pins_.rend()) return;
  pins_.erase(std::next(it).base());
  if (--refs_[static_cast<std::size_t>(block)] == 0) cache_->release(block);
}

std::vector<NamedBlock> BlockManager::named_blocks() const {
  std::vector<NamedBlock> out;
  if (!tier_names()) return out;
  for (int b = 0; b < num_blocks_; ++b)
    if (cache_->is_named(b)) out.push_back(cache_->named_block(b));
  return out;
}

std::vector<std::vector<std::byte>> BlockManager::fetch_from_tier(PrefixTier* tier, std::uint64_t seq_id,
                                                                  const Tokens& tokens, int max_tokens) const {
  std::vector<std::vector<std::byte>> out;
  std::size_t k = 0;
  std::uint64_t parent = 0;
  if (tier == nullptr || !tier_names() || !shared_head_end(seq_id, k, parent)) return out;
  const int full = std::min(max_tokens, tokens.size()) / block_size_;
  std::vector<std::int32_t> ids;
  for (auto i = static_cast<int>(k); i < full; ++i) {
    const std::uint64_t name = name_block(tokens, i, parent, ids);
    std::optional<std::vector<std::byte>> chunk = tier->get(name, parent, ids);
    if (!chunk) break;
    out.push_back(std::move(*chunk));
    parent = name;
  }
  return out;
}

std::vector<NamedBlock> BlockManager::uncached_blocks(const Tokens& tokens, int max_tokens) const {
  std::vector<NamedBlock> out;
  if (!tier_names()) return out;
  std::vector<std::int32_t> blocks;
  std::vector<std::uint64_t> names;
  cached_chain(tokens, max_tokens, blocks, names, nullptr);
  const int full = std::min(max_tokens, tokens.size()) / block_size_;
  std::uint64_t parent = names.empty() ? root_name_ : names.back();
  std::vector<std::int32_t> ids;
  for (auto i = static_cast<int>(names.size()); i < full; ++i) {
    const std::uint64_t name = name_block(tokens, i, parent, ids);
    out.push_back(NamedBlock{-1, name, parent, ids});
    parent = name;
  }
  return out;
}

std::vector<std::uint64_t> BlockManager::head_names(const Tokens& tokens, int num_blocks) const {
  std::vector<std::uint64_t> out;
  if (!tier_names()) return out;
  num_blocks = std::min(num_blocks, tokens.size() / block_size_);
  out.reserve(static_cast<std::size_t>(std::max(num_blocks, 0)));
  std::uint64_t parent = root_name_;
  std::vector<std::int32_t> ids;
  for (int i = 0; i < num_blocks; ++i) {
    parent = name_block(tokens, i, parent, ids);
    out.push_back(parent);
  }
  return out;
}

int BlockManager::peek_cached_prefix(const Tokens& tokens, int max_tokens) const {
  if (!cache_) return 0;
  std::vector<std::int32_t> blocks;
  std::vector<std::uint64_t> names;
  cached_chain(tokens, max_tokens, blocks, names, nullptr);
  return static_cast<int>(blocks.size()) * block_size_;
}

std::uint64_t BlockManager::name_block(const Tokens& tokens, int block, std::uint64_t parent,
                                       std::vector<std::int32_t>& ids) const {
  ids.resize(static_cast<std::size_t>(block_size_));
  for (int t = 0; t < block_size_; ++t) ids[static_cast<std::size_t>(t)] = tokens.at(block * block_size_ + t);
  return prefix_block_hash(parent, ids);
}

std::uint64_t BlockManager::parent_name(const SeqBlocks& s, std::size_t block) const {
  return block == 0 ? root_name_ : s.names[block - 1];
}

std::vector<std::uint64_t> BlockManager::pending_names(std::uint64_t seq_id, const Tokens& tokens,
                                                       int max_tokens) const {
  std::vector<std::uint64_t> names;
  const auto it = seqs_.find(seq_id);
  if (!cache_ || it == seqs_.end()) return names;
  const SeqBlocks& s = it->second;
  const int full = std::min(max_tokens, tokens.size()) / block_size_;
  std::vector<std::int32_t> ids;
  std::uint64_t parent = parent_name(s, s.names.size());
  for (auto i = static_cast<int>(s.names.size()); i < full; ++i) {
    parent = name_block(tokens, i, parent, ids);
    names.push_back(parent);
  }
  return names;
}

void BlockManager::cache_full_blocks(std::uint64_t seq_id, const Tokens& tokens, int num_computed_tokens) {
  if (!cache_) return;
  const auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  SeqBlocks& s = it->second;
  const int full = std::min({num_computed_tokens, tokens.size(), s.num_tokens}) / block_size_;
  std::vector<std::int32_t> ids;
  for (auto i = static_cast<int>(s.names.size()); i < full; ++i) {
    const std::uint64_t parent = parent_name(s, static_cast<std::size_t>(i));
    const std::uint64_t name = name_block(tokens, i, parent, ids);
    if (cache_->insert(s.table[static_cast<std::size_t>(i)], name, parent, ids))
      offered_[static_cast<std::size_t>(s.table[static_cast<std::size_t>(i)])] = 0;  // named anew
    s.names.push_back(name);
  }
}

const std::vector<std::int32_t>& BlockManager::block_table(std::uint64_t seq_id) const {
  static const std::vector<std::int32_t> kEmpty;
  const auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? kEmpty : it->second.table;
}

int BlockManager::num_tokens_covered(std::uint64_t seq_id) const {
  const auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? 0 : it->second.num_tokens;
}

Status BlockManager::check_integrity() const {
  auto fail = [](const std::string& m) { return make_error(ErrorCode::internal, "block manager: " + m); };
  std::vector<int> held(static_cast<std::size_t>(num_blocks_), 0);
  std::vector<int> free_uses(static_cast<std::size_t>(num_blocks_), 0);
  for (auto b : free_list_) {
    if (b < 0 || b >= num_blocks_) return fail("free list holds out-of-range block " + std::to_string(b));
    ++free_uses[static_cast<std::size_t>(b)];
  }
  for (auto b : pins_) {
    if (b < 0 || b >= num_blocks_ || !cache_ || !cache_->is_named(b))
      return fail("pinned block " + std::to_string(b) + " is out of range or not named");
    ++held[static_cast<std::size_t>(b)];
  }
  for (const auto& [id, s] : seqs_) {
    for (auto b : s.table) {
      if (b < 0 || b >= num_blocks_)
        return fail("sequence " + std::to_string(id) + " holds out-of-range block " + std::to_string(b));
      ++held[static_cast<std::size_t>(b)];
    }
    if (static_cast<int>(s.table.size()) != blocks_for_tokens(s.num_tokens))
      return fail("sequence " + std::to_string(id) + " has " + std::to_string(s.table.size()) +
                  " blocks for " + std::to_string(s.num_tokens) + " tokens");
  }
  for (int b = 0; b < num_blocks_; ++b) {
    const auto i = static_cast<std::size_t>(b);
    const bool named = cache_ && cache_->is_named(b);
    const bool evictable = cache_ && cache_->is_evictable(b);
    if (held[i] != refs_[i])
      return fail("block " + std::to_string(b) + " is in " + std::to_string(held[i]) + " tables but counts " +
                  std::to_string(refs_[i]) + " references");
    if (held[i] > 1 && !named) return fail("unnamed block " + std::to_string(b) + " is shared");
    const int places = free_uses[i] + (evictable ? 1 : 0) + (held[i] > 0 ? 1 : 0);
    if (places != 1)
      return fail("block " + std::to_string(b) + " is in " + std::to_string(places) +
                  " places (free list, evictable, tables)");
    if (free_uses[i] > 0 && named) return fail("named block " + std::to_string(b) + " is on the free list");
  }
  if (cache_) return cache_->check_integrity();
  return Status::ok_status();
}

}  // namespace shardline::engine
