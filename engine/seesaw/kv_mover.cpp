#include "engine/seesaw/kv_mover.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace shardline::engine {

KvMover::KvMover(KvMoverOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<KvMover>> KvMover::create(KvMoverOptions options) {
  if (options.num_devices < 1)
    return make_error(ErrorCode::invalid_argument,
                      "KV mover: num_devices must be >= 1, got " + std::to_string(options.num_devices));
  std::shared_ptr<comm::LinkModel> link;
  if (options.host_link) {
    auto model = comm::LinkModel::create(1, *options.host_link);
    if (!model.ok()) return make_error(ErrorCode::invalid_argument, "host link: " + model.error().message);
    link = std::move(model).value();
  }
  auto mover = std::unique_ptr<KvMover>(new KvMover(std::move(options)));
  mover->link_ = std::move(link);
  if (mover->options_.async) mover->thread_ = std::thread([m = mover.get()] { m->thread_main(); });
  return mover;
}

KvMover::~KvMover() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    tasks_.clear();  // the engine is going away: queued copies are not needed (the running one finishes)
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status KvMover::set_caches(kvstore::KvModelShape shape, std::vector<kvstore::KvCacheView> views) {
  if (pending_ != 0)
    return make_error(ErrorCode::internal, "KV mover: the caches changed with " + std::to_string(pending_) +
                                               " transfers pending (drain before a config switch)");
  owned_ = std::make_unique<kvstore::KvViewsCopier>(shape, std::move(views));
  copier_ = owned_.get();
  return Status::ok_status();
}

Status KvMover::set_copier(kvstore::KvCopier* copier) {
  if (pending_ != 0)
    return make_error(ErrorCode::internal, "KV mover: the caches changed with " + std::to_string(pending_) +
                                               " transfers pending (drain before a config switch)");
  if (copier == nullptr) return make_error(ErrorCode::internal, "KV mover: no copier");
  owned_.reset();
  copier_ = copier;
  return Status::ok_status();
}

KvTransferDone KvMover::run(KvTransfer transfer) {
  const auto t0 = Clock::now();
  KvTransferDone done;
  const bool to_host = transfer.direction == KvTransfer::Direction::to_host;
  if (copier_ == nullptr)
    done.status = make_error(ErrorCode::internal, "KV mover: a transfer before set_caches / set_copier");
  else
    done.status = to_host ? copier_->copy_out(transfer.block_table, transfer.range, transfer.chunk)
                          : copier_->copy_in(transfer.block_table, transfer.range, transfer.chunk);
  if (link_ && done.status.ok()) {
    // Each device moves its shard over its own link, in parallel.
    const auto per_device = static_cast<std::uint64_t>(transfer.chunk.size()) /
                            static_cast<std::uint64_t>(options_.num_devices);
    std::this_thread::sleep_until(t0 + link_->transfer_time(per_device));
  }
  done.transfer_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  done.transfer = std::move(transfer);
  return done;
}

void KvMover::thread_main() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_ with nothing left
    KvTransfer task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    KvTransferDone done = run(std::move(task));
    lock.lock();
    ready_.push_back(std::move(done));
    done_cv_.notify_all();
  }
}

void KvMover::submit(KvTransfer transfer) {
  ++pending_;
  if (!options_.async) {
    KvTransferDone done = run(std::move(transfer));
    std::lock_guard lock(mu_);
    stats_.wait_ms += done.transfer_ms;  // the caller ran all of it
    ready_.push_back(std::move(done));
    return;
  }
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(transfer));
  }
  cv_.notify_one();
}

std::vector<KvTransferDone> KvMover::take_ready_locked() {
  std::vector<KvTransferDone> out = std::move(ready_);
  ready_.clear();
  for (const KvTransferDone& d : out) {
    ++stats_.num_transfers;
    stats_.transfer_ms += d.transfer_ms;
    (d.transfer.direction == KvTransfer::Direction::to_host ? stats_.bytes_to_host : stats_.bytes_to_device) +=
        d.transfer.chunk.size();
  }
  pending_ -= static_cast<int>(out.size());
  return out;
}

std::vector<KvTransferDone> KvMover::poll() {
  std::lock_guard lock(mu_);
  return take_ready_locked();
}

std::vector<KvTransferDone> KvMover::wait_any() {
  std::unique_lock lock(mu_);
  if (pending_ == 0) return {};
  const auto t0 = Clock::now();
  done_cv_.wait(lock, [&] { return !ready_.empty(); });
  // (A synchronous transfer was counted as waited for when submit ran it.)
  if (options_.async) stats_.wait_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return take_ready_locked();
}

std::vector<KvTransferDone> KvMover::drain() {
  std::vector<KvTransferDone> out;
  while (pending_ > 0) {
    std::vector<KvTransferDone> some = wait_any();
    for (KvTransferDone& d : some) out.push_back(std::move(d));
  }
  return out;
}

KvMoverStats KvMover::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace shardline::engine
