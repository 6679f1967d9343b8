#include "engine/group/parallel_executor.hpp"

#include <omp.h>

#include <algorithm>
#include <string>

#include "engine/group/step_codec.hpp"

namespace shardline::engine {

namespace {

using Clock = std::chrono::steady_clock;

std::int64_t us_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
}

/// Seesaw's weight re-sharding on one rank, switching to cd (`to_decode`)
/// or back to cp: under reload, frees the outgoing shard and packs the
/// incoming one. Returns the microseconds spent.
Result<std::int64_t> reshard_weights(model::ShardRunner& cp, model::ShardRunner& cd, bool to_decode,
                                     ReshardWeights mode) {
  const auto t0 = Clock::now();
  if (mode == ReshardWeights::reload) {
    (to_decode ? cp : cd).release_weights();
    if (Status st = (to_decode ? cd : cp).load_weights(); !st) return st.error();
  }
  return us_since(t0);
}
/// How long an idle rank waits for the next step's metadata.
constexpr std::chrono::hours kIdleWait{24 * 365};

std::size_t activation_bytes(const model::ShardRunner& r, int num_tokens) {
  return static_cast<std::size_t>(r.chunk_rows(num_tokens)) * r.config().hidden_size * sizeof(float);
}

}  // namespace

const char* to_string(ReshardWeights weights) noexcept {
  return weights == ReshardWeights::reload ? "reload" : "resident";
}

Status check_decode_config(const ParallelConfig& cp, const ParallelConfig& cd) {
  if (cd.dp != 1 || cd.group_size() != cp.group_size())
    return make_error(ErrorCode::invalid_argument,
                      "Seesaw: the decode config " + cd.to_string() + " must use the prefill config's " +
                          std::to_string(cp.group_size()) + " devices with dp = 1 (prefill " + cp.to_string() + ")");
  return Status::ok_status();
}

Result<ReshardWeights> parse_reshard_weights(std::string_view text) {
  if (text == "resident") return ReshardWeights::resident;
  if (text == "reload") return ReshardWeights::reload;
  return make_error(ErrorCode::invalid_argument,
                    "--reshard-weights must be resident or reload, got '" + std::string(text) + "'");
}

model::ShardSpec shard_spec_of(const ParallelConfig& pc, int group_rank) {
  return model::shard_spec_at(pc.tp, pc.sp, pc.pp, group_rank);
}

model::ShardSpec shift_spec_of(const ParallelConfig& pc, int group_rank) {
  return model::shift_spec_at(pc.tp, pc.sp, group_rank);
}

std::vector<int> shift_group_ranks(const ParallelConfig& pc) {
  std::vector<int> out;
  for (int t = 0; t < pc.tp; ++t)
    for (int s = 0; s < pc.sp; ++s) out.push_back(group_rank_of(pc, {0, s, t}));
  return out;
}

Status InProcGroupComms::mark_dead(int group_rank) {
  if (group_rank < 0 || group_rank >= static_cast<int>(memberships.size()))
    return make_error(ErrorCode::invalid_argument, "mark_dead: rank " + std::to_string(group_rank) + " not in the group");
  for (const auto& [group, local] : memberships[static_cast<std::size_t>(group_rank)])
    if (Status st = groups[static_cast<std::size_t>(group)]->mark_dead(local); !st) return st;
  return Status::ok_status();
}

