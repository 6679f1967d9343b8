#include "engine/seesaw/seesaw_phases.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "common/stopwatch.hpp"
#include "engine/seesaw/kv_mover.hpp"

namespace shardline::engine {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Result<std::unique_ptr<SeesawPhases>> SeesawPhases::create(const EngineParts& parts, SeesawOptions options) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::invalid_argument, "engine config: " + m); };
  KvCacheIo& kv_io = *parts.kv_io;
  if (!kv_io.can_copy_kv())
    return bad("Seesaw needs an executor whose KV caches can be copied to the host (a CPU device, an in-process "
               "group or a TCP group)");
  const std::size_t need = kv_io.bytes_for(parts.max_model_len);
  if (parts.swap_space_bytes < need)
    return bad("Seesaw's host KV buffer of " + std::to_string(parts.swap_space_bytes) +
               " bytes cannot hold one max_model_len=" + std::to_string(parts.max_model_len) + " sequence (" +
               std::to_string(need) + " bytes)");
  auto policy = SeesawPolicy::create(options.policy);
  if (!policy.ok()) return std::move(policy).error();
  auto phases = std::unique_ptr<SeesawPhases>(new SeesawPhases(parts, std::move(policy).value()));
  parts.scheduler->set_phase(SchedulePhase::prefill);  // the policy starts in prefill (Fig. 6)
  model::ModelExecutor& executor = *parts.executor;
  if (executor.has_step_configs()) {  // prefill runs under cp (§4.1)
    if (Status s = executor.use_step_config(model::StepConfig::prefill); !s) return s.error();
    if (Status s = kv_io.set_views(executor.kv_cache_views()); !s) return s.error();
  }
  KvMoverOptions mover;
  mover.async = options.async_kv;
  mover.host_link = options.host_link;
  mover.num_devices = kv_io.num_kv_devices();
  auto started = KvMover::create(std::move(mover));
  if (!started.ok()) return std::move(started).error();
  if (Status s = kv_io.start_mover(std::move(started).value()); !s) return s.error();
  return phases;
}

PhaseAdmission SeesawPhases::plan() {
  counts_ = parts_.scheduler->seesaw_counts(parts_.host_held_tokens(), parts_.host_capacity_tokens());
  const SeesawPlan p = policy_.plan(counts_);
  planned_ = p.phase;
  return PhaseAdmission{p.phase != policy_.phase(), p.admit_kv_tokens};
}

Result<PhaseAdmission> SeesawPhases::admit() {
  // The prefetcher's finished copies (§5.2): freed blocks, onboarded decodes.
  if (Status s = parts_.apply_done(parts_.kv_io->poll_moves()); !s.ok()) return s.error();
  return plan();
}

Result<PhaseAdmission> SeesawPhases::transition() {
  const SeesawPhase to = planned_;
  const auto t0 = Clock::now();
  KvCacheIo& kv_io = *parts_.kv_io;
  // Every copy in flight lands first (onboards of the decode phase, offloads
  // of the prefill phase), then the resident sequences leave, and their
  // copies land too: the caches change layout at the switch.
  auto t_drain = Clock::now();
  if (Status s = parts_.apply_done(kv_io.drain_moves()); !s.ok()) return s.error();
  stats_.drain_ms += ms_since(t_drain);
  std::vector<SwapOut> resident;
  if (Status s = parts_.scheduler->offload_resident(resident); !s.ok())
    return make_error(ErrorCode::internal, s.error().message);
  if (Status s = parts_.offload_all(resident, this); !s.ok()) return s.error();
  t_drain = Clock::now();
  if (Status s = parts_.apply_done(kv_io.drain_moves()); !s.ok()) return s.error();
  stats_.drain_ms += ms_since(t_drain);
  // Dynamic re-sharding (§4.1): the device KV is empty now; the next phase
  // runs under its own config, whose caches the host buffer restores into.
  model::ModelExecutor& executor = *parts_.executor;
  if (executor.has_step_configs()) {
    const auto t_switch = Clock::now();
    if (Status s = executor.use_step_config(to == SeesawPhase::prefill ? model::StepConfig::prefill
                                                                        : model::StepConfig::decode);
        !s)
      return s.error();
    if (Status s = kv_io.set_views(executor.kv_cache_views()); !s) return s.error();
    stats_.switch_ms += ms_since(t_switch);
  }
  parts_.scheduler->set_phase(to == SeesawPhase::prefill ? SchedulePhase::prefill : SchedulePhase::decode);
  policy_.on_transition(to, counts_);
  ++stats_.transitions;
  stats_.transition_ms += ms_since(t0);
  return plan();
}

bool SeesawPhases::limits(int depth, bool limited, MicroBatchBudget& budget) const {
  // Pipelined decode (§5.1): under a decode config with PP, 1/PP of the
  // decodes per micro-batch, whatever the token budget.
  if (policy_.phase() != SeesawPhase::decode || depth <= 1) return limited;
  const int split = pipelined_decode_tokens(counts_, parts_.max_num_seqs, depth);
  if (!limited) budget = MicroBatchBudget{parts_.max_num_batched_tokens, split};
  budget.max_decode_tokens = std::min(budget.max_decode_tokens, split);
  return true;
}

void SeesawPhases::on_offload() {
  ++stats_.offloads;
  stats_.host_peak_tokens = std::max(stats_.host_peak_tokens, parts_.host_held_tokens());
}

void SeesawPhases::on_submitted() {
  ++(policy_.phase() == SeesawPhase::prefill ? stats_.prefill_steps : stats_.decode_steps);
}

StepPhaseFactory seesaw_phases(SeesawOptions options) {
  return [options = std::move(options)](const EngineParts& parts) -> Result<std::unique_ptr<StepPhaseHook>> {
    auto phases = SeesawPhases::create(parts, options);
    if (!phases.ok()) return std::move(phases).error();
    return std::unique_ptr<StepPhaseHook>(std::move(phases).value());
  };
}

const SeesawPhases* seesaw_phases_of(const LlmEngine& engine) {
  return dynamic_cast<const SeesawPhases*>(engine.step_phases());
}

SeesawStats seesaw_stats_of(const LlmEngine& engine) {
  const SeesawPhases* phases = seesaw_phases_of(engine);
  return phases != nullptr ? phases->stats() : SeesawStats{};
}

}  // namespace shardline::engine
