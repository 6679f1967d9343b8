#include "engine/sidp_group.hpp"

#include <omp.h>

#include <atomic>
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
    r->instance.engine.reset();
    r->instance.executor.reset();
    r->ffn.reset();
  }
  for (auto& r : ranks_) r->owner->unload(r->weights_comm);
}

Status check_sidp_options(const EngineOptions& base, const SidpOptions& o) {
  if (base.parallel.group_size() != 1 || base.parallel.dp != 1)
    return make_error(ErrorCode::invalid_argument, "--weight-sharing sidp: each DP rank is one CPU device (tp, pp, sp = 1)");
  if (base.device != model::DeviceKind::cpu)
    return make_error(ErrorCode::unsupported, "--weight-sharing sidp runs on CPU devices so far");
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
  for (auto& c : out.inner) {
    c->set_timeout(timeout);
    if (!link) continue;
    auto p = comm::PacedCommunicator::create(*c, link);
    if (!p) return std::move(p).error();
    out.paced.push_back(std::move(p).value());
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

  std::unique_ptr<SidpGroup> g(new SidpGroup());
  g->plan_ = *plan;
  if (o.link.gbps > 0) {
    auto link = comm::LinkModel::create(o.dp, o.link);
    if (!link) return std::move(link).error();
    g->link_ = std::move(link).value();
  }
  const auto make_comms = [&]() -> Result<SidpRankComms> {
    if (!o.tcp) return SidpRankComms::in_process(o.dp, o.comm_timeout, g->link_);
    auto inner = tcp_groups(o.dp, o.comm_timeout);
    if (!inner) return std::move(inner).error();
    return SidpRankComms::wrap(std::move(inner).value(), o.comm_timeout, g->link_);
  };
  for (SidpRankComms* comms : {&g->weights_, &g->compute_}) {
    auto made = make_comms();
    if (!made) return std::move(made).error();
    *comms = std::move(made).value();
  }
  for (int r = 0; r < o.dp; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->weights_comm = g->weights_.at(r);
    rank->compute_comm = g->compute_.at(r);
    auto owner = sidp::LayerOwner::create(weights, g->plan_, r);
    if (!owner) return std::move(owner).error();
    rank->owner = std::move(owner).value();
    if (Status st = rank->owner->load(rank->weights_comm); !st) return st.error();
    g->ranks_.push_back(std::move(rank));
  }
  for (int r = 0; r < o.dp; ++r) {
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
  return g;
}

std::uint64_t SidpGroup::announce(sidp::SidpMode mode) {
  const std::uint64_t epoch = ++epoch_;
  for (auto& r : ranks_) r->ffn->announce(mode, epoch);
  return epoch;
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
  if (weights_.group) (void)weights_.group->mark_dead(rank);
  if (compute_.group) (void)compute_.group->mark_dead(rank);
  // TCP: the peers find out at their timeout (the rank's sockets stay open
  // while its object lives).
}

std::size_t SidpGroup::weight_bytes(int rank) {
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
  if (!policy_.observe(now, rank, num_seqs).ok()) return;
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
  if (params.size() != prompts.size())
    return make_error(ErrorCode::invalid_argument, "generate_sidp: " + std::to_string(params.size()) +
                                                       " sampling params for " + std::to_string(prompts.size()) +
                                                       " prompts");
  for (const sampling::SamplingParams& p : params)
    if (Status s = p.validate(); !s.ok()) return s.error();
  const int dp = group.dp();
  std::vector<RequestOutput> outputs(prompts.size());
  std::vector<Status> statuses(static_cast<std::size_t>(dp));
  std::atomic<int> finished_in_was{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < dp; ++r) {
    threads.emplace_back([&, r] {
      if (threads_per_replica > 0) omp_set_num_threads(threads_per_replica);
      LlmEngine& eng = group.engine(r);
      sidp::SidpFfn& ffn = group.ffn(r);
      Status& status = statuses[static_cast<std::size_t>(r)];
      const auto fail = [&](Status s) {
        status = std::move(s);
        failed = true;
        group.mark_rank_dead(r);  // peers waiting on this rank fail now, not at their timeout
      };
      for (std::size_t i = static_cast<std::size_t>(r); i < prompts.size(); i += static_cast<std::size_t>(dp))
        if (Status s = eng.add_request(i, prompts[i], params[i]); !s.ok()) return fail(s);
      bool counted = false;
      bool reported_idle = false;
      while (!failed) {
        if (!eng.has_unfinished() && !reported_idle) {
          reported_idle = true;
          if (observer) observer(r, 0);
        }
        if (eng.has_unfinished()) {
          Result<std::vector<RequestOutput>> step = eng.step();
          if (!step.ok()) return fail(std::move(step).error());
          for (RequestOutput& o : step.value()) outputs[o.request_id] = std::move(o);
          if (observer && !eng.step_stats().empty()) observer(r, eng.step_stats().back().num_seqs);
          continue;
        }
        if (ffn.mode() == sidp::SidpMode::cas) {  // lockstep: a dummy step until no rank has work
          Result<bool> any = ffn.dummy_step();
          if (!any.ok()) return fail(std::move(any).error());
          if (!*any && ffn.mode() == sidp::SidpMode::cas) break;
          continue;
        }
        if (ffn.join_pending()) {
          if (Status s = ffn.sync_mode(); !s.ok()) return fail(s);
          continue;
        }
        if (!counted) {
          counted = true;
          ++finished_in_was;
        }
        if (finished_in_was.load() == dp) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : statuses)
    if (!s.ok()) return s.error();
  return outputs;
}

}  // namespace shardline::engine