Result<InProcGroupComms> make_inproc_group_comms(const ParallelConfig& pc, bool shift, const ParallelConfig* decode,
                                                 std::shared_ptr<comm::LinkModel> link) {
  if (decode != nullptr)
    if (Status st = check_decode_config(pc, *decode); !st) return st.error();
  const int g = pc.group_size();
  if (link && link->world_size() != g)
    return make_error(ErrorCode::invalid_argument, "engine group: a link model of " +
                                                       std::to_string(link->world_size()) + " devices for " +
                                                       std::to_string(g) + " ranks");
  // With a link, every communicator is paced on the ports of its members'
  // devices (group ranks), collectives included.
  const auto paced = [&](Result<std::unique_ptr<comm::Communicator>> c,
                         std::vector<int> members) -> Result<std::unique_ptr<comm::Communicator>> {
    if (!c.ok() || !link) return c;
    auto p = comm::PacedCommunicator::create(std::move(c).value(), link, std::move(members), true);
    if (!p.ok()) return std::move(p).error();
    return std::unique_ptr<comm::Communicator>(std::move(p).value());
  };
  std::vector<int> all_ranks(static_cast<std::size_t>(g));
  for (int r = 0; r < g; ++r) all_ranks[static_cast<std::size_t>(r)] = r;
  InProcGroupComms out;
  out.ranks.resize(static_cast<std::size_t>(g));
  out.memberships.resize(static_cast<std::size_t>(g));
  Result<std::shared_ptr<comm::InProcGroup>> world = comm::InProcGroup::create(g);
  if (!world.ok()) return std::move(world).error();
  out.groups.push_back(world.value());
  for (int r = 0; r < g; ++r) {
    Result<std::unique_ptr<comm::Communicator>> c = paced(world.value()->communicator(r), all_ranks);
    if (!c.ok()) return std::move(c).error();
    out.ranks[static_cast<std::size_t>(r)].world = std::move(c).value();
    out.memberships[static_cast<std::size_t>(r)].emplace_back(0, r);
  }
  // One in-process group per TP group and per SP group of every stage of
  // `cfg` (the group's config, or Seesaw's decode config).
  const auto add_groups = [&](const ParallelConfig& cfg, bool tp, bool of_decode) -> Status {
    const int size = tp ? cfg.tp : cfg.sp;
    for (int stage = 0; stage < cfg.pp; ++stage) {
      for (int other = 0; other < (tp ? cfg.sp : cfg.tp); ++other) {
        const RankCoord first = tp ? RankCoord{stage, other, 0} : RankCoord{stage, 0, other};
        const std::vector<int> members = tp ? tp_group_ranks(cfg, first) : sp_group_ranks(cfg, first);
        Result<std::shared_ptr<comm::InProcGroup>> grp = comm::InProcGroup::create(size);
        if (!grp.ok()) return std::move(grp).error();
        out.groups.push_back(grp.value());
        for (int local = 0; local < size; ++local) {
          Result<std::unique_ptr<comm::Communicator>> c = paced(grp.value()->communicator(local), members);
          if (!c.ok()) return std::move(c).error();
          const auto r = static_cast<std::size_t>(members[static_cast<std::size_t>(local)]);
          GroupComms& rc = out.ranks[r];
          (of_decode ? (tp ? rc.decode_tp : rc.decode_sp) : (tp ? rc.tp : rc.sp)) = std::move(c).value();
          out.memberships[r].emplace_back(static_cast<int>(out.groups.size()) - 1, local);
        }
      }
    }
    return Status::ok_status();
  };
  if (pc.tp > 1)
    if (Status st = add_groups(pc, true, false); !st) return st.error();
  if (pc.sp > 1)
    if (Status st = add_groups(pc, false, false); !st) return st.error();
  if (decode != nullptr && decode->tp > 1)
    if (Status st = add_groups(*decode, true, true); !st) return st.error();
  if (decode != nullptr && decode->sp > 1)
    if (Status st = add_groups(*decode, false, true); !st) return st.error();
  if (shift) {
    const std::vector<int> members = shift_group_ranks(pc);  // [TP' rank] -> group rank
    Result<std::shared_ptr<comm::InProcGroup>> grp = comm::InProcGroup::create(static_cast<int>(members.size()));
    if (!grp.ok()) return std::move(grp).error();
    out.groups.push_back(grp.value());
    for (std::size_t local = 0; local < members.size(); ++local) {
      Result<std::unique_ptr<comm::Communicator>> c = paced(grp.value()->communicator(static_cast<int>(local)), members);
      if (!c.ok()) return std::move(c).error();
      const auto r = static_cast<std::size_t>(members[local]);
      out.ranks[r].shift_tp = std::move(c).value();
      out.memberships[r].emplace_back(static_cast<int>(out.groups.size()) - 1, static_cast<int>(local));
    }
  }
  return out;
}

// ---- ShardWorker -------------------------------------------------------------

ShardWorker::ShardWorker(ParallelConfig pc, int group_rank, std::unique_ptr<model::ShardRunner> runner,
                         GroupComms comms, int num_threads, std::unique_ptr<model::ShardRunner> shift_runner,
                         std::optional<DecodeShard> decode)
    : pc_(pc),
      rank_(group_rank),
      coord_(rank_coord(pc, group_rank)),
      runner_(std::move(runner)),
      comms_(std::move(comms)),
      num_threads_(num_threads),
      shift_runner_(std::move(shift_runner)),
      decode_(std::move(decode)) {
  if (decode_) decode_coord_ = rank_coord(decode_->pc, group_rank);
}

