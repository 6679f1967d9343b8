#include "model/sidp/weight_cache.hpp"

#include <algorithm>
#include <cstring>

#include "common/stopwatch.hpp"

namespace shardline::model::sidp {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

WeightCache::WeightCache(const OwnershipPlan& plan, int rank, std::vector<int> order,
                         std::vector<std::size_t> region_bytes, std::size_t slot_bytes, comm::Communicator* comm,
                         const WeightCacheOptions& options)
    : plan_(plan),
      rank_(rank),
      order_(std::move(order)),
      region_bytes_(std::move(region_bytes)),
      slot_bytes_(slot_bytes),
      comm_(comm),
      options_(options) {}

Result<std::unique_ptr<WeightCache>> WeightCache::create(const OwnershipPlan& plan, int rank,
                                                         std::vector<int> fetch_order,
                                                         std::vector<std::size_t> region_bytes,
                                                         comm::Communicator* comm, const WeightCacheOptions& options) {
  if (fetch_order.empty())
    return make_error(ErrorCode::invalid_argument, "sidp weight cache: rank " + std::to_string(rank) +
                                                       " owns every layer, it fetches nothing");
  if (comm == nullptr) return make_error(ErrorCode::invalid_argument, "sidp weight cache: no communicator");
  if (region_bytes.size() != static_cast<std::size_t>(plan.num_layers()))
    return make_error(ErrorCode::invalid_argument, "sidp weight cache: region sizes of " +
                                                       std::to_string(region_bytes.size()) + " layers for a plan of " +
                                                       std::to_string(plan.num_layers()));
  std::size_t slot_bytes = 0;  // the largest region the ring fetches
  for (int l : fetch_order) {
    if (l < 0 || l >= plan.num_layers())
      return make_error(ErrorCode::invalid_argument, "sidp weight cache: layer " + std::to_string(l) +
                                                         " outside the plan");
    slot_bytes = std::max(slot_bytes, region_bytes[static_cast<std::size_t>(l)]);
  }
  const int need = min_cache_slots(plan, rank, fetch_order);
  const int n = std::max(options.cache_slots, need);
  std::unique_ptr<WeightCache> c(
      new WeightCache(plan, rank, std::move(fetch_order), std::move(region_bytes), slot_bytes, comm, options));
  c->slots_.resize(static_cast<std::size_t>(n));
  for (Slot& s : c->slots_) {
    if (options.slot_memory) {
      s.region = options.slot_memory->allocate(slot_bytes);
    } else if ((s.host = allocate_aligned(slot_bytes))) {
      s.region = s.host.get();
      std::memset(s.region, 0, slot_bytes);  // fault the pages in now, not during steps
    }
    if (s.region == nullptr)
      return make_error(ErrorCode::out_of_memory, "sidp weight cache: cannot allocate " + std::to_string(n) +
                                                      " slots of " + std::to_string(slot_bytes) + " bytes" +
                                                      (options.slot_memory ? " of device memory" : ""));
  }
  c->paused_ = options.start_paused;
  c->housekeeper_ = std::thread([p = c.get()] { p->housekeeper_loop(); });
  return c;
}

WeightCache::~WeightCache() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (housekeeper_.joinable()) housekeeper_.join();
  if (options_.slot_memory)
    for (Slot& s : slots_)
      if (s.region != nullptr) options_.slot_memory->release(s.region);
}

Status WeightCache::fetch(int layer, void* dst) {
  const int owner = plan_.owner(layer);
  const std::string name = ffn_region_name(layer);
  const auto deadline = Clock::now() + options_.owner_wait;
  for (;;) {
    Status st = comm_->get(owner, name, 0, dst, region_bytes_[static_cast<std::size_t>(layer)]);
    // not_found: the owner withdrew its regions (killed, respawning): wait.
    // io: the owner's rank is gone (a dead process, a rank marked dead) or
    // did not answer within the communicator's timeout: waiting more would
    // only delay the failure its peers must see.
    if (st.ok() || st.error().code != ErrorCode::not_found) return st;
    if (Clock::now() >= deadline)
      return make_error(ErrorCode::io, "sidp rank " + std::to_string(rank_) + ": owner " + std::to_string(owner) +
                                           " of layer " + std::to_string(layer) + " did not serve its weights within " +
                                           std::to_string(options_.owner_wait.count()) + " ms (" +
                                           st.error().message + ")");
    std::unique_lock lk(mu_);
    ++stats_.fetch_retries;
    if (cv_.wait_for(lk, options_.retry_interval, [&] { return stop_; }))
      return make_error(ErrorCode::io, "sidp weight cache stopped");
  }
}

