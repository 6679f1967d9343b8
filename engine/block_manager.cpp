#include "engine/block_manager.hpp"

#include <algorithm>
#include <string>

namespace shardline::engine {

BlockManager::BlockManager(int num_blocks, int block_size)
    : num_blocks_(std::max(num_blocks, 0)), block_size_(std::max(block_size, 1)) {
  free_list_.reserve(static_cast<std::size_t>(num_blocks_));
  for (int b = num_blocks_ - 1; b >= 0; --b) free_list_.push_back(b);  // block 0 handed out first
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
  for (int i = 0; i < missing; ++i) {
    s.table.push_back(free_list_.back());
    free_list_.pop_back();
  }
  s.num_tokens = std::max(s.num_tokens, num_total_tokens);
  return Status::ok_status();
}

void BlockManager::free(std::uint64_t seq_id) {
  const auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  const auto& table = it->second.table;
  for (auto b = table.rbegin(); b != table.rend(); ++b) free_list_.push_back(*b);
  seqs_.erase(it);
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
  std::vector<int> uses(static_cast<std::size_t>(num_blocks_), 0);
  auto mark = [&](std::int32_t b) {
    if (b < 0 || b >= num_blocks_) return false;
    ++uses[static_cast<std::size_t>(b)];
    return true;
  };
  for (auto b : free_list_)
    if (!mark(b)) return fail("free list holds out-of-range block " + std::to_string(b));
  for (const auto& [id, s] : seqs_) {
    for (auto b : s.table)
      if (!mark(b))
        return fail("sequence " + std::to_string(id) + " holds out-of-range block " + std::to_string(b));
    if (static_cast<int>(s.table.size()) != blocks_for_tokens(s.num_tokens))
      return fail("sequence " + std::to_string(id) + " has " + std::to_string(s.table.size()) +
                  " blocks for " + std::to_string(s.num_tokens) + " tokens");
  }
  for (int b = 0; b < num_blocks_; ++b)
    if (uses[static_cast<std::size_t>(b)] != 1)
      return fail("block " + std::to_string(b) + " is used " + std::to_string(uses[b]) +
                  " times (free + owned)");
  return Status::ok_status();
}

}  // namespace shardline::engine