Status ShardWorker::serve() {
  if (num_threads_ > 0) omp_set_num_threads(num_threads_);
  comm::Communicator& world = *comms_.world;
  const std::chrono::milliseconds step_timeout = world.timeout();
  std::vector<std::int32_t> words;
  for (;;) {
    std::int32_t header[2] = {0, 0};
    world.set_timeout(std::chrono::duration_cast<std::chrono::milliseconds>(kIdleWait));
    Status st = world.recv(header, sizeof header, 0, kTagMetaHeader);
    world.set_timeout(step_timeout);
    if (!st) return st;
    if (header[0] == kKindShutdown) return Status::ok_status();
    if (header[0] == kKindKvOut || header[0] == kKindKvIn || header[0] == kKindKvLayout) {
      // A KV copy of rank 0's (engine/group/group_kv.hpp), between two steps.
      model::ShardRunner& active = switch_.decode_active() ? *decode_->runner : *runner_;
      if (Status s = serve_kv_request(world, header[0], header[1], active.kv_model_shape(), active.kv_cache_view(),
                                      switch_.decode_active());
          !s)
        return s;
      continue;
    }
    if (header[0] == kKindSwitchConfig) {  // Seesaw: the next steps run in the other config
      std::int32_t body[2] = {0, 0};
      if (!decode_ || header[1] != 2)
        return make_error(ErrorCode::corrupt, "rank " + std::to_string(rank_) + ": a config switch but no decode config");
      if (Status s = world.recv(body, sizeof body, 0, kTagMetaBody); !s) return s;
      const bool to_decode = body[0] == 1;
      std::int64_t us = 0;
      if (to_decode != switch_.decode_active()) {
        Result<std::int64_t> done = reshard_weights(*runner_, *decode_->runner, to_decode, decode_->weights);
        if (!done.ok()) return std::move(done).error();
        us = *done;
        switch_.set_phase(to_decode ? model::StepConfig::decode : model::StepConfig::prefill);
      }
      if (Status s = world.send(&us, sizeof us, 0, kTagTransitionAck); !s) return s;
      continue;
    }
    const std::optional<GroupStepConfig> config = StepConfigSwitch::of_header(header[0]);
    if (!config || header[1] < 0)
      return make_error(ErrorCode::corrupt, "rank " + std::to_string(rank_) + ": bad step header");
    if (*config == GroupStepConfig::shift && !shift_runner_)
      return make_error(ErrorCode::corrupt, "rank " + std::to_string(rank_) + ": a shift step but no shift config");
    if (*config == GroupStepConfig::decode && !decode_)
      return make_error(ErrorCode::corrupt, "rank " + std::to_string(rank_) + ": a decode step but no decode config");
    const bool in_decode = *config == GroupStepConfig::decode;
    if (decode_ && in_decode != switch_.decode_active())
      return make_error(ErrorCode::corrupt, "rank " + std::to_string(rank_) + ": a step in the " +
                                                (in_decode ? "decode" : "prefill") +
                                                " config while the other one is active");
    // The step's config: the group's own, Shift's TP' (pp = 1, routed like
    // the base config) or Seesaw's cd, with this rank's place in it.
    const ParallelConfig& pc = in_decode ? decode_->pc : pc_;
    const RankCoord coord = in_decode ? decode_coord_ : coord_;
    model::ShardRunner& runner =
        *config == GroupStepConfig::shift ? *shift_runner_ : in_decode ? *decode_->runner : *runner_;
    words.resize(static_cast<std::size_t>(header[1]));
    if (Status s = world.recv(words.data(), words.size() * sizeof(std::int32_t), 0, kTagMetaBody); !s) return s;
    Result<model::StepInput> in = decode_step(words);
    if (!in.ok()) return std::move(in).error();
    const model::StepInput& step = in.value();
    const int n = step.num_tokens();
    if (n == 0) continue;
    if (coord.stage > 0) {
      const int prev = group_rank_of(pc, {coord.stage - 1, coord.sp_rank, coord.tp_rank});
      if (Status s = world.recv(runner.residual(n), activation_bytes(runner, n), prev, kTagActivations); !s)
        return s;
    }
    const auto t0 = Clock::now();
    if (Status s = runner.run_stage(step); !s) return s;
    if (!runner.spec().last_stage()) {
      busy_us_ += us_since(t0);
      const int next = group_rank_of(pc, {coord.stage + 1, coord.sp_rank, coord.tp_rank});
      if (Status s = world.send(runner.residual(n), activation_bytes(runner, n), next, kTagActivations); !s)
        return s;
      continue;
    }
    Result<model::StepOutput> out = runner.run_logits(step);
    busy_us_ += us_since(t0);
    if (!out.ok()) return std::move(out).error();
    if (pc.pp > 1 && coord.sp_rank == 0 && coord.tp_rank == 0) {
      if (step.num_logits() > 0) {
        const std::vector<float>& l = out.value().logits;
        if (Status s = world.send(l.data(), l.size() * sizeof(float), 0, kTagLogits); !s) return s;
      } else {
        // No logits, but rank 0 must still learn that the step is done: the
        // engine reads and writes KV between steps (swaps, streaming,
        // Seesaw's offloads) and must not race this stage's KV writes.
        const std::int32_t done = 0;
        if (Status s = world.send(&done, sizeof done, 0, kTagLogits); !s) return s;
      }
    }
  }
}

