#include "model/sidp/sidp_ffn.hpp"

#include <algorithm>
#include <cstring>

namespace shardline::model::sidp {

namespace {
constexpr int kControlWidth = 4;  // rows, announced epoch, announced mode (0 was, 1 cas), spare
int tag_request(int layer) { return 2 * layer; }
int tag_response(int layer) { return 2 * layer + 1; }
Error invalid(std::string m) { return make_error(ErrorCode::invalid_argument, "sidp: " + std::move(m)); }
}  // namespace

SidpFfn::SidpFfn(const OwnershipPlan& plan, int rank, std::shared_ptr<LayerOwner> owner,
                 comm::Communicator* weights_comm, comm::Communicator* compute_comm, const SidpFfnOptions& options)
    : plan_(plan),
      rank_(rank),
      owner_(std::move(owner)),
      weights_comm_(weights_comm),
      compute_comm_(compute_comm),
      options_(options),
      layout_(owner_->layout()) {
  mode_ = options.initial_mode;
  announced_mode_ = options.initial_mode;
  step_rows_.assign(static_cast<std::size_t>(plan.dp), 0);
  control_.assign(static_cast<std::size_t>(plan.dp) * kControlWidth, 0.0f);
}

SidpFfn::~SidpFfn() = default;

Result<std::shared_ptr<SidpFfn>> SidpFfn::create(const OwnershipPlan& plan, int rank, std::shared_ptr<LayerOwner> owner,
                                                 comm::Communicator* weights_comm, comm::Communicator* compute_comm,
                                                 const SidpFfnOptions& options) {
  if (!owner) return invalid("no layer owner");
  if (owner->rank() != rank) return invalid("the layer owner is rank " + std::to_string(owner->rank()));
  if (rank < 0 || rank >= plan.dp) return invalid("rank outside the DP group");
  if (weights_comm == nullptr) return invalid("the weights communicator is missing");
  if (compute_comm == nullptr && options.initial_mode == SidpMode::cas)
    return invalid("CaS needs a compute communicator");
  for (comm::Communicator* c : {weights_comm, compute_comm}) {
    if (c == nullptr) continue;
    if (c->world_size() != plan.dp || c->rank() != rank)
      return invalid("communicator is rank " + std::to_string(c->rank()) + " of " + std::to_string(c->world_size()) +
                     ", expected rank " + std::to_string(rank) + " of dp=" + std::to_string(plan.dp));
  }
  if (weights_comm == compute_comm) return invalid("the weights and compute communicators must be different groups");
  std::shared_ptr<SidpFfn> f(new SidpFfn(plan, rank, std::move(owner), weights_comm, compute_comm, options));
  std::vector<int> order = prefetch_order(plan, rank, options.peak_shifting);
  if (!order.empty()) {
    WeightCacheOptions co = options.cache;
    co.start_paused = options.initial_mode == SidpMode::cas;
    auto cache = WeightCache::create(plan, rank, std::move(order), f->layout_, weights_comm, co);
    if (!cache) return std::move(cache).error();
    f->cache_ = std::move(cache).value();
  }
  return f;
}

std::size_t SidpFfn::ffn_weight_bytes() const {
  return owner_->weight_bytes() + (cache_ ? cache_->slot_bytes() * static_cast<std::size_t>(cache_->slots()) : 0);
}

SidpFfnStats SidpFfn::stats() const {
  std::lock_guard lk(mu_);
  SidpFfnStats s = stats_;
  if (cache_) s.cache = cache_->stats();
  return s;
}

void SidpFfn::announce(SidpMode mode, std::uint64_t epoch) {
  std::lock_guard lk(mu_);
  if (epoch <= announced_epoch_) return;
  announced_epoch_ = epoch;
  announced_mode_ = mode;
}

Status SidpFfn::rebind(comm::Communicator* compute_comm) {
  if (compute_comm != nullptr) {
    if (compute_comm == weights_comm_) return invalid("the weights and compute communicators must be different groups");
    if (compute_comm->world_size() != plan_.dp || compute_comm->rank() != rank_)
      return invalid("communicator is rank " + std::to_string(compute_comm->rank()) + " of " +
                     std::to_string(compute_comm->world_size()) + ", expected rank " + std::to_string(rank_) +
                     " of dp=" + std::to_string(plan_.dp));
  }
  mode_ = SidpMode::was;
  if (cache_) cache_->resume();
  std::lock_guard lk(mu_);
  compute_comm_ = compute_comm;
  broken_ = false;
  announced_mode_ = SidpMode::was;
  announced_epoch_ = 0;
  applied_epoch_ = 0;
  stats_.applied_epoch = 0;
  std::fill(step_rows_.begin(), step_rows_.end(), 0);
  return Status::ok_status();
}

bool SidpFfn::has_compute_group() const {
  std::lock_guard lk(mu_);
  return compute_comm_ != nullptr;
}

bool SidpFfn::join_pending() const {
  std::lock_guard lk(mu_);
  return compute_comm_ != nullptr && mode_.load() == SidpMode::was && announced_mode_ == SidpMode::cas &&
         announced_epoch_ > applied_epoch_;
}

Status SidpFfn::broken_error() const {
  return make_error(ErrorCode::io, "sidp rank " + std::to_string(rank_) +
                                       ": the group is broken by a failed CaS step or switch; rebuild it");
}

void SidpFfn::enter_cas(std::uint64_t epoch) {
  if (cache_) cache_->pause();
  mode_ = SidpMode::cas;
  std::lock_guard lk(mu_);
  applied_epoch_ = std::max(applied_epoch_, epoch);
  stats_.applied_epoch = applied_epoch_;
  ++stats_.switches_to_cas;
}

void SidpFfn::enter_was(std::uint64_t epoch) {
  mode_ = SidpMode::was;
  if (cache_) cache_->resume();
  std::lock_guard lk(mu_);
  applied_epoch_ = std::max(applied_epoch_, epoch);
  stats_.applied_epoch = applied_epoch_;
  ++stats_.switches_to_was;
}

Status SidpFfn::join_cas() {
  std::uint64_t epoch = 0;
  {
    std::lock_guard lk(mu_);
    epoch = announced_epoch_;
  }
  // All-gather the epoch each rank joins with: a rank with a different view
  // still joins (the announcements are ordered), and all take the largest.
  std::vector<float> mine = {static_cast<float>(epoch)};
  std::vector<float> all(static_cast<std::size_t>(plan_.dp));
  if (Status st = compute_comm_->all_gather(mine.data(), 1, all.data()); !st) {
    std::lock_guard lk(mu_);
    broken_ = true;
    return st;
  }
  const float top = *std::max_element(all.begin(), all.end());
  enter_cas(static_cast<std::uint64_t>(top));
  return Status::ok_status();
}

Status SidpFfn::sync_mode() {
  {
    std::lock_guard lk(mu_);
    if (broken_) return broken_error();
  }
  if (!join_pending()) return Status::ok_status();
  return join_cas();
}

Status SidpFfn::control_exchange(int num_rows) {
  float mine[kControlWidth];
  {
    std::lock_guard lk(mu_);
    mine[0] = static_cast<float>(num_rows);
    mine[1] = static_cast<float>(announced_epoch_);
    mine[2] = announced_mode_ == SidpMode::cas ? 1.0f : 0.0f;
    mine[3] = 0.0f;
  }
  if (Status st = compute_comm_->all_gather(mine, kControlWidth, control_.data()); !st) {
    std::lock_guard lk(mu_);
    broken_ = true;
    return st;
  }
  // The group's view: the oldest announcement every rank has seen (lowest
  // rank first on ties), identical on every rank.
  int oldest = 0;
  for (int r = 0; r < plan_.dp; ++r) {
    step_rows_[static_cast<std::size_t>(r)] = static_cast<int>(control_[static_cast<std::size_t>(r) * kControlWidth]);
    if (control_[static_cast<std::size_t>(r) * kControlWidth + 1] <
        control_[static_cast<std::size_t>(oldest) * kControlWidth + 1])
      oldest = r;
  }
  const auto epoch = static_cast<std::uint64_t>(control_[static_cast<std::size_t>(oldest) * kControlWidth + 1]);
  const bool cas = control_[static_cast<std::size_t>(oldest) * kControlWidth + 2] != 0.0f;
  std::uint64_t applied = 0;
  {
    std::lock_guard lk(mu_);
    applied = applied_epoch_;
  }
  if (!cas && epoch > applied) enter_was(epoch);
  return Status::ok_status();
}

Status SidpFfn::begin_step(int num_rows) {
  {
    std::lock_guard lk(mu_);
    if (broken_) return broken_error();
  }
  if (mode_ == SidpMode::was && join_pending())
    if (Status st = join_cas(); !st) return st;
  if (mode_ == SidpMode::was) {
    std::lock_guard lk(mu_);
    ++stats_.was_steps;
    return Status::ok_status();
  }
  if (Status st = control_exchange(num_rows); !st) return st;
  std::lock_guard lk(mu_);
  if (mode_ == SidpMode::was) ++stats_.was_steps;
  else ++stats_.cas_steps;
  return Status::ok_status();
}

Result<bool> SidpFfn::dummy_step() {
  {
    std::lock_guard lk(mu_);
    if (broken_) return broken_error().error();
  }
  if (mode_ != SidpMode::cas) return invalid("dummy_step outside CaS mode");
  if (Status st = control_exchange(0); !st) return st.error();
  const bool any = std::any_of(step_rows_.begin(), step_rows_.end(), [](int r) { return r > 0; });
  {
    std::lock_guard lk(mu_);
    ++stats_.dummy_steps;
  }
  if (mode_ != SidpMode::cas || !any) return any;
  // Dummy skipping: nothing for the layers others own; serve the owned ones.
  for (int l : owner_->owned_layers())
    if (Status st = serve(l, nullptr, 0, nullptr); !st) {
      abort_step();
      return st.error();
    }
  return any;
}

Status SidpFfn::serve(int layer, const float* x, int num_rows, float* out) {
  const int hidden = layout_.hidden;
  const int inter = layout_.intermediate;
  const std::size_t row_elems = static_cast<std::size_t>(hidden);
  int total = num_rows;
  std::uint64_t skipped = 0;  // dummy peers: nothing to receive, compute or send
  for (int r = 0; r < plan_.dp; ++r)
    if (r != rank_) {
      const int rows = step_rows_[static_cast<std::size_t>(r)];
      total += rows;
      if (rows == 0) ++skipped;
    }
  if (skipped > 0) {
    std::lock_guard lk(mu_);
    stats_.cas_peer_skips += skipped;
  }
  if (total == 0) return Status::ok_status();
  if (staging_.size() < static_cast<std::size_t>(total) * row_elems) {
    staging_.resize(static_cast<std::size_t>(total) * row_elems);
    staged_out_.resize(static_cast<std::size_t>(total) * row_elems);
  }
  // Staging: this rank's rows first, then each non-dummy peer's in rank order.
  if (num_rows > 0) std::memcpy(staging_.data(), x, static_cast<std::size_t>(num_rows) * row_elems * sizeof(float));
  std::size_t offset = static_cast<std::size_t>(num_rows) * row_elems;
  for (int r = 0; r < plan_.dp; ++r) {
    const int rows = step_rows_[static_cast<std::size_t>(r)];
    if (r == rank_ || rows == 0) continue;
    const std::size_t elems = static_cast<std::size_t>(rows) * row_elems;
    if (Status st = compute_comm_->recv(staging_.data() + offset, elems * sizeof(float), r, tag_request(layer)); !st)
      return st;
    offset += elems;
  }
  auto lease = owner_->acquire(layer, options_.cache.owner_wait);
  if (!lease) return std::move(lease).error();
  gate_up_.resize(std::max(gate_up_.size(), static_cast<std::size_t>(total) * 2 * inter));
  act_.resize(std::max(act_.size(), static_cast<std::size_t>(total) * inter));
  ffn_forward(lease->matrices(), staging_.data(), total, gate_up_.data(), act_.data(), staged_out_.data());
  if (num_rows > 0)
    std::memcpy(out, staged_out_.data(), static_cast<std::size_t>(num_rows) * row_elems * sizeof(float));
  offset = static_cast<std::size_t>(num_rows) * row_elems;
  for (int r = 0; r < plan_.dp; ++r) {
    const int rows = step_rows_[static_cast<std::size_t>(r)];
    if (r == rank_ || rows == 0) continue;
    const std::size_t elems = static_cast<std::size_t>(rows) * row_elems;
    if (Status st = compute_comm_->send(staged_out_.data() + offset, elems * sizeof(float), r, tag_response(layer));
        !st)
      return st;
    offset += elems;
  }
  std::lock_guard lk(mu_);
  ++stats_.cas_fused_gemms;
  stats_.cas_fused_rows += static_cast<std::uint64_t>(total);
  return Status::ok_status();
}

Status SidpFfn::forward(int layer, const float* x, int num_rows, float* out) {
  const int inter = layout_.intermediate;
  const int owner = plan_.owner(layer);
  Status st = Status::ok_status();
  if (mode_ == SidpMode::cas) {
    if (owner == rank_) {
      st = serve(layer, x, num_rows, out);
    } else if (num_rows > 0) {
      const std::size_t bytes = static_cast<std::size_t>(num_rows) * layout_.hidden * sizeof(float);
      st = compute_comm_->send(x, bytes, owner, tag_request(layer));
      if (st) st = compute_comm_->recv(out, bytes, owner, tag_response(layer));
      if (st) {
        std::lock_guard lk(mu_);
        stats_.cas_rows_sent += static_cast<std::uint64_t>(num_rows);
      }
    }
    if (!st) {
      std::lock_guard lk(mu_);
      broken_ = true;
    }
    return st;
  }
  gate_up_.resize(std::max(gate_up_.size(), static_cast<std::size_t>(num_rows) * 2 * inter));
  act_.resize(std::max(act_.size(), static_cast<std::size_t>(num_rows) * inter));
  if (owner == rank_) {
    auto lease = owner_->acquire(layer, options_.cache.owner_wait);
    if (!lease) return std::move(lease).error();
    ffn_forward(lease->matrices(), x, num_rows, gate_up_.data(), act_.data(), out);
    return Status::ok_status();
  }
  auto region = cache_->acquire(layer);
  if (!region) return std::move(region).error();
  ffn_forward(ffn_views(layout_, *region), x, num_rows, gate_up_.data(), act_.data(), out);
  cache_->release(layer);
  return Status::ok_status();
}

void SidpFfn::abort_step() {
  if (cache_ && mode_ == SidpMode::was) cache_->reset();
  if (mode_ == SidpMode::cas) {
    std::lock_guard lk(mu_);
    broken_ = true;
  }
}

}  // namespace shardline::model::sidp
