#include "worker/store_prefix_tier.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace shardline::worker {

StorePrefixTier::StorePrefixTier(std::shared_ptr<PrefixBlockStore> store, StorePrefixTierOptions options)
    : host_(options.host_bytes), store_(std::move(store)), options_(options) {
  thread_ = std::thread([this] { run(); });
}

StorePrefixTier::~StorePrefixTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StorePrefixTier::note_in_store_locked(std::uint64_t name) {
  if (in_store_.size() >= kMaxKnownNames) in_store_.clear();
  in_store_[name] = std::chrono::steady_clock::now();
}

void StorePrefixTier::put(std::uint64_t name, std::uint64_t parent, std::span<const std::int32_t> tokens,
                          std::vector<std::byte> chunk) {
  bool queue = false;
  {
    std::lock_guard lock(mu_);
    if (in_store_.count(name) == 0 && queued_.count(name) == 0) {
      if (stats_.queued_bytes + chunk.size() > options_.max_queued_bytes) {
        ++stats_.dropped_blocks;
      } else {
        queue = true;
        stats_.queued_bytes += chunk.size();
        queued_.insert(name);
        queue_.push_back(Pending{name, parent, std::vector<std::int32_t>(tokens.begin(), tokens.end()), chunk});
      }
    }
  }
  host_.put(name, parent, tokens, std::move(chunk));
  if (queue) cv_.notify_one();
}

bool StorePrefixTier::touch(std::uint64_t name) { return host_.touch(name); }

std::optional<std::vector<std::byte>> StorePrefixTier::get(std::uint64_t name, std::uint64_t parent,
                                                           std::span<const std::int32_t> tokens) {
  return host_.get(name, parent, tokens);
}

int StorePrefixTier::prefetch(std::span<const engine::NamedBlock> blocks) {
  std::size_t next = 0;
  while (next < blocks.size() && host_.touch(blocks[next].name)) ++next;
  if (next == blocks.size()) return 0;
  {
    std::lock_guard lock(mu_);
    if (std::chrono::steady_clock::now() < fetch_again_at_) {
      ++stats_.prefetches_skipped;
      return 0;
    }
  }
  const std::size_t per_fetch =
      std::max<std::size_t>(1, options_.block_bytes > 0 ? options_.max_fetch_bytes / options_.block_bytes : 1);
  int staged = 0;
  while (next < blocks.size()) {
    const std::size_t end = std::min(blocks.size(), next + per_fetch);
    std::vector<kvstore::PrefixBlockQuery> queries;
    queries.reserve(end - next);
    for (std::size_t i = next; i < end; ++i)
      queries.push_back(kvstore::PrefixBlockQuery{blocks[i].name, blocks[i].parent, blocks[i].tokens});
    auto fetched = store_->fetch_blocks(options_.salt, queries);
    {
      std::lock_guard lock(mu_);
      ++stats_.prefetches;
      if (!fetched) {
        ++stats_.prefetch_failures;
        fetch_again_at_ = std::chrono::steady_clock::now() + options_.fetch_backoff;
      } else {
        stats_.fetched_blocks += fetched->size();
        for (const kvstore::StoredPrefixBlock& b : *fetched) {
          note_in_store_locked(b.name);
          stats_.fetched_tokens += b.tokens.size();
        }
      }
    }
    if (!fetched) {
      spdlog::debug("prefix tier: fetch of {} blocks from the KV store: {}", queries.size(),
                    fetched.error().to_string());
      break;
    }
    // The store compared each block's parent and tokens with the query's;
    // host memory compares them again at the admission's get.
    const std::size_t got = fetched->size();
    for (kvstore::StoredPrefixBlock& b : *fetched) {
      if (options_.block_bytes > 0 && b.chunk.size() != options_.block_bytes) {
        // Not this engine's block size: restoring it would fail the step.
        std::lock_guard lock(mu_);
        ++stats_.wrong_size_blocks;
        return staged;
      }
      host_.put(b.name, b.parent, b.tokens, std::move(b.chunk));
      ++staged;
    }
    if (got < queries.size()) break;  // the store's run ends here
    next = end;
  }
  return staged;
}

void StorePrefixTier::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::vector<Pending> batch;
    std::uint64_t batch_bytes = 0;
    while (!queue_.empty() && (batch.empty() || batch_bytes + queue_.front().chunk.size() <= options_.max_batch_bytes)) {
      batch_bytes += queue_.front().chunk.size();
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    in_flight_ = true;
    lock.unlock();
    std::vector<kvstore::PrefixBlockWrite> writes;
    writes.reserve(batch.size());
    for (const Pending& p : batch)
      writes.push_back(kvstore::PrefixBlockWrite{options_.salt, p.name, p.parent, p.tokens, p.chunk});
    auto kept = store_->put_blocks(options_.salt, writes);
    if (!kept) spdlog::debug("prefix tier: {} blocks to the KV store: {}", batch.size(), kept.error().to_string());
    lock.lock();
    in_flight_ = false;
    stats_.queued_bytes -= batch_bytes;
    stats_.store_sent_blocks += batch.size();
    for (const Pending& p : batch) queued_.erase(p.name);
    if (kept) {
      for (const std::uint64_t name : kept->kept) note_in_store_locked(name);
      stats_.store_kept_blocks += static_cast<std::uint64_t>(kept->stored);
      stats_.store_skipped_blocks += batch.size() - std::min(batch.size(), kept->kept.size());
    } else {
      ++stats_.store_put_failures;
    }
    if (queue_.empty()) drained_.notify_all();
  }
}

std::size_t StorePrefixTier::linkable_blocks(std::span<const std::uint64_t> names) const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  while (n < names.size() && (in_store_.count(names[n]) != 0 || queued_.count(names[n]) != 0)) ++n;
  return n;
}

bool StorePrefixTier::on_its_way(std::uint64_t name, std::chrono::steady_clock::time_point sent_at) {
  std::lock_guard lock(mu_);
  if (queued_.count(name) != 0) return true;
  const auto kept = in_store_.find(name);
  if (kept != in_store_.end() && kept->second >= sent_at) return true;
  if (kept != in_store_.end()) in_store_.erase(kept);
  return false;
}

bool StorePrefixTier::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return drained_.wait_for(lock, timeout, [this] { return queue_.empty() && !in_flight_; });
}

StorePrefixTierStats StorePrefixTier::stats() const {
  std::lock_guard lock(mu_);
  StorePrefixTierStats s = stats_;
  s.host = host_.stats();
  return s;
}

}  // namespace shardline::worker