// ---- ParallelExecutor --------------------------------------------------------

ParallelExecutor::ParallelExecutor(ParallelConfig pc, std::unique_ptr<model::ShardRunner> runner, GroupComms comms)
    : pc_(pc), runner_(std::move(runner)), comms_(std::move(comms)) {}

Result<std::unique_ptr<ParallelExecutor>> ParallelExecutor::create(ParallelConfig pc,
                                                                  std::unique_ptr<model::ShardRunner> runner,
                                                                  GroupComms comms) {
  if (!runner) return make_error(ErrorCode::invalid_argument, "parallel executor: no runner");
  const model::ShardSpec& s = runner->spec();
  if (s.tp != pc.tp || s.sp != pc.sp || s.pp != pc.pp || s.stage != 0 || s.sp_rank != 0 || s.tp_rank != 0)
    return make_error(ErrorCode::invalid_argument, "parallel executor: the runner is not rank 0 of " + pc.to_string());
  if (pc.group_size() > 1 && (!comms.world || comms.world->world_size() != pc.group_size() || comms.world->rank() != 0))
    return make_error(ErrorCode::invalid_argument,
                      "parallel executor: needs rank 0 of a world communicator of " + std::to_string(pc.group_size()) +
                          " ranks");
  return std::unique_ptr<ParallelExecutor>(new ParallelExecutor(pc, std::move(runner), std::move(comms)));
}

ParallelExecutor::~ParallelExecutor() { (void)shutdown(); }

Status ParallelExecutor::set_shift(std::unique_ptr<model::ShardRunner> shift_runner, ShiftPolicy policy) {
  if (pc_.pp != 1)
    return make_error(ErrorCode::invalid_argument, "--shift needs pp = 1 (got " + pc_.to_string() + ")");
  if (pc_.group_size() < 2)
    return make_error(ErrorCode::invalid_argument, "--shift needs a group of several devices (sp and / or tp > 1)");
  if (!shift_runner) return make_error(ErrorCode::invalid_argument, "parallel executor: no shift runner");
  if (decode_)
    return make_error(ErrorCode::invalid_argument, "Seesaw's decode config and --shift cannot be combined");
  const model::ShardSpec& s = shift_runner->spec();
  if (s.tp != pc_.group_size() || s.tp_rank != 0 || s.sp != 1 || s.pp != 1)
    return make_error(ErrorCode::invalid_argument, "parallel executor: the shift runner is not TP rank 0 of tp=" +
                                                       std::to_string(pc_.group_size()));
  shift_runner_ = std::move(shift_runner);
  switch_.set_shift_policy(std::move(policy));
  return Status::ok_status();
}

Status ParallelExecutor::set_decode_config(DecodeShard decode) {
  if (shift_runner_)
    return make_error(ErrorCode::invalid_argument, "Seesaw's decode config and --shift cannot be combined");
  if (Status st = check_decode_config(pc_, decode.pc); !st) return st;
  if (!decode.runner) return make_error(ErrorCode::invalid_argument, "parallel executor: no decode runner");
  const model::ShardSpec& s = decode.runner->spec();
  if (s.tp != decode.pc.tp || s.sp != decode.pc.sp || s.pp != decode.pc.pp || s.stage != 0 || s.sp_rank != 0 ||
      s.tp_rank != 0)
    return make_error(ErrorCode::invalid_argument,
                      "parallel executor: the decode runner is not rank 0 of " + decode.pc.to_string());
  if (decode.runner->num_kv_blocks() != runner_->num_kv_blocks() ||
      decode.runner->block_size() != runner_->block_size())
    return make_error(ErrorCode::invalid_argument,
                      "parallel executor: the decode config's KV cache has another block geometry");
  decode_ = std::move(decode);
  switch_.set_phase(model::StepConfig::prefill);
  return Status::ok_status();
}

