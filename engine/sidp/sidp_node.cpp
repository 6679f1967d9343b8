#include "engine/sidp/sidp_node.hpp"

#include <spdlog/spdlog.h>

namespace shardline::engine {

namespace sidp = model::sidp;

namespace {
Error invalid(std::string m) { return make_error(ErrorCode::invalid_argument, std::move(m)); }
}  // namespace

SidpNodeGroup::~SidpNodeGroup() {
  // The ranks (SidpRank) hold the group, so none is left; withdraw the
  // owners' regions before the communicators go.
  for (int r = 0; r < static_cast<int>(owners_.size()); ++r)
    owners_[static_cast<std::size_t>(r)]->unload(weights_comms_.at(r));
}

Result<std::shared_ptr<SidpNodeGroup>> SidpNodeGroup::create(const EngineOptions& base, const SidpOptions& o) {
  if (Status ok = check_sidp_options(base, o); !ok) return ok.error();
  auto loaded = load_weights(base);
  if (!loaded) return std::move(loaded).error();
  std::shared_ptr<SidpNodeGroup> g(new SidpNodeGroup());
  g->options_ = o;
  g->base_ = base;
  g->weights_ = std::move(loaded).value();
  auto plan = sidp::parse_plan(o.ownership, g->weights_->config.num_hidden_layers, o.dp);
  if (!plan) return std::move(plan).error();
  g->plan_ = *plan;
  if (o.link.gbps > 0) {
    auto link = comm::LinkModel::create(o.dp, o.link);
    if (!link) return std::move(link).error();
    g->link_ = std::move(link).value();
  }
  auto weights_comms = SidpRankComms::in_process(o.dp, o.comm_timeout, g->link_);
  if (!weights_comms) return std::move(weights_comms).error();
  g->weights_comms_ = std::move(weights_comms).value();
  for (int r = 0; r < o.dp; ++r) {
    auto owner = sidp::LayerOwner::create(g->weights_, g->plan_, r);
    if (!owner) return std::move(owner).error();
    g->owners_.push_back(std::move(owner).value());
  }
  return g;
}

Status SidpNodeGroup::load_owner(int rank) {
  if (rank < 0 || rank >= dp()) return invalid("sidp: no owner rank " + std::to_string(rank));
  return owners_[static_cast<std::size_t>(rank)]->load(weights_comms_.at(rank));
}

void SidpNodeGroup::unload_owner(int rank) {
  if (rank < 0 || rank >= dp()) return;
  owners_[static_cast<std::size_t>(rank)]->unload(weights_comms_.at(rank));
}

const sidp::LayerOwner& SidpNodeGroup::owner(int rank) const { return *owners_.at(static_cast<std::size_t>(rank)); }

int SidpNodeGroup::owner_loads(int rank) const { return static_cast<int>(owner(rank).loads()); }

SidpDirective SidpNodeGroup::record(const SidpDirective& d) {
  std::lock_guard lk(mu_);
  if (d.epoch > directive_.epoch) directive_ = d;
  return directive_;
}

SidpDirective SidpNodeGroup::directive() const {
  std::lock_guard lk(mu_);
  return directive_;
}

std::uint64_t SidpNodeGroup::generation() const {
  std::lock_guard lk(mu_);
  return current_ ? current_->id : 0;
}

Result<std::shared_ptr<SidpNodeGroup::Generation>> SidpNodeGroup::make_generation_locked() {
  auto gen = std::make_shared<Generation>();
  gen->id = next_generation_++;
  auto comms = SidpRankComms::in_process(dp(), options_.comm_timeout, link_);
  if (!comms) return std::move(comms).error();
  gen->comms = std::move(comms).value();
  gen->taken.assign(static_cast<std::size_t>(dp()), false);
  return gen;
}

void SidpNodeGroup::kill_generation_locked(Generation& g) {
  if (g.dead) return;
  g.dead = true;
  for (int r = 0; r < dp(); ++r) (void)g.comms.group->mark_dead(r);  // blocked peers wake with io
}

bool SidpNodeGroup::dead(const Generation& g) const {
  std::lock_guard lk(mu_);
  return g.dead;
}

Result<std::shared_ptr<SidpNodeGroup::Generation>> SidpNodeGroup::take_locked(int rank, bool new_if_taken) {
  const auto r = static_cast<std::size_t>(rank);
  if (current_ && !current_->dead && !current_->taken[r]) {
    current_->taken[r] = true;
    return current_;
  }
  if (current_ && !new_if_taken) return std::shared_ptr<Generation>();  // nothing to join yet
  if (current_) kill_generation_locked(*current_);
  auto next = make_generation_locked();
  if (!next) return std::move(next).error();
  current_ = std::move(next).value();
  current_->taken[r] = true;
  spdlog::info("sidp: compute generation {} (rank {} joined)", current_->id, rank);
  return current_;
}

Result<std::unique_ptr<SidpRank>> SidpNodeGroup::attach(int rank) {
  if (rank < 0 || rank >= dp()) return invalid("sidp: no rank " + std::to_string(rank) + " in dp=" + std::to_string(dp()));
  const auto r = static_cast<std::size_t>(rank);
  sidp::SidpFfnOptions fo;
  fo.cache.cache_slots = options_.cache_slots;
  fo.cache.owner_wait = options_.owner_wait;
  fo.peak_shifting = options_.peak_shifting;
  fo.initial_mode = sidp::SidpMode::was;
  auto ffn = sidp::SidpFfn::create(plan_, rank, owners_[r], weights_comms_.at(rank), nullptr, fo);
  if (!ffn) return std::move(ffn).error();
  std::unique_ptr<SidpRank> out(new SidpRank(shared_from_this(), rank));
  out->ffn_ = std::move(ffn).value();
  EngineOptions eo = base_;
  eo.weights = weights_;
  eo.ffn = out->ffn_;
  // The device memory plan (--device-memory) counts this rank's FFN share.
  eo.sidp_owned_ffn_layers = static_cast<int>(owners_[r]->owned_layers().size());
  eo.sidp_cache_slots = out->ffn_->cache_slots();
  out->engine_options_ = std::move(eo);
  return out;
}

// ---- SidpRank -------------------------------------------------------------------

SidpRank::~SidpRank() {
  std::lock_guard lk(group_->mu_);
  if (generation_ && !detached_) group_->kill_generation_locked(*generation_);
}

bool SidpRank::generation_dead() const {
  if (!generation_ || detached_) return true;
  return group_->dead(*generation_);
}

void SidpRank::directive(const SidpDirective& d) {
  const SidpDirective newest = group_->record(d);
  ffn_->announce(newest.mode, newest.epoch);
}

Status SidpRank::join() {
  std::shared_ptr<SidpNodeGroup::Generation> gen;
  {
    std::lock_guard lk(group_->mu_);
    auto taken = group_->take_locked(rank_, true);
    if (!taken) return std::move(taken).error();
    gen = std::move(taken).value();
  }
  if (Status st = ffn_->rebind(gen->comm(rank_)); !st) return st;
  generation_ = std::move(gen);
  detached_ = false;
  const SidpDirective d = group_->directive();
  if (d.epoch > 0) ffn_->announce(d.mode, d.epoch);
  return Status::ok_status();
}

Result<bool> SidpRank::refresh() {
  std::shared_ptr<SidpNodeGroup::Generation> next;
  bool mine_dead = false;
  {
    std::lock_guard lk(group_->mu_);
    mine_dead = detached_ || !generation_ || generation_->dead;
    if (generation_) {  // joined once
      auto taken = group_->take_locked(rank_, false);
      if (!taken) return std::move(taken).error();
      // take_locked hands back the current generation when this rank is free
      // there; null when there is none to join.
      if (*taken && *taken != generation_) next = std::move(taken).value();
    }
  }
  if (next) {
    if (Status st = ffn_->rebind(next->comm(rank_)); !st) return st.error();
    generation_ = std::move(next);
    detached_ = false;
    const SidpDirective d = group_->directive();
    if (d.epoch > 0) ffn_->announce(d.mode, d.epoch);
    spdlog::info("sidp: rank {} joined compute generation {}", rank_, generation_->id);
    return true;
  }
  if (mine_dead && !detached_) {
    if (Status st = ffn_->rebind(nullptr); !st) return st.error();
    detached_ = true;
    spdlog::warn("sidp: rank {}: its compute generation {} died (a peer left); WaS only until the group is rebuilt",
                 rank_, generation_->id);
    return true;
  }
  return false;
}

}  // namespace shardline::engine
