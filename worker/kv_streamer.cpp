#include "worker/kv_streamer.hpp"

#include <algorithm>

namespace shardline::worker {

KvStreamer::KvStreamer(std::shared_ptr<kvstore::KvTarget> target, KvStreamerOptions options,
                       FlushedCallback on_flushed)
    : target_(std::move(target)), options_(options), on_flushed_(std::move(on_flushed)) {
  thread_ = std::thread([this] { run(); });
}

KvStreamer::~KvStreamer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool KvStreamer::accepting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.queued_bytes <= options_.max_queued_bytes;
}

void KvStreamer::push(QueuedIncrement increment) {
  // An increment over a batch is split by layers: the canonical chunk is
  // [layers, 2, heads, tokens, head_dim], so each layer's bytes are one run.
  std::vector<QueuedIncrement> parts;
  const kvstore::KvRange range = increment.key.range;
  const int num_layers = range.num_layers();
  if (increment.chunk.size() > options_.max_batch_bytes && num_layers > 1 &&
      increment.chunk.size() % static_cast<std::size_t>(num_layers) == 0) {
    const std::size_t slab = increment.chunk.size() / static_cast<std::size_t>(num_layers);
    const int per_part = static_cast<int>(std::max<std::uint64_t>(1, options_.max_batch_bytes / slab));
    for (int l = range.layer_begin; l < range.layer_end; l += per_part) {
      QueuedIncrement part;
      part.key = increment.key;
      part.key.range.layer_begin = l;
      part.key.range.layer_end = std::min(range.layer_end, l + per_part);
      const auto* from = increment.chunk.data() + static_cast<std::size_t>(l - range.layer_begin) * slab;
      part.chunk.assign(from, from + static_cast<std::size_t>(part.key.range.num_layers()) * slab);
      part.token_ids = increment.token_ids;
      part.num_prompt_tokens = increment.num_prompt_tokens;
      parts.push_back(std::move(part));
    }
  } else {
    parts.push_back(std::move(increment));
  }
  // A single layer still over a batch is split by positions: within a
  // layer the chunk is [2 * kv_heads rows, tokens, head_dim], so each part
  // takes its positions' run from every row.
  if (options_.num_kv_heads > 0) {
    std::vector<QueuedIncrement> split;
    for (QueuedIncrement& part : parts) {
      const kvstore::KvRange r = part.key.range;
      const auto rows = static_cast<std::size_t>(2 * options_.num_kv_heads);
      const auto tokens = static_cast<std::size_t>(r.num_tokens());
      if (part.chunk.size() <= options_.max_batch_bytes || r.num_layers() != 1 || tokens < 2 ||
          part.chunk.size() % (rows * tokens) != 0) {
        split.push_back(std::move(part));
        continue;
      }
      const std::size_t row_bytes = part.chunk.size() / (rows * tokens);  // one position of one row
      const std::size_t per = std::max<std::size_t>(1, options_.max_batch_bytes / (rows * row_bytes));
      for (std::size_t t0 = 0; t0 < tokens; t0 += per) {
        const std::size_t n = std::min(per, tokens - t0);
        QueuedIncrement piece;
        piece.key = part.key;
        piece.key.range.token_begin = r.token_begin + static_cast<int>(t0);
        piece.key.range.token_end = piece.key.range.token_begin + static_cast<int>(n);
        piece.chunk.resize(rows * n * row_bytes);
        for (std::size_t row = 0; row < rows; ++row)
          std::copy_n(part.chunk.data() + (row * tokens + t0) * row_bytes, n * row_bytes,
                      piece.chunk.data() + row * n * row_bytes);
        // token_ids hold positions [token_begin, token_end + 1).
        const std::size_t ids_end = std::min(part.token_ids.size(), t0 + n + 1);
        if (t0 < ids_end)
          piece.token_ids.assign(part.token_ids.begin() + static_cast<std::ptrdiff_t>(t0),
                                 part.token_ids.begin() + static_cast<std::ptrdiff_t>(ids_end));
        piece.num_prompt_tokens = part.num_prompt_tokens;
        split.push_back(std::move(piece));
      }
    }
    parts = std::move(split);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (QueuedIncrement& part : parts) {
      stats_.queued_bytes += part.chunk.size();
      ++stats_.pushed;
      queue_.push_back(std::move(part));
    }
    stats_.max_queued_bytes_seen = std::max(stats_.max_queued_bytes_seen, stats_.queued_bytes);
  }
  cv_.notify_one();
}

std::size_t KvStreamer::forget_request(std::uint64_t job_id, std::uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->key.job_id == job_id && it->key.request_id == request_id) {
      stats_.queued_bytes -= it->chunk.size();
      it = queue_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  stats_.forgotten += n;
  if (queue_.empty() && !in_flight_) drained_.notify_all();
  return n;
}

bool KvStreamer::drain(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return drained_.wait_for(lock, timeout, [this] { return queue_.empty() && !in_flight_; });
}

KvStreamerStats KvStreamer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void KvStreamer::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    // Take what is queued, up to max_batch_bytes, as one batch: one buffer,
    // one transfer (one message to the store).
    std::vector<QueuedIncrement> batch;
    std::uint64_t batch_bytes = 0;
    while (!queue_.empty() &&
           (batch.empty() || batch_bytes + queue_.front().chunk.size() <= options_.max_batch_bytes)) {
      batch_bytes += queue_.front().chunk.size();
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    in_flight_ = true;
    lock.unlock();

    std::vector<kvstore::KvChunkRef> refs;
    std::vector<kvstore::PrefixLinkWrite> links;
    std::size_t total = 0;
    for (const QueuedIncrement& inc : batch) total += inc.chunk.size();
    std::vector<std::byte> buffer;
    buffer.reserve(total);
    for (const QueuedIncrement& inc : batch) {
      if (inc.link) {
        links.push_back(kvstore::PrefixLinkWrite{inc.key.job_id, inc.key.request_id, inc.link->salt, inc.link->root,
                                                 inc.link->names, inc.token_ids});
        continue;
      }
      refs.push_back({inc.key, buffer.size(), inc.chunk.size()});
      buffer.insert(buffer.end(), inc.chunk.begin(), inc.chunk.end());
    }
    const Status s = links.empty() ? target_->flush_batch(refs, buffer) : target_->flush_linked(refs, buffer, links);

    lock.lock();
    if (!s.ok()) {
      in_flight_ = false;
      // Put the batch back in front, in order, and retry after a pause (the
      // store may be restarting). forget_request may have dropped some of
      // its requests meanwhile: they were not in the queue, so they come back;
      // the store's garbage collection removes them.
      ++stats_.failed_flushes;
      for (auto it = batch.rbegin(); it != batch.rend(); ++it) queue_.push_front(std::move(*it));
      cv_.wait_for(lock, options_.retry_interval, [this] { return stop_; });
      if (stop_) return;
      continue;
    }
    ++stats_.batches;
    stats_.flushed += batch.size();
    stats_.flushed_bytes += total;
    stats_.queued_bytes -= total;
    if (on_flushed_) {
      for (QueuedIncrement& inc : batch) std::vector<std::byte>().swap(inc.chunk);
      lock.unlock();
      on_flushed_(std::move(batch));
      lock.lock();
    }
    in_flight_ = false;  // after the callback: drain() means "flushed and reported"
    if (queue_.empty()) drained_.notify_all();
  }
}

}  // namespace shardline::worker