Status ParallelExecutor::use_step_config(model::StepConfig config) {
  if (!decode_) return make_error(ErrorCode::unsupported, "parallel executor: the group has one parallel config");
  if (!in_flight_.empty())
    return make_error(ErrorCode::invalid_argument, "parallel executor: step config switched with steps in flight");
  const bool to_decode = config == model::StepConfig::decode;
  if (to_decode == switch_.decode_active()) return Status::ok_status();
  // Every rank re-shards at once (on its own thread), rank 0 here.
  const std::int32_t header[2] = {kKindSwitchConfig, 2};
  const std::int32_t body[2] = {to_decode ? 1 : 0, decode_->weights == ReshardWeights::reload ? 1 : 0};
  {
    std::lock_guard meta(meta_mu_);
    for (int r = 1; r < pc_.group_size(); ++r) {
      if (Status st = comms_.world->send(header, sizeof header, r, kTagMetaHeader); !st) return st;
      if (Status st = comms_.world->send(body, sizeof body, r, kTagMetaBody); !st) return st;
    }
  }
  Result<std::int64_t> mine = reshard_weights(*runner_, *decode_->runner, to_decode, decode_->weights);
  if (!mine.ok()) return std::move(mine).error();
  std::int64_t slowest_us = *mine;
  for (int r = 1; r < pc_.group_size(); ++r) {
    std::int64_t us = 0;
    if (Status st = comms_.world->recv(&us, sizeof us, r, kTagTransitionAck); !st) return st;
    slowest_us = std::max(slowest_us, us);
  }
  switch_.set_phase(config);
  last_reshard_ms_ = static_cast<double>(slowest_us) / 1000.0;
  return Status::ok_status();
}

Status ParallelExecutor::enable_kv_copier() {
  if (pc_.group_size() < 2)
    return make_error(ErrorCode::invalid_argument, "parallel executor: a group of one has no remote KV");
  GroupKvCopier::Access a;
  a.world = comms_.world.get();
  a.meta_mu = &meta_mu_;
  a.shape = runner_->kv_model_shape();
  a.own_view = [this] {
    return switch_.decode_active() ? decode_->runner->kv_cache_view() : runner_->kv_cache_view();
  };
  a.decode_active = [this] { return switch_.decode_active(); };
  kv_copier_ = std::make_unique<GroupKvCopier>(std::move(a));
  return Status::ok_status();
}

Status ParallelExecutor::set_shift_policy(ShiftPolicy policy) {
  if (!shift_runner_) return make_error(ErrorCode::invalid_argument, "parallel executor: the group has no shift config");
  if (!in_flight_.empty())
    return make_error(ErrorCode::invalid_argument, "parallel executor: shift policy changed with steps in flight");
  switch_.set_shift_policy(std::move(policy));
  return Status::ok_status();
}

Status ParallelExecutor::shutdown() {
  if (shut_down_ || pc_.group_size() == 1) return Status::ok_status();
  shut_down_ = true;
  const std::int32_t header[2] = {kKindShutdown, 0};
  Status first;
  std::lock_guard meta(meta_mu_);
  for (int r = 1; r < pc_.group_size(); ++r)
    if (Status st = comms_.world->send(header, sizeof header, r, kTagMetaHeader); !st && first.ok()) first = st;
  return first;
}

