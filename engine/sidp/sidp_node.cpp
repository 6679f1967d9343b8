#include "engine/sidp/sidp_node.hpp"

#include <spdlog/spdlog.h>

#if SHARDLINE_HAVE_CUDA
#include "model/cuda/inproc_device_comm.hpp"
#include "model/cuda/sidp/cuda_layer_owner.hpp"
#include "model/cuda/sidp/cuda_sidp_ffn.hpp"
#endif

namespace shardline::engine {

namespace sidp = model::sidp;

namespace {
Error invalid(std::string m) { return make_error(ErrorCode::invalid_argument, std::move(m)); }
}  // namespace

SidpNodeGroup::~SidpNodeGroup() {
  // The ranks (SidpRank) hold the group, so none is left; withdraw the
  // owners' regions before the communicators go.
  for (int r = 0; r < static_cast<int>(loads_.size()); ++r) unload_owner(r);
}

Result<SidpRankComms> SidpNodeGroup::make_comms() const {
  auto comms = SidpRankComms::in_process(dp(), options_.comm_timeout, link_);
  if (!comms || !cuda_) return comms;
#if SHARDLINE_HAVE_CUDA
  // Each rank's device communicator wraps its host one (which stays the
  // group's: mark_dead still wakes the blocked ranks).
  for (int r = 0; r < dp(); ++r) {
    auto& inner = comms->inner[static_cast<std::size_t>(r)];
    auto dev = model::InProcDeviceCommunicator::create(std::move(inner),
                                                       options_.rank_devices[static_cast<std::size_t>(r)]);
    if (!dev) return std::move(dev).error();
    inner = std::move(dev).value();
  }
#endif
  return comms;
}

Result<std::shared_ptr<SidpNodeGroup>> SidpNodeGroup::create(const EngineOptions& base, const SidpOptions& o) {
  if (Status ok = check_sidp_options(base, o, /*allow_cuda=*/true); !ok) return ok.error();
  auto loaded = load_weights(base);
  if (!loaded) return std::move(loaded).error();
  std::shared_ptr<SidpNodeGroup> g(new SidpNodeGroup());
  g->options_ = o;
  g->base_ = base;
  g->weights_ = std::move(loaded).value();
  auto plan = sidp::parse_plan(o.ownership, g->weights_->config.num_hidden_layers, o.dp);
  if (!plan) return std::move(plan).error();
  g->plan_ = *plan;
  g->cuda_ = base.device == model::DeviceKind::cuda;
  g->loads_.assign(static_cast<std::size_t>(o.dp), 0);
  if (o.link.gbps > 0) {
    auto link = comm::LinkModel::create(o.dp, o.link);
    if (!link) return std::move(link).error();
    g->link_ = std::move(link).value();
  }
  auto weights_comms = g->make_comms();
  if (!weights_comms) return std::move(weights_comms).error();
  g->weights_comms_ = std::move(weights_comms).value();
  for (int r = 0; r < o.dp; ++r) {
    if (g->cuda_) {
#if SHARDLINE_HAVE_CUDA
      auto owner = sidp::CudaLayerOwner::create(g->plan_, r, o.rank_devices[static_cast<std::size_t>(r)],
                                                g->weights_->config, base.dtype);
      if (!owner) return std::move(owner).error();
      g->cuda_owners_.push_back(std::move(owner).value());
#endif
      continue;
    }
    auto owner = sidp::LayerOwner::create(g->weights_, g->plan_, r);
    if (!owner) return std::move(owner).error();
    g->owners_.push_back(std::move(owner).value());
  }
  return g;
}

Status SidpNodeGroup::load_owner(int rank) {
  if (rank < 0 || rank >= dp()) return invalid("sidp: no owner rank " + std::to_string(rank));
  const auto r = static_cast<std::size_t>(rank);
  if (owner_state(rank).loaded) return Status::ok_status();
  Status st = Status::ok_status();
#if SHARDLINE_HAVE_CUDA
  if (cuda_) st = cuda_owners_[r]->load(*weights_, *weights_comms_.at(rank));
#endif
  if (!cuda_) st = owners_[r]->load(weights_comms_.at(rank));
  if (!st) return st;
  std::lock_guard lk(mu_);
  ++loads_[r];
  return st;
}

void SidpNodeGroup::unload_owner(int rank) {
  if (rank < 0 || rank >= dp()) return;
  const auto r = static_cast<std::size_t>(rank);
#if SHARDLINE_HAVE_CUDA
  if (cuda_) cuda_owners_[r]->unload();
#endif
  if (!cuda_) owners_[r]->unload(weights_comms_.at(rank));
}

SidpOwnerState SidpNodeGroup::owner_state(int rank) const {
  const auto r = static_cast<std::size_t>(rank);
  SidpOwnerState s;
  s.layers = plan_.owned_layers(rank);
  s.loads = owner_loads(rank);
#if SHARDLINE_HAVE_CUDA
  if (cuda_) {
    s.loaded = cuda_owners_[r]->loaded();
    s.weight_bytes = cuda_owners_[r]->bytes();
  }
#endif
  if (!cuda_) {
    s.loaded = owners_[r]->loaded();
    s.weight_bytes = s.loaded ? owners_[r]->weight_bytes() : 0;
  }
  return s;
}

int SidpNodeGroup::owner_loads(int rank) const {
  std::lock_guard lk(mu_);
  return loads_.at(static_cast<std::size_t>(rank));
}

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
  auto comms = make_comms();
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
  std::unique_ptr<SidpRank> out(new SidpRank(shared_from_this(), rank));
  EngineOptions eo = base_;
  eo.weights = weights_;
  if (cuda_) {
#if SHARDLINE_HAVE_CUDA
    auto ffn = sidp::CudaSidpFfn::create(plan_, cuda_owners_[r], weights_comms_.at(rank), nullptr, fo);
    if (!ffn) return std::move(ffn).error();
    eo.device_index = options_.rank_devices[r];
    eo.cuda_ffn = *ffn;
    out->ffn_ = std::move(ffn).value();
#endif
  } else {
    auto ffn = sidp::SidpFfn::create(plan_, rank, owners_[r], weights_comms_.at(rank), nullptr, fo);
    if (!ffn) return std::move(ffn).error();
    eo.ffn = *ffn;
    out->ffn_ = std::move(ffn).value();
  }
  // The device memory plans count this rank's FFN share.
  eo.sidp_owned_ffn_layers = static_cast<int>(plan_.owned_layers(rank).size());
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
