#include "model/sidp/sidp_rank_ffn.hpp"

#include <algorithm>
#include <functional>
#include <string>

namespace shardline::model::sidp {

namespace {
constexpr int kControlWidth = 4;  // rows, announced epoch, announced mode (0 was, 1 cas), spare
int tag_request(int layer) { return 2 * layer; }
int tag_response(int layer) { return 2 * layer + 1; }
Error invalid(std::string m) { return make_error(ErrorCode::invalid_argument, "sidp: " + std::move(m)); }

Status check_comm(const comm::Communicator& c, const OwnershipPlan& plan, int rank) {
  if (c.world_size() == plan.dp && c.rank() == rank) return Status::ok_status();
  return invalid("communicator is rank " + std::to_string(c.rank()) + " of " + std::to_string(c.world_size()) +
                 ", expected rank " + std::to_string(rank) + " of dp=" + std::to_string(plan.dp));
}
}  // namespace

SidpRankFfn::SidpRankFfn(const OwnershipPlan& plan, int rank, comm::Communicator* weights_comm, SidpMode initial_mode)
    : plan_(plan), rank_(rank), weights_comm_(weights_comm) {
  mode_ = initial_mode;
  announced_mode_ = initial_mode;
  step_rows_.assign(static_cast<std::size_t>(plan.dp), 0);
  control_.assign(static_cast<std::size_t>(plan.dp) * kControlWidth, 0.0f);
}

SidpRankFfn::~SidpRankFfn() = default;

Status SidpRankFfn::check_rank(const OwnershipPlan& plan, int rank, comm::Communicator* weights_comm,
                               comm::Communicator* compute_comm, SidpMode initial_mode) {
  if (rank < 0 || rank >= plan.dp) return invalid("rank outside the DP group");
  if (weights_comm == nullptr) return invalid("the weights communicator is missing");
  if (compute_comm == nullptr && initial_mode == SidpMode::cas) return invalid("CaS needs a compute communicator");
  for (comm::Communicator* c : {weights_comm, compute_comm})
    if (c != nullptr)
      if (Status st = check_comm(*c, plan, rank); !st) return st;
  if (weights_comm == compute_comm) return invalid("the weights and compute communicators must be different groups");
  return Status::ok_status();
}

Status SidpRankFfn::attach_compute(comm::Communicator* compute_comm) {
  comm::Communicator* control = nullptr;
  if (compute_comm != nullptr) {
    auto c = control_of(compute_comm);
    if (!c) return c.error();
    control = *c;
  }
  std::lock_guard lk(mu_);
  compute_comm_ = compute_comm;
  control_comm_ = control;
  return Status::ok_status();
}

Status SidpRankFfn::make_cache(std::vector<std::size_t> region_bytes, const SidpFfnOptions& options) {
  std::vector<int> order = prefetch_order(plan_, rank_, options.peak_shifting);
  if (order.empty()) return Status::ok_status();
  WeightCacheOptions co = options.cache;
  co.start_paused = options.initial_mode == SidpMode::cas;
  auto cache = WeightCache::create(plan_, rank_, std::move(order), std::move(region_bytes), weights_comm_, co);
  if (!cache) return cache.error();
  cache_ = std::move(cache).value();
  return Status::ok_status();
}

std::size_t SidpRankFfn::cache_bytes() const {
  return cache_ ? cache_->slot_bytes() * static_cast<std::size_t>(cache_->slots()) : 0;
}

SidpFfnStats SidpRankFfn::stats() const {
  std::lock_guard lk(mu_);
  SidpFfnStats s = stats_;
  if (cache_) s.cache = cache_->stats();
  return s;
}

void SidpRankFfn::announce(SidpMode mode, std::uint64_t epoch) {
  std::lock_guard lk(mu_);
  if (epoch <= announced_epoch_) return;
  announced_epoch_ = epoch;
  announced_mode_ = mode;
}

Status SidpRankFfn::rebind(comm::Communicator* compute_comm) {
  if (compute_comm != nullptr) {
    if (compute_comm == weights_comm_) return invalid("the weights and compute communicators must be different groups");
    if (Status st = check_comm(*compute_comm, plan_, rank_); !st) return st;
  }
  if (Status st = attach_compute(compute_comm); !st) return st;
  mode_ = SidpMode::was;
  if (cache_) cache_->resume();
  std::lock_guard lk(mu_);
  broken_ = false;
  announced_mode_ = SidpMode::was;
  announced_epoch_ = 0;
  applied_epoch_ = 0;
  stats_.applied_epoch = 0;
  std::fill(step_rows_.begin(), step_rows_.end(), 0);
  return Status::ok_status();
}

bool SidpRankFfn::has_compute_group() const {
  std::lock_guard lk(mu_);
  return compute_comm_ != nullptr;
}

bool SidpRankFfn::join_pending() const {
  std::lock_guard lk(mu_);
  return compute_comm_ != nullptr && mode_.load() == SidpMode::was && announced_mode_ == SidpMode::cas &&
         announced_epoch_ > applied_epoch_;
}

bool SidpRankFfn::broken() const {
  std::lock_guard lk(mu_);
  return broken_;
}

void SidpRankFfn::mark_broken() {
  std::lock_guard lk(mu_);
  broken_ = true;
}

Status SidpRankFfn::broken_error() const {
  return make_error(ErrorCode::io, "sidp rank " + std::to_string(rank_) +
                                       ": the group is broken by a failed CaS step or switch; rebuild it");
}

void SidpRankFfn::enter_cas(std::uint64_t epoch) {
  if (cache_) cache_->pause();
  mode_ = SidpMode::cas;
  std::lock_guard lk(mu_);
  applied_epoch_ = std::max(applied_epoch_, epoch);
  stats_.applied_epoch = applied_epoch_;
  ++stats_.switches_to_cas;
}

void SidpRankFfn::enter_was(std::uint64_t epoch) {
  mode_ = SidpMode::was;
  if (cache_) cache_->resume();
  std::lock_guard lk(mu_);
  applied_epoch_ = std::max(applied_epoch_, epoch);
  stats_.applied_epoch = applied_epoch_;
  ++stats_.switches_to_was;
}

Status SidpRankFfn::join_cas() {
  std::uint64_t epoch = 0;
  {
    std::lock_guard lk(mu_);
    epoch = announced_epoch_;
  }
  // All-gather the epoch each rank joins with: a rank with a different view
  // still joins (the announcements are ordered), and all take the largest.
  std::vector<float> mine = {static_cast<float>(epoch)};
  std::vector<float> all(static_cast<std::size_t>(plan_.dp));
  if (Status st = control_comm_->all_gather(mine.data(), 1, all.data()); !st) {
    mark_broken();
    return st;
  }
  const float top = *std::max_element(all.begin(), all.end());
  enter_cas(static_cast<std::uint64_t>(top));
  return Status::ok_status();
}

Status SidpRankFfn::sync_mode() {
  if (broken()) return broken_error();
  if (!join_pending()) return Status::ok_status();
  return join_cas();
}

Status SidpRankFfn::control_exchange(int num_rows) {
  float mine[kControlWidth];
  {
    std::lock_guard lk(mu_);
    mine[0] = static_cast<float>(num_rows);
    mine[1] = static_cast<float>(announced_epoch_);
    mine[2] = announced_mode_ == SidpMode::cas ? 1.0f : 0.0f;
    mine[3] = 0.0f;
  }
  if (Status st = control_comm_->all_gather(mine, kControlWidth, control_.data()); !st) {
    mark_broken();
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

Status SidpRankFfn::begin_control(int num_rows) {
  if (broken()) return broken_error();
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

void SidpRankFfn::abort_control() {
  if (mode_ == SidpMode::cas) mark_broken();
  else if (cache_) cache_->reset();
}

Result<bool> SidpRankFfn::dummy_step() {
  if (broken()) return broken_error().error();
  if (mode_ != SidpMode::cas) return invalid("dummy_step outside CaS mode");
  if (Status st = control_exchange(0); !st) return st.error();
  const bool any = std::any_of(step_rows_.begin(), step_rows_.end(), [](int r) { return r > 0; });
  {
    std::lock_guard lk(mu_);
    ++stats_.dummy_steps;
  }
  if (mode_ != SidpMode::cas || !any) return any;
  // Dummy skipping: nothing for the layers others own; serve the owned ones.
  for (int l = 0; l < plan_.num_layers(); ++l)
    if (plan_.owner(l) == rank_)
      if (Status st = serve(l, nullptr, 0, nullptr); !st) {
        mark_broken();
        return st.error();
      }
  return any;
}

int SidpRankFfn::peer_rows_to_serve() {
  int total = 0;
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
  return total;
}

Status SidpRankFfn::each_peer_slice(int hidden, const std::function<Status(int, std::size_t, std::size_t)>& fn) {
  std::size_t offset = 0;
  for (int r = 0; r < plan_.dp; ++r) {
    const int rows = step_rows_[static_cast<std::size_t>(r)];
    if (r == rank_ || rows == 0) continue;
    const std::size_t elems = static_cast<std::size_t>(rows) * static_cast<std::size_t>(hidden);
    if (Status st = fn(r, offset, elems); !st) return st;
    offset += elems;
  }
  return Status::ok_status();
}

Status SidpRankFfn::recv_peer_rows(int layer, float* staging, int hidden) {
  return each_peer_slice(hidden, [&](int peer, std::size_t offset, std::size_t elems) {
    return compute_comm_->recv(staging + offset, elems * sizeof(float), peer, tag_request(layer));
  });
}

Status SidpRankFfn::send_peer_rows(int layer, const float* staged_out, int hidden, int total_rows) {
  if (Status st = each_peer_slice(hidden,
                                  [&](int peer, std::size_t offset, std::size_t elems) {
                                    return compute_comm_->send(staged_out + offset, elems * sizeof(float), peer,
                                                               tag_response(layer));
                                  });
      !st)
    return st;
  std::lock_guard lk(mu_);
  ++stats_.cas_fused_gemms;
  stats_.cas_fused_rows += static_cast<std::uint64_t>(total_rows);
  return Status::ok_status();
}

Status SidpRankFfn::exchange_with_owner(int layer, const float* x, int num_rows, int hidden, float* out) {
  const int owner = plan_.owner(layer);
  const std::size_t bytes = static_cast<std::size_t>(num_rows) * static_cast<std::size_t>(hidden) * sizeof(float);
  Status st = compute_comm_->send(x, bytes, owner, tag_request(layer));
  if (st) st = compute_comm_->recv(out, bytes, owner, tag_response(layer));
  if (!st) {
    mark_broken();
    return st;
  }
  std::lock_guard lk(mu_);
  stats_.cas_rows_sent += static_cast<std::uint64_t>(num_rows);
  return Status::ok_status();
}

}  // namespace shardline::model::sidp