Status ParallelExecutor::submit(const model::StepInput& in) {
  if (shut_down_) return make_error(ErrorCode::invalid_argument, "parallel executor: shut down");
  const ParallelConfig& pc = active_config();
  if (static_cast<int>(in_flight_.size()) >= pc.pp)
    return make_error(ErrorCode::invalid_argument,
                      "parallel executor: " + std::to_string(in_flight_.size()) + " micro-batches already in flight");
  model::ShardRunner& active = switch_.decode_active() ? *decode_->runner : *runner_;
  if (Status st = active.validate(in); !st) return st;
  const int n = in.num_tokens();
  last_meta_bytes_ = 0;
  last_comm_bytes_ = 0;
  // This step's config: Shift's choice (pp = 1) or the phase's; every rank
  // runs the same one (the kind in the header).
  const GroupStepConfig config = switch_.pick(n);
  model::ShardRunner& runner = config == GroupStepConfig::shift ? *shift_runner_ : active;
  const std::int32_t kind = StepConfigSwitch::header_kind(config);
  if (pc_.group_size() > 1) {
    const std::vector<std::int32_t> words = encode_step(in);
    const std::int32_t header[2] = {kind, static_cast<std::int32_t>(words.size())};
    std::lock_guard meta(meta_mu_);
    for (int r = 1; r < pc_.group_size(); ++r) {
      if (Status st = comms_.world->send(header, sizeof header, r, kTagMetaHeader); !st) return st;
      if (Status st = comms_.world->send(words.data(), words.size() * sizeof(std::int32_t), r, kTagMetaBody); !st)
        return st;
    }
    last_meta_bytes_ = static_cast<std::uint64_t>(pc_.group_size() - 1) * (sizeof header + words.size() * 4);
  }
  InFlight f;
  f.num_logits = in.num_logits();
  const auto t0 = Clock::now();
  if (n > 0) {
    if (Status st = runner.run_stage(in); !st) return st;
  }
  if (pc.pp == 1) {
    Result<model::StepOutput> out = runner.run_logits(in);
    if (!out.ok()) return std::move(out).error();
    f.ready = true;
    f.output = std::move(out).value();
  } else if (n > 0) {
    const int next = group_rank_of(pc, {1, 0, 0});
    const std::size_t bytes = activation_bytes(runner, n);
    if (Status st = comms_.world->send(runner.residual(n), bytes, next, kTagActivations); !st) return st;
    last_comm_bytes_ += bytes;
  } else {
    f.ready = true;  // nothing to compute
    f.output.vocab_size = vocab_size();
  }
  const std::int64_t step_us = us_since(t0);
  busy_us_ += step_us;
  last_comm_bytes_ += runner.last_profile().comm_bytes;
  switch_.count(config, n, static_cast<double>(step_us) / 1000.0);
  in_flight_.push_back(std::move(f));
  return Status::ok_status();
}

Result<model::StepOutput> ParallelExecutor::collect() {
  if (in_flight_.empty()) return make_error(ErrorCode::invalid_argument, "parallel executor: no step in flight");
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (f.ready) return std::move(f.output);
  model::StepOutput out;
  out.vocab_size = vocab_size();
  out.logits.resize(static_cast<std::size_t>(f.num_logits) * static_cast<std::size_t>(out.vocab_size));
  // Nothing is in flight at a config switch: the active config is the step's.
  const ParallelConfig& pc = active_config();
  const int last = group_rank_of(pc, {pc.pp - 1, 0, 0});
  if (f.num_logits > 0) {
    if (Status st = comms_.world->recv(out.logits.data(), out.logits.size() * sizeof(float), last, kTagLogits); !st)
      return st.error();
  } else {  // the last stage's "done": its KV writes are finished
    std::int32_t done = -1;
    if (Status st = comms_.world->recv(&done, sizeof done, last, kTagLogits); !st) return st.error();
  }
  return out;
}

Result<model::StepOutput> ParallelExecutor::execute(const model::StepInput& in) {
  if (!in_flight_.empty())
    return make_error(ErrorCode::invalid_argument, "parallel executor: execute() with micro-batches in flight");
  if (Status st = submit(in); !st) return st.error();
  return collect();
}

// ---- InProcEngineGroup -------------------------------------------------------

