#include "engine/sidp/sidp_group.hpp"

#include <omp.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "comm/tcp.hpp"
#include "model/cpu_runner.hpp"

namespace shardline::engine {

namespace sidp = model::sidp;

namespace {

/// dp TCP communicators over 127.0.0.1, one per rank (the rendezvous of all
/// ranks runs on threads of this process).
Result<std::vector<std::unique_ptr<comm::Communicator>>> tcp_groups(int dp, std::chrono::milliseconds timeout) {
  std::vector<comm::TcpGroup> listening;
  int master_port = 0;
  for (int r = 0; r < dp; ++r) {
    comm::TcpOptions to;
    to.rank = r;
    to.world_size = dp;
    to.master_port = master_port;
    to.timeout = timeout;
    auto l = comm::TcpGroup::listen(to);
    if (!l) return std::move(l).error();
    if (r == 0) master_port = l->port();
    listening.push_back(std::move(l).value());
  }
  std::vector<std::unique_ptr<comm::TcpCommunicator>> made(static_cast<std::size_t>(dp));
  std::vector<Status> status(static_cast<std::size_t>(dp));
  std::vector<std::thread> threads;
  for (int r = 0; r < dp; ++r)
    threads.emplace_back([&, r] {
      auto c = listening[static_cast<std::size_t>(r)].connect();
      if (c) made[static_cast<std::size_t>(r)] = std::move(c).value();
      else status[static_cast<std::size_t>(r)] = std::move(c).error();
    });
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<comm::Communicator>> out;
  for (int r = 0; r < dp; ++r) {
    if (!status[static_cast<std::size_t>(r)]) return status[static_cast<std::size_t>(r)].error();
    out.push_back(std::move(made[static_cast<std::size_t>(r)]));
  }
  return out;
}

}  // namespace

SidpGroup::~SidpGroup() {
  // Engines and FFNs first (their housekeepers use the communicators), then
  // the owners' regions, then the communicators.
  for (auto& r : ranks_) {
    if (!r) continue;
    r->instance.engine.reset();
    r->instance.executor.reset();
    r->ffn.reset();
  }
  for (auto& r : ranks_)
    if (r) r->owner->unload(r->weights_comm);
  remote_.reset();  // tells the remote ranks to shut down
}

SidpGroup::Rank& SidpGroup::rank_at(int rank) {
  Rank* r = ranks_.at(static_cast<std::size_t>(rank)).get();
  if (r == nullptr) throw std::out_of_range("SiDP rank " + std::to_string(rank) + " is another process");
  return *r;
}

sidp::SidpFfnStats SidpGroup::ffn_stats(int rank) {
  if (local(rank)) return rank_at(rank).ffn->stats();
  return remote_->stats(rank);
}

Status check_sidp_options(const EngineOptions& base, const SidpOptions& o, bool allow_cuda) {
  if (base.parallel.group_size() != 1 || base.parallel.dp != 1)
    return make_error(ErrorCode::invalid_argument, "--weight-sharing sidp: each DP rank is one device (tp, pp, sp = 1)");
  if (base.device == model::DeviceKind::cuda) {
    if (!allow_cuda)
      return make_error(ErrorCode::unsupported,
                        "SiDP on CUDA runs in a node's workers (`run` / `node start`); this path runs CPU devices");
#if !SHARDLINE_HAVE_CUDA
    return make_error(ErrorCode::unsupported, "--weight-sharing sidp on cuda: this build has no CUDA backend");
#endif
    if (static_cast<int>(o.rank_devices.size()) != o.dp)
      return make_error(ErrorCode::invalid_argument, "--weight-sharing sidp on cuda: " +
                                                         std::to_string(o.rank_devices.size()) + " GPUs for dp=" +
                                                         std::to_string(o.dp) + " ranks");
    if (o.link.gbps > 0)
      return make_error(ErrorCode::invalid_argument,
                        "--link-gbps emulates a link between CPU devices; CUDA ranks use the GPUs' own");
  } else if (base.device != model::DeviceKind::cpu) {
    return make_error(ErrorCode::unsupported, "--weight-sharing sidp runs on CPU and CUDA devices");
  }
  if (o.dp < 2)
    return make_error(ErrorCode::invalid_argument, "--weight-sharing sidp needs dp >= 2, got " + std::to_string(o.dp));
  if (o.cache_slots < 1)
    return make_error(ErrorCode::invalid_argument,
                      "--sidp-cache-slots must be >= 1, got " + std::to_string(o.cache_slots));
  return Status::ok_status();
}

Result<SidpRankComms> SidpRankComms::wrap(std::vector<std::unique_ptr<comm::Communicator>> inner,
                                          std::chrono::milliseconds timeout,
                                          const std::shared_ptr<comm::LinkModel>& link) {
  SidpRankComms out;
  out.inner = std::move(inner);
  if (link) out.paced.resize(out.inner.size());
  for (std::size_t r = 0; r < out.inner.size(); ++r) {
    comm::Communicator* c = out.inner[r].get();
    if (c == nullptr) continue;  // a rank in another process
    c->set_timeout(timeout);
    if (!link) continue;
    auto p = comm::PacedCommunicator::create(*c, link);
    if (!p) return std::move(p).error();
    out.paced[r] = std::move(p).value();
  }
  return out;
}

Result<SidpRankComms> SidpRankComms::in_process(int dp, std::chrono::milliseconds timeout,
                                                const std::shared_ptr<comm::LinkModel>& link) {
  auto group = comm::InProcGroup::create(dp);
  if (!group) return std::move(group).error();
  std::vector<std::unique_ptr<comm::Communicator>> inner;
  for (int r = 0; r < dp; ++r) {
    auto c = (*group)->communicator(r);
    if (!c) return std::move(c).error();
    inner.push_back(std::move(c).value());
  }
  auto out = wrap(std::move(inner), timeout, link);
  if (!out) return std::move(out).error();
  out->group = *group;
  return out;
}

Result<std::unique_ptr<SidpGroup>> SidpGroup::create(const EngineOptions& base, const SidpOptions& o) {
  if (Status ok = check_sidp_options(base, o); !ok) return ok.error();

  auto loaded = load_weights(base);
  if (!loaded) return std::move(loaded).error();
  const std::shared_ptr<const model::ModelWeights> weights = std::move(loaded).value();
  auto plan = sidp::parse_plan(o.ownership, weights->config.num_hidden_layers, o.dp);
  if (!plan) return std::move(plan).error();

  if (o.processes && o.tcp)
    return make_error(ErrorCode::invalid_argument, "SidpOptions: tcp (threads over sockets) and processes exclude each other");
  std::unique_ptr<SidpGroup> g(new SidpGroup());
  g->plan_ = *plan;
  if (o.link.gbps > 0) {
    auto link = comm::LinkModel::create(o.dp, o.link);
    if (!link) return std::move(link).error();
    g->link_ = std::move(link).value();
  }
  if (o.processes) {
    SidpProcessSetup setup;
    setup.dp = o.dp;
    setup.plan = g->plan_;
    setup.num_layers = weights->config.num_hidden_layers;
    setup.hidden_size = weights->config.hidden_size;
    setup.vocab_size = weights->config.vocab_size;
    setup.dtype = base.dtype;
    setup.cache_slots = o.cache_slots;
    setup.peak_shifting = o.peak_shifting;
    setup.initial_mode = o.initial_mode;
    setup.capture_logits = base.capture_logits;
    setup.owner_wait = o.owner_wait;
    setup.comm_timeout = o.comm_timeout;
    setup.link_gbps = o.link.gbps;
    setup.link_latency_us = o.link.latency_us;
    auto remote = SidpRemoteRanks::connect(setup, *o.processes);
    if (!remote) return std::move(remote).error();
    g->remote_ = std::move(remote).value();
  }
  const auto make_comms = [&](bool weights_group) -> Result<SidpRankComms> {
    if (g->remote_) {
      std::vector<std::unique_ptr<comm::Communicator>> inner(static_cast<std::size_t>(o.dp));
      inner[0] = weights_group ? g->remote_->take_weights() : g->remote_->take_compute();
      return SidpRankComms::wrap(std::move(inner), o.comm_timeout, g->link_);
    }
    if (!o.tcp) return SidpRankComms::in_process(o.dp, o.comm_timeout, g->link_);
    auto inner = tcp_groups(o.dp, o.comm_timeout);
    if (!inner) return std::move(inner).error();
    return SidpRankComms::wrap(std::move(inner).value(), o.comm_timeout, g->link_);
  };
  for (SidpRankComms* comms : {&g->weights_, &g->compute_}) {
    auto made = make_comms(comms == &g->weights_);
    if (!made) return std::move(made).error();
    *comms = std::move(made).value();
  }
  g->round_ = std::make_unique<SidpRound>(o.dp);
  g->ranks_.resize(static_cast<std::size_t>(o.dp));
  const int num_local = g->remote_ ? 1 : o.dp;
  for (int r = 0; r < num_local; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->weights_comm = g->weights_.at(r);
    rank->compute_comm = g->compute_.at(r);
    auto owner = sidp::LayerOwner::create(weights, g->plan_, r);
    if (!owner) return std::move(owner).error();
    rank->owner = std::move(owner).value();
    if (Status st = rank->owner->load(rank->weights_comm); !st) return st.error();
    g->ranks_[static_cast<std::size_t>(r)] = std::move(rank);
  }
  for (int r = 0; r < num_local; ++r) {
    Rank& rank = g->rank_at(r);
    sidp::SidpFfnOptions fo;
    fo.cache.cache_slots = o.cache_slots;
    fo.cache.owner_wait = o.owner_wait;
    fo.peak_shifting = o.peak_shifting;
    fo.initial_mode = o.initial_mode;
    auto ffn = sidp::SidpFfn::create(g->plan_, r, rank.owner, rank.weights_comm, rank.compute_comm, fo);
    if (!ffn) return std::move(ffn).error();
    rank.ffn = std::move(ffn).value();
    EngineOptions eo = base;
    eo.weights = weights;
    eo.ffn = rank.ffn;
    // The device memory plan (--device-memory) counts this rank's FFN share.
    eo.sidp_owned_ffn_layers = static_cast<int>(rank.owner->owned_layers().size());
    eo.sidp_cache_slots = rank.ffn->cache_slots();
    auto inst = build_engine(eo);
    if (!inst) return std::move(inst).error();
    rank.instance = std::move(inst).value();
  }
  if (g->remote_) {
    if (Status st = g->remote_->wait_ready(o.processes->timeout); !st) return st.error();
  }
  return g;
}

std::uint64_t SidpGroup::announce(sidp::SidpMode mode) {
  return round_->announce([&](std::uint64_t epoch) {
    for (auto& r : ranks_)
      if (r) r->ffn->announce(mode, epoch);
    if (remote_) remote_->announce(mode, epoch);
  });
}

void SidpGroup::kill_owner(int rank) {
  Rank& r = rank_at(rank);
  r.owner->unload(r.weights_comm);
}

Status SidpGroup::respawn_owner(int rank) {
  Rank& r = rank_at(rank);
  return r.owner->load(r.weights_comm);
}

void SidpGroup::mark_rank_dead(int rank) {
  if (!local(rank)) return;  // a process: its sockets close when it dies
  if (weights_.group) (void)weights_.group->mark_dead(rank);
  if (compute_.group) (void)compute_.group->mark_dead(rank);
  // TCP: the peers find out at their timeout (the rank's sockets stay open
  // while its object lives).
}

std::size_t SidpGroup::weight_bytes(int rank) {
  if (!local(rank)) return remote_->weight_bytes(rank);
  Rank& r = rank_at(rank);
  std::size_t b = r.ffn->ffn_weight_bytes();
  if (auto* cpu = r.instance.executor_as<model::CpuModelRunner>()) b += cpu->packed_weight_bytes();
  return b;
}

SidpAutoSwitcher::SidpAutoSwitcher(SidpGroup& group, SidpModePolicy policy)
    : group_(group), policy_(std::move(policy)), t0_(std::chrono::steady_clock::now()) {}

SidpStepObserver SidpAutoSwitcher::observer() {
  return [this](int rank, int num_seqs) { observe(rank, num_seqs); };
}

void SidpAutoSwitcher::observe(int rank, int num_seqs) {
  std::lock_guard lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  // A local rank calls this on its own thread after its step (its engine
  // is idle); a rank in another process reports its running sequences
  // only, so its waiting prompts count as none.
  const long long waiting =
      group_.local(rank) ? static_cast<long long>(group_.engine(rank).scheduler().num_waiting()) : 0;
  if (!policy_.observe(now, rank, num_seqs, waiting).ok()) return;
  const std::optional<SidpSwitch> sw = policy_.decide(now);
  if (!sw) return;
  const std::uint64_t epoch = group_.announce(sw->to);
  switches_.push_back(Record{sw->to, std::chrono::duration<double>(now - t0_).count(), sw->group_batch, epoch});
}

std::vector<SidpAutoSwitcher::Record> SidpAutoSwitcher::switches() const {
  std::lock_guard lk(mu_);
  return switches_;
}

Result<std::vector<RequestOutput>> generate_sidp(SidpGroup& group, const std::vector<std::vector<std::int32_t>>& prompts,
                                                 const sampling::SamplingParams& params, int threads_per_replica,
                                                 const SidpStepObserver& observer) {
  return generate_sidp(group, prompts, std::vector<sampling::SamplingParams>(prompts.size(), params),
                       threads_per_replica, observer);
}

Result<std::vector<RequestOutput>> generate_sidp(SidpGroup& group, const std::vector<std::vector<std::int32_t>>& prompts,
                                                 const std::vector<sampling::SamplingParams>& params,
                                                 int threads_per_replica, const SidpStepObserver& observer) {
  return group.generate(prompts, params, threads_per_replica, observer);
}

namespace {

/// The hooks of a rank in this process.
class LocalHooks final : public SidpRoundHooks {
 public:
  LocalHooks(int rank, SidpRound& round, std::vector<RequestOutput>& outputs, const SidpStepObserver& observer)
      : rank_(rank), round_(round), outputs_(outputs), observer_(observer) {}
  void report(int num_seqs) override {
    if (observer_) observer_(rank_, num_seqs);
  }
  void output(RequestOutput&& out) override { outputs_[out.request_id] = std::move(out); }
  std::uint64_t announced_epoch() override { return round_.epoch(); }
  bool idle(std::uint64_t epoch) override { return round_.idle(rank_, epoch); }
  bool aborted() override { return round_.aborted(); }

