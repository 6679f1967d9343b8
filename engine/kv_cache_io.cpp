#include "engine/kv_cache_io.hpp"

#include <string>

namespace shardline::engine {

KvCacheIo::KvCacheIo(model::ModelExecutor& executor, std::uint64_t swap_space_bytes)
    : shape_(executor.kv_model_shape()),
      block_size_(std::max(executor.block_size(), 1)),
      views_(executor.kv_cache_views()),
      swap_space_bytes_(swap_space_bytes) {
  if (views_.empty()) remote_ = executor.kv_copier();
  if (shape_.num_layers <= 0 || shape_.num_kv_heads <= 0 || shape_.head_dim <= 0) {
    views_.clear();
    remote_ = nullptr;
  }
}

Status KvCacheIo::copy_out(std::span<const std::int32_t> table, const kvstore::KvRange& range,
                           std::span<std::byte> chunk) {
  if (!views_.empty()) return kvstore::copy_out(shape_, views_, table, range, chunk);
  if (remote_ == nullptr) return make_error(ErrorCode::internal, "this executor's KV caches cannot be copied");
  return remote_->copy_out(table, range, chunk);
}

Status KvCacheIo::copy_in(std::span<const std::int32_t> table, const kvstore::KvRange& range,
                          std::span<const std::byte> chunk) {
  if (!views_.empty()) return kvstore::copy_in(shape_, views_, table, range, chunk);
  if (remote_ == nullptr) return make_error(ErrorCode::internal, "this executor's KV caches cannot be copied");
  return remote_->copy_in(table, range, chunk);
}

std::size_t KvCacheIo::bytes_for(int num_tokens) const noexcept {
  return kvstore::chunk_bytes(shape_, kvstore::KvRange{0, shape_.num_layers, 0, num_tokens});
}

Result<bool> KvCacheIo::copy_and_hold(const SwapOut& move) {
  const std::size_t bytes = bytes_for(move.num_tokens);
  if (!can_copy_kv() || stats_.swap_space_bytes_used + bytes > swap_space_bytes_ || held_.count(move.seq_id) != 0)
    return false;
  Held h;
  h.num_tokens = move.num_tokens;
  h.swapped = true;
  h.bytes = bytes;
  if (copies_bytes()) h.chunk.resize(bytes);
  const kvstore::KvRange range{0, shape_.num_layers, 0, move.num_tokens};
  if (Status s = copy_out(move.block_table, range, h.chunk); !s.ok())
    return make_error(s.error().code == ErrorCode::io ? ErrorCode::io : ErrorCode::internal,
                      "swap out of request " + std::to_string(move.seq_id) + ": " + s.error().message);
  stats_.swap_space_bytes_used += bytes;
  held_.emplace(move.seq_id, std::move(h));
  return true;
}

Result<bool> KvCacheIo::swap_out(const SwapOut& swap) {
  Result<bool> kept = copy_and_hold(swap);
  if (!kept.ok()) return kept;
  if (!*kept) {
    ++stats_.swap_fallbacks;
    return false;
  }
  ++stats_.swap_outs;
  stats_.swapped_out_bytes += bytes_for(swap.num_tokens);
  return true;
}

Status KvCacheIo::hold_resumed(std::uint64_t seq_id, int num_tokens, std::vector<std::byte> chunk,
                               int known_positions) {
  const std::string who = "request " + std::to_string(seq_id) + ": ";
  // A copier that moves no bytes (the simulator's) restores an empty chunk.
  const bool priced_only = can_copy_kv() && !copies_bytes();
  if (!can_move_kv() && !priced_only)
    return make_error(ErrorCode::invalid_argument, who + "this executor's KV caches cannot be restored");
  if (num_tokens <= 0 || chunk.size() != (priced_only ? 0 : bytes_for(num_tokens)))
    return make_error(ErrorCode::invalid_argument,
                      who + "a resumed KV chunk of " + std::to_string(chunk.size()) + " bytes does not hold " +
                          std::to_string(num_tokens) + " positions (" + std::to_string(bytes_for(num_tokens)) +
                          " bytes)");
  drop(seq_id);
  Held h;
  h.num_tokens = num_tokens;
  h.known_positions = known_positions;
  h.bytes = priced_only ? bytes_for(num_tokens) : chunk.size();
  h.chunk = std::move(chunk);
  held_.emplace(seq_id, std::move(h));
  return Status::ok_status();
}

Status KvCacheIo::restore_tier_blocks(const TierRestore& restore, const std::vector<std::int32_t>& block_table) {
  const std::string who = "prefix tier restore into request " + std::to_string(restore.seq_id) + ": ";
  if (!can_copy_kv()) return make_error(ErrorCode::internal, who + "this executor's KV caches cannot be copied");
  const std::size_t block_bytes = bytes_for(block_size_);
  for (std::size_t i = 0; i < restore.blocks.size(); ++i) {
    const int begin = restore.token_begin + static_cast<int>(i) * block_size_;
    if ((copies_bytes() && restore.blocks[i].size() != block_bytes) ||
        static_cast<std::size_t>(begin / block_size_) >= block_table.size())
      return make_error(ErrorCode::invalid_argument,
                        who + "block at position " + std::to_string(begin) + ": " +
                            std::to_string(restore.blocks[i].size()) + " bytes (" + std::to_string(block_bytes) +
                            " expected) into a table of " + std::to_string(block_table.size()) + " blocks");
    const kvstore::KvRange range{0, shape_.num_layers, begin, begin + block_size_};
    if (Status s = copy_in(block_table, range, restore.blocks[i]); !s.ok())
      return make_error(s.error().code, who + s.error().message);
  }
  stats_.prefix_tier_restored_tokens += static_cast<std::uint64_t>(restore.blocks.size()) * block_size_;
  return Status::ok_status();
}

Result<std::vector<std::byte>> KvCacheIo::copy_block(std::int32_t block) {
  const kvstore::KvRange range{0, shape_.num_layers, 0, block_size_};
  std::vector<std::byte> chunk(kvstore::chunk_bytes(shape_, range));
  const std::int32_t table[] = {block};
  if (Status s = copy_out(table, range, chunk); !s.ok()) return s.error();
  ++stats_.prefix_tier_spilled_blocks;
  return chunk;
}

Status KvCacheIo::restore(const KvRestore& restore, const std::vector<std::int32_t>& block_table) {
  const auto it = held_.find(restore.seq_id);
  const std::string who = "restore of request " + std::to_string(restore.seq_id) + ": ";
  if (it == held_.end() || it->second.moving) return make_error(ErrorCode::not_found, who + "no KV held for it");
  if (it->second.num_tokens != restore.num_tokens)
    return make_error(ErrorCode::invalid_argument, who + std::to_string(restore.num_tokens) +
                                                       " positions asked, " +
                                                       std::to_string(it->second.num_tokens) + " held");
  const kvstore::KvRange range{0, shape_.num_layers, 0, restore.num_tokens};
  if (Status s = copy_in(block_table, range, it->second.chunk); !s.ok())
    return make_error(s.error().code, who + s.error().message);
  count_restore(it->second);
  drop(restore.seq_id);
  return Status::ok_status();
}

void KvCacheIo::count_restore(const Held& held) noexcept {
  if (held.offloaded) {
    ++stats_.onboards;
    stats_.onboarded_bytes += held.bytes;
  } else if (held.swapped) {
    ++stats_.swap_ins;
    stats_.swapped_in_bytes += held.bytes;
  } else {
    stats_.restored_tokens += static_cast<std::uint64_t>(held.num_tokens);
    count_resume_recompute(held.known_positions - held.num_tokens);
  }
}

Status KvCacheIo::copy_prefix(const PrefixCopy& copy, const std::vector<std::int32_t>& block_table) {
  const std::string who = "prefix copy into request " + std::to_string(copy.seq_id) + ": ";
  if (!can_copy_kv()) return make_error(ErrorCode::internal, who + "this executor's KV caches cannot be copied");
  const auto block = static_cast<std::size_t>(std::max(copy.token_begin, 0) / block_size_);
  if (copy.num_tokens <= 0 || copy.token_begin < 0 || copy.token_begin % block_size_ != 0 ||
      copy.num_tokens >= block_size_ ||
      block >= block_table.size())
    return make_error(ErrorCode::invalid_argument,
                      who + "positions [" + std::to_string(copy.token_begin) + ", " +
                          std::to_string(copy.token_begin + copy.num_tokens) + ") are not the head of one of its " +
                          std::to_string(block_table.size()) + " blocks");
  // The sequence's table up to that block, whose entry is the source block.
  std::vector<std::int32_t> src(block_table.begin(), block_table.begin() + static_cast<std::ptrdiff_t>(block) + 1);
  src[block] = copy.src_block;
  const kvstore::KvRange range{0, shape_.num_layers, copy.token_begin, copy.token_begin + copy.num_tokens};
  std::vector<std::byte> chunk(copies_bytes() ? kvstore::chunk_bytes(shape_, range) : 0);
  if (Status s = copy_out(src, range, chunk); !s.ok()) return make_error(s.error().code, who + s.error().message);
  if (Status s = copy_in(block_table, range, chunk); !s.ok())
    return make_error(s.error().code, who + s.error().message);
  stats_.prefix_copied_tokens += static_cast<std::uint64_t>(copy.num_tokens);
  return Status::ok_status();
}

Result<std::vector<std::byte>> KvCacheIo::copy_layers(const std::vector<std::int32_t>& block_table,
                                                      int layer_begin, int layer_end, int token_begin, int token_end) {
  const kvstore::KvRange range{layer_begin, layer_end, token_begin, token_end};
  std::vector<std::byte> chunk(kvstore::chunk_bytes(shape_, range));
  if (Status s = copy_out(block_table, range, chunk); !s.ok()) return s.error();
  stats_.streamed_bytes += chunk.size();
  return chunk;
}

namespace {

/// One buffer per range, each the range's canonical chunk size, and spans over them.
struct SizedChunks {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::span<std::byte>> spans;
  SizedChunks(const kvstore::KvModelShape& shape, std::size_t n, const auto& range_of) : bytes(n) {
    for (std::size_t i = 0; i < n; ++i) {
      bytes[i].resize(kvstore::chunk_bytes(shape, range_of(i)));
      spans.emplace_back(bytes[i]);
    }
  }
};

}  // namespace

Result<std::vector<std::vector<std::byte>>> KvCacheIo::copy_increments(std::span<const kvstore::KvCopyItem> items) {
  SizedChunks chunks(shape_, items.size(), [&](std::size_t i) { return items[i].range; });
  if (!views_.empty()) {
    for (std::size_t i = 0; i < items.size(); ++i)
      if (Status s = copy_out(items[i].block_table, items[i].range, chunks.spans[i]); !s.ok()) return s.error();
  } else {
    if (remote_ == nullptr) return make_error(ErrorCode::internal, "this executor's KV caches cannot be copied");
    if (Status s = remote_->copy_out_batch(items, chunks.spans); !s.ok()) return s.error();
  }
  for (const auto& c : chunks.bytes) stats_.streamed_bytes += c.size();
  return std::move(chunks.bytes);
}

Result<std::uint64_t> KvCacheIo::begin_copy_layers(std::span<const kvstore::KvCopyItem> items) {
  if (!copies_in_stream_order())
    return make_error(ErrorCode::internal, "this executor's KV copier does not order copies on the device");
  return remote_->begin_copy_out(items);
}

Result<std::vector<std::vector<std::byte>>> KvCacheIo::end_copy_layers(std::uint64_t ticket,
                                                                      std::span<const kvstore::KvRange> ranges) {
  if (!copies_in_stream_order())
    return make_error(ErrorCode::internal, "this executor's KV copier does not order copies on the device");
  SizedChunks chunks(shape_, ranges.size(), [&](std::size_t i) { return ranges[i]; });
  if (Status s = remote_->end_copy_out(ticket, chunks.spans); !s.ok()) return s.error();
  for (const auto& c : chunks.bytes) stats_.streamed_bytes += c.size();
  return std::move(chunks.bytes);
}

void KvCacheIo::drop(std::uint64_t seq_id) {
  const auto it = held_.find(seq_id);
  if (it == held_.end() || it->second.moving) return;
  if (it->second.swapped) stats_.swap_space_bytes_used -= it->second.bytes;
  held_.erase(it);
}

Status KvCacheIo::set_views(std::vector<kvstore::KvCacheView> views) {
  if (views.empty() && remote_ == nullptr)
    return make_error(ErrorCode::internal, "KV caches replaced by none (the executor's caches cannot be copied)");
  if (mover_) {
    Status s = views.empty() ? mover_->set_copier(remote_) : mover_->set_caches(shape_, views);
    if (!s.ok()) return s;
  }
  views_ = std::move(views);
  return Status::ok_status();
}

Status KvCacheIo::start_mover(std::unique_ptr<KvTransferQueue> mover) {
  if (mover_) return make_error(ErrorCode::internal, "KV mover started twice");
  if (!mover) return make_error(ErrorCode::internal, "KV mover: none given");
  if (!can_copy_kv()) return make_error(ErrorCode::internal, "KV mover: this executor's caches cannot be copied");
  Status set = views_.empty() ? mover->set_copier(remote_) : mover->set_caches(shape_, views_);
  if (!set.ok()) return set;
  mover_ = std::move(mover);
  return Status::ok_status();
}

bool KvCacheIo::move_pending(std::uint64_t seq_id) const {
  const auto it = held_.find(seq_id);
  return it != held_.end() && it->second.moving;
}

Result<bool> KvCacheIo::begin_offload(const SwapOut& offload) {
  const std::string who = "offload of request " + std::to_string(offload.seq_id) + ": ";
  if (!mover_) return make_error(ErrorCode::internal, who + "no KV mover");
  if (held_.count(offload.seq_id) != 0) return make_error(ErrorCode::internal, who + "KV is held for it already");
  const std::size_t bytes = bytes_for(offload.num_tokens);
  if (stats_.swap_space_bytes_used + bytes > swap_space_bytes_) {
    ++stats_.offload_fallbacks;
    return false;
  }
  Held h;
  h.num_tokens = offload.num_tokens;
  h.swapped = true;
  h.offloaded = true;
  h.moving = true;
  h.bytes = bytes;
  held_.emplace(offload.seq_id, std::move(h));
  stats_.swap_space_bytes_used += bytes;
  KvTransfer t;
  t.direction = KvTransfer::Direction::to_host;
  t.seq_id = offload.seq_id;
  t.block_table = offload.block_table;
  t.range = kvstore::KvRange{0, shape_.num_layers, 0, offload.num_tokens};
  if (copies_bytes()) t.chunk.resize(bytes);
  mover_->submit(std::move(t));
  return true;
}

Status KvCacheIo::begin_onboard(const KvRestore& restore, const std::vector<std::int32_t>& block_table) {
  const std::string who = "onboard of request " + std::to_string(restore.seq_id) + ": ";
  if (!mover_) return make_error(ErrorCode::internal, who + "no KV mover");
  const auto it = held_.find(restore.seq_id);
  if (it == held_.end() || it->second.moving) return make_error(ErrorCode::not_found, who + "no KV held for it");
  if (it->second.num_tokens != restore.num_tokens)
    return make_error(ErrorCode::invalid_argument, who + std::to_string(restore.num_tokens) + " positions asked, " +
                                                       std::to_string(it->second.num_tokens) + " held");
  KvTransfer t;
  t.direction = KvTransfer::Direction::to_device;
  t.seq_id = restore.seq_id;
  t.block_table = block_table;
  t.range = kvstore::KvRange{0, shape_.num_layers, 0, restore.num_tokens};
  t.chunk = std::move(it->second.chunk);
  it->second.chunk.clear();
  it->second.moving = true;
  mover_->submit(std::move(t));
  return Status::ok_status();
}

Result<std::vector<KvCacheIo::MoveDone>> KvCacheIo::apply_moves(std::vector<KvTransferDone> done) {
  std::vector<MoveDone> out;
  out.reserve(done.size());
  for (KvTransferDone& d : done) {
    const bool to_host = d.transfer.direction == KvTransfer::Direction::to_host;
    const std::uint64_t id = d.transfer.seq_id;
    const std::string who = std::string(to_host ? "offload" : "onboard") + " of request " + std::to_string(id) + ": ";
    if (!d.status.ok()) return make_error(ErrorCode::internal, who + d.status.error().message);
    const auto it = held_.find(id);
    if (it == held_.end() || !it->second.moving)
      return make_error(ErrorCode::internal, who + "a completion for a transfer not started here");
    it->second.moving = false;
    if (to_host) {
      it->second.chunk = std::move(d.transfer.chunk);
      ++stats_.offloads;
      stats_.offloaded_bytes += it->second.bytes;
    } else {
      count_restore(it->second);
      drop(id);
    }
    out.push_back({id, to_host});
  }
  return out;
}

Result<std::vector<KvCacheIo::MoveDone>> KvCacheIo::poll_moves() {
  if (!mover_) return std::vector<MoveDone>{};
  return apply_moves(mover_->poll());
}

Result<std::vector<KvCacheIo::MoveDone>> KvCacheIo::wait_moves() {
  if (!mover_) return std::vector<MoveDone>{};
  return apply_moves(mover_->wait_any());
}

Result<std::vector<KvCacheIo::MoveDone>> KvCacheIo::drain_moves() {
  if (!mover_) return std::vector<MoveDone>{};
  return apply_moves(mover_->drain());
}

}  // namespace shardline::engine