Result<std::unique_ptr<InProcEngineGroup>> InProcEngineGroup::create(std::shared_ptr<const model::ModelWeights> weights,
                                                                     ParallelConfig pc, model::CpuRunnerOptions options,
                                                                     std::optional<ShiftOptions> shift,
                                                                     std::optional<SeesawGroupOptions> seesaw,
                                                                     std::optional<comm::LinkSpec> link) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "engine group: no weights");
  if (pc.dp != 1)
    return make_error(ErrorCode::invalid_argument, "engine group: one group is one replica, dp must be 1 (got " +
                                                       std::to_string(pc.dp) + ")");
  if (Status st = model::check_shardable(weights->config, pc.tp, pc.sp, pc.pp); !st) return st.error();
  if (seesaw) {
    const ParallelConfig& cd = seesaw->decode;
    if (shift) return make_error(ErrorCode::invalid_argument, "Seesaw's decode config and --shift cannot be combined");
    if (Status st = check_decode_config(pc, cd); !st) return st.error();
    if (Status st = model::check_shardable(weights->config, cd.tp, cd.sp, cd.pp); !st)
      return make_error(ErrorCode::invalid_argument,
                        "Seesaw: the decode config " + cd.to_string() + " cannot shard this model: " +
                            st.error().message);
  }
  std::optional<ShiftPolicy> policy;
  if (shift) {
    if (pc.pp != 1 || pc.group_size() < 2)
      return make_error(ErrorCode::invalid_argument,
                        "--shift needs a group of sp and / or tp > 1 with pp = 1, got " + pc.to_string());
    if (Status st = model::check_shardable(weights->config, pc.group_size(), 1, 1); !st)
      return make_error(ErrorCode::invalid_argument, "--shift: the shift config tp=" + std::to_string(pc.group_size()) +
                                                         " cannot shard this model: " + st.error().message);
    auto made = ShiftPolicy::create(shift->policy);
    if (!made) return std::move(made).error();
    policy = std::move(made).value();
  }
  std::unique_ptr<InProcEngineGroup> g(new InProcEngineGroup());
  g->pc_ = pc;
  const int size = pc.group_size();
  if (options.num_threads <= 0) {
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    options.num_threads = std::max(1, cores / size);
  }
  g->threads_per_rank_ = options.num_threads;
  std::shared_ptr<comm::LinkModel> link_model;
  if (link) {
    auto made = comm::LinkModel::create(size, *link);
    if (!made.ok()) return make_error(ErrorCode::invalid_argument, "engine group link: " + made.error().message);
    link_model = std::move(made).value();
  }
  Result<InProcGroupComms> comms =
      make_inproc_group_comms(pc, shift.has_value(), seesaw ? &seesaw->decode : nullptr, link_model);
  g->link_ = link_model;
  if (!comms.ok()) return std::move(comms).error();
  g->comms_ = std::move(comms).value();
  std::vector<std::unique_ptr<model::ShardRunner>> runners;
  for (int r = 0; r < size; ++r) {
    GroupComms& c = g->comms_.ranks[static_cast<std::size_t>(r)];
    Result<std::unique_ptr<model::ShardRunner>> runner =
        model::ShardRunner::create(weights, shard_spec_of(pc, r), options, c.shard_comms());
    if (!runner.ok()) return std::move(runner).error();
    runners.push_back(std::move(runner).value());
  }
  // The shift config's shards: own packed weights, the base shard's KV cache.
  std::vector<std::unique_ptr<model::ShardRunner>> shift_runners(static_cast<std::size_t>(size));
  if (shift) {
    for (int r = 0; r < size; ++r) {
      const auto i = static_cast<std::size_t>(r);
      auto made = model::ShardRunner::create_sharing_kv(weights, shift_spec_of(pc, r),
                                                        g->comms_.ranks[i].shift_shard_comms(), *runners[i]);
      if (!made.ok()) return std::move(made).error();
      shift_runners[i] = std::move(made).value();
    }
  }
  // Seesaw's decode config: its own packed weights per rank, its cache in
  // the same KV memory as the prefill config's.
  std::vector<std::optional<DecodeShard>> decode_shards(static_cast<std::size_t>(size));
  if (seesaw) {
    for (int r = 0; r < size; ++r) {
      const auto i = static_cast<std::size_t>(r);
      // One KV pool per device: cd's cache lives in cp's KV memory.
      auto made = model::ShardRunner::create_on_kv_memory(weights, shard_spec_of(seesaw->decode, r),
                                                          g->comms_.ranks[i].decode_shard_comms(), *runners[i]);
      if (!made.ok()) return std::move(made).error();
      decode_shards[i] = DecodeShard{seesaw->decode, std::move(made).value(), seesaw->weights};
      // Reload: only the active config's shard is packed; prefill comes first.
      if (seesaw->weights == ReshardWeights::reload) decode_shards[i]->runner->release_weights();
    }
  }
  Result<std::unique_ptr<ParallelExecutor>> exec =
      ParallelExecutor::create(pc, std::move(runners[0]), std::move(g->comms_.ranks[0]));
  if (!exec.ok()) return std::move(exec).error();
  g->executor_ = std::move(exec).value();
  if (shift)
    if (Status st = g->executor_->set_shift(std::move(shift_runners[0]), std::move(*policy)); !st) return st.error();
  if (seesaw)
    if (Status st = g->executor_->set_decode_config(std::move(*decode_shards[0])); !st) return st.error();
  g->statuses_.resize(static_cast<std::size_t>(size));
  for (int r = 1; r < size; ++r)
    g->workers_.push_back(std::make_unique<ShardWorker>(pc, r, std::move(runners[static_cast<std::size_t>(r)]),
                                                        std::move(g->comms_.ranks[static_cast<std::size_t>(r)]),
                                                        options.num_threads,
                                                        std::move(shift_runners[static_cast<std::size_t>(r)]),
                                                        std::move(decode_shards[static_cast<std::size_t>(r)])));
  InProcEngineGroup* self = g.get();
  for (int r = 1; r < size; ++r) {
    g->threads_.emplace_back([self, r] {
      Status st = self->workers_[static_cast<std::size_t>(r - 1)]->serve();
      if (!st) (void)self->comms_.mark_dead(r);  // peers fail fast instead of waiting out the timeout
      std::lock_guard lock(self->status_mu_);
      self->statuses_[static_cast<std::size_t>(r)] = std::move(st);
    });
  }
  return g;
}