 private:
  int rank_;
  SidpRound& round_;
  std::vector<RequestOutput>& outputs_;
  const SidpStepObserver& observer_;
};

}  // namespace

Result<std::vector<RequestOutput>> SidpGroup::generate(const std::vector<std::vector<std::int32_t>>& prompts,
                                                       const std::vector<sampling::SamplingParams>& params,
                                                       int threads_per_replica, const SidpStepObserver& observer) {
  if (params.size() != prompts.size())
    return make_error(ErrorCode::invalid_argument, "generate_sidp: " + std::to_string(params.size()) +
                                                       " sampling params for " + std::to_string(prompts.size()) +
                                                       " prompts");
  for (const sampling::SamplingParams& p : params)
    if (Status s = p.validate(); !s.ok()) return s.error();
  const int n = dp();
  const std::uint64_t round = ++rounds_;
  // Every rank idle at the newest epoch ends the round; remote ranks hear it.
  round_->start([this, round] {
    if (remote_) remote_->stop(round);
  });
  std::vector<RequestOutput> outputs(prompts.size());
  std::mutex error_mu;
  Status first_error = Status::ok_status();
  const auto fail = [&](int r, Status s) {
    {
      std::lock_guard lk(error_mu);
      if (first_error.ok()) first_error = std::move(s);
    }
    round_->abort();
    if (remote_) remote_->abort(round);
    mark_rank_dead(r);  // local peers waiting on this rank fail now, not at their timeout
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    std::vector<std::uint64_t> ids;
    for (std::size_t i = static_cast<std::size_t>(r); i < prompts.size(); i += static_cast<std::size_t>(n))
      ids.push_back(i);
    if (!local(r)) {
      threads.emplace_back([&, r, ids = std::move(ids)] {
        std::vector<std::vector<std::int32_t>> ps;
        std::vector<sampling::SamplingParams> sps;
        for (std::uint64_t i : ids) {
          ps.push_back(prompts[i]);
          sps.push_back(params[i]);
        }
        if (Status s = remote_->run_round(r, round, ids, ps, sps, observer, *round_, outputs); !s.ok()) fail(r, s);
      });
      continue;
    }
    threads.emplace_back([&, r, ids = std::move(ids)] {
      if (threads_per_replica > 0) omp_set_num_threads(threads_per_replica);
      LlmEngine& eng = engine(r);
      for (std::uint64_t i : ids)
        if (Status s = eng.add_request(i, prompts[i], params[i]); !s.ok()) return fail(r, s);
      LocalHooks hooks(r, *round_, outputs, observer);
      if (Status s = run_sidp_rank(eng, ffn(r), hooks); !s.ok()) fail(r, s);
    });
  }
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return first_error.error();
  return outputs;
}

}  // namespace shardline::engine