void WeightCache::housekeeper_loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    auto free_slot = [&] {
      return std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.state == SlotState::free; });
    };
    cv_.wait(lk, [&] { return stop_ || (!paused_ && free_slot() != slots_.end()); });
    if (stop_) break;
    Slot& slot = *free_slot();
    slot.state = SlotState::filling;
    slot.layer = order_[cursor_ % order_.size()];
    slot.generation = generation_;
    ++cursor_;
    const int layer = slot.layer;
    void* dst = slot.region;
    lk.unlock();
    const auto t0 = Clock::now();
    Status st = fetch(layer, dst);
    const double ms = ms_since(t0);
    lk.lock();
    stats_.fetch_ms += ms;
    if (slot.generation != generation_) {
      slot.state = SlotState::free;  // reset() while in flight: the step it was for is gone
      slot.layer = -1;
    } else if (st.ok()) {
      slot.state = SlotState::ready;
      ++stats_.fetches;
      stats_.fetched_bytes += region_bytes_[static_cast<std::size_t>(layer)];
    } else {
      slot.state = SlotState::failed;
      slot.error = st;
    }
    cv_.notify_all();
  }
}

Result<const void*> WeightCache::acquire(int layer) {
  std::unique_lock lk(mu_);
  const auto t0 = Clock::now();
  bool waited = false;
  for (;;) {
    Slot* filling = nullptr;
    bool has_free = false;
    for (Slot& s : slots_) {
      if (s.layer == layer && s.state == SlotState::ready) {
        s.state = SlotState::in_use;
        if (waited) {
          ++stats_.compute_waits;
          stats_.compute_wait_ms += ms_since(t0);
        }
        return static_cast<const void*>(s.region);
      }
      if (s.layer == layer && s.state == SlotState::failed) {
        Status err = s.error;
        s.state = SlotState::free;
        s.layer = -1;
        cv_.notify_all();
        return err.error();
      }
      if (s.layer == layer && s.state == SlotState::filling) filling = &s;
      if (s.state == SlotState::free) has_free = true;
    }
    const bool any_filling = std::any_of(slots_.begin(), slots_.end(),
                                         [](const Slot& s) { return s.state == SlotState::filling; });
    if (filling == nullptr && ((!has_free && !any_filling) || paused_))
      return make_error(ErrorCode::internal, "sidp weight cache of rank " + std::to_string(rank_) + ": layer " +
                                                 std::to_string(layer) +
                                                 (paused_ ? " asked for while prefetching is paused"
                                                          : " is not in the ring and no slot can take it (out of phase)"));
    waited = true;
    cv_.wait(lk);
  }
}

void WeightCache::release(int layer) {
  {
    std::lock_guard lk(mu_);
    for (Slot& s : slots_)
      if (s.layer == layer && s.state == SlotState::in_use) {
        s.state = SlotState::free;
        s.layer = -1;
        break;
      }
  }
  cv_.notify_all();
}

void WeightCache::pause() {
  std::lock_guard lk(mu_);
  paused_ = true;
}

void WeightCache::resume() {
  {
    std::lock_guard lk(mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

void WeightCache::reset() {
  {
    std::lock_guard lk(mu_);
    ++generation_;
    cursor_ = 0;
    for (Slot& s : slots_)
      if (s.state == SlotState::ready || s.state == SlotState::failed || s.state == SlotState::in_use) {
        s.state = SlotState::free;
        s.layer = -1;
      }
  }
  cv_.notify_all();
}

WeightCacheStats WeightCache::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

std::vector<int> WeightCache::resident_layers() const {
  std::lock_guard lk(mu_);
  std::vector<int> out;
  for (const Slot& s : slots_)
    out.push_back(s.state == SlotState::ready || s.state == SlotState::in_use ? s.layer : -1);
  return out;
}

}  // namespace shardline::model::sidp