InProcEngineGroup::~InProcEngineGroup() {
  if (executor_) {
    if (Status st = executor_->shutdown(); !st)
      for (int r = 1; r < pc_.group_size(); ++r) (void)comms_.mark_dead(r);
  }
  for (std::thread& t : threads_) t.join();
}

std::vector<double> InProcEngineGroup::stage_busy_ms() const {
  std::vector<double> out(static_cast<std::size_t>(pc_.pp), 0.0);
  out[0] = executor_->busy_ms();
  for (int s = 1; s < pc_.pp; ++s) out[static_cast<std::size_t>(s)] = workers_[static_cast<std::size_t>(group_rank_of(pc_, {s, 0, 0}) - 1)]->busy_ms();
  return out;
}

std::vector<std::size_t> InProcEngineGroup::packed_weight_bytes_per_rank() {
  const auto of = [](model::ShardRunner& main, model::ShardRunner* shift, model::ShardRunner* decode) {
    return main.packed_weight_bytes() + (shift ? shift->packed_weight_bytes() : 0) +
           (decode ? decode->packed_weight_bytes() : 0);
  };
  std::vector<std::size_t> out;
  out.push_back(of(executor_->runner(), executor_->shift_runner(), executor_->decode_runner()));
  for (auto& w : workers_) out.push_back(of(w->runner(), w->shift_runner(), w->decode_runner()));
  return out;
}

kvstore::KvModelShape InProcEngineGroup::kv_model_shape() const { return executor_->runner().kv_model_shape(); }

std::vector<kvstore::KvCacheView> InProcEngineGroup::kv_cache_views() {
  std::vector<kvstore::KvCacheView> views;
  views.reserve(static_cast<std::size_t>(pc_.group_size()));
  const bool decode = executor_->step_config() == model::StepConfig::decode;
  views.push_back(decode ? executor_->decode_runner()->kv_cache_view() : executor_->runner().kv_cache_view());
  for (auto& w : workers_) views.push_back(decode ? w->decode_runner()->kv_cache_view() : w->runner().kv_cache_view());
  return views;
}

std::vector<kvstore::KvCacheView> InProcEngineGroup::shift_kv_cache_views() {
  std::vector<kvstore::KvCacheView> views;
  if (!executor_->has_shift()) return views;
  views.push_back(executor_->shift_runner()->kv_cache_view());
  for (auto& w : workers_) views.push_back(w->shift_runner()->kv_cache_view());
  return views;
}

Status InProcEngineGroup::kill_rank(int group_rank) {
  if (group_rank <= 0 || group_rank >= pc_.group_size())
    return make_error(ErrorCode::invalid_argument, "kill_rank: rank must be in [1, group_size)");
  return comms_.mark_dead(group_rank);
}

Status InProcEngineGroup::rank_status(int group_rank) const {
  std::lock_guard lock(status_mu_);
  if (group_rank < 0 || group_rank >= static_cast<int>(statuses_.size()))
    return make_error(ErrorCode::invalid_argument, "rank_status: rank out of range");
  return statuses_[static_cast<std::size_t>(group_rank)];
}

}  // namespace shardline::engine
