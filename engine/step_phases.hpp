#pragma once
/// \file
/// The step loop's one hook for a technique that runs it in phases. Before
/// each micro-batch is planned, LlmEngine::fill_pipeline asks the hook what
/// the scheduler may admit (admit), lets it change phase once the pipeline
/// is empty (transition), and lets it tighten the micro-batch's token
/// limits (limits). The loop names no technique: Seesaw's prefill and decode
/// phases (seed 000 §4.2, §5.1) implement the hook in engine/seesaw/
/// (seesaw_phases.hpp), over the engine's parts given here.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "engine/kv_cache_io.hpp"
#include "engine/policies/token_budget.hpp"
#include "engine/scheduler.hpp"
#include "model/executor.hpp"

namespace shardline::engine {

class StepPhaseHook;

/// The parts of an LlmEngine a phase hook works on. The engine owns them;
/// they outlive the hook. Calls only from the engine's thread.
struct EngineParts {
  model::ModelExecutor* executor = nullptr;
  Scheduler* scheduler = nullptr;
  KvCacheIo* kv_io = nullptr;
  int max_num_seqs = 0;              ///< EngineConfig::max_num_seqs
  int max_num_batched_tokens = 0;    ///< EngineConfig::max_num_batched_tokens
  int max_model_len = 0;             ///< EngineConfig::max_model_len
  std::uint64_t swap_space_bytes = 0;  ///< the host KV buffer (EngineConfig::swap_space_bytes)

  /// Starts copying a sequence's KV to the host KV buffer on the mover.
  /// False when it does not fit: the scheduler is told, and the sequence is
  /// prefilled again. Errors: internal.
  [[nodiscard]] Result<bool> offload(const SwapOut& offload) const;
  /// offload() of each, in order; `hook` (null: none) hears on_offload()
  /// of each whose copy started. Errors: as offload().
  [[nodiscard]] Status offload_all(std::span<const SwapOut> offloads, StepPhaseHook* hook) const;
  /// Tells the scheduler about copies the mover finished (an offloaded
  /// sequence frees its blocks, an onboarded one may decode). Errors:
  /// `done`'s, internal.
  [[nodiscard]] Status apply_done(Result<std::vector<KvCacheIo::MoveDone>> done) const;
  /// The host KV buffer in KV tokens: held now, and its capacity.
  [[nodiscard]] long long host_held_tokens() const;
  [[nodiscard]] long long host_capacity_tokens() const;
};

/// What the scheduler may admit in the next micro-batch.
struct PhaseAdmission {
  /// The technique wants another phase: the loop submits nothing more until
  /// its pipeline is empty, then calls transition().
  bool transition_due = false;
  /// KV tokens the scheduler may admit (Scheduler::schedule's
  /// admit_kv_tokens); -1: no cap.
  long long admit_kv_tokens = -1;
};

class StepPhaseHook {
 public:
  virtual ~StepPhaseHook() = default;
  /// Before a micro-batch is planned: applies the copies the mover
  /// finished and asks the technique. Errors: internal.
  [[nodiscard]] virtual Result<PhaseAdmission> admit() = 0;
  /// Changes phase; only with nothing in flight (after admit() said so).
  /// Returns the admission in the new phase. Errors: the executor's (a
  /// config switch), internal.
  [[nodiscard]] virtual Result<PhaseAdmission> transition() = 0;
  /// The micro-batch's token limits under a config of `depth` pipeline
  /// stages: may tighten `budget` (or set it, when `limited` is false).
  /// Returns whether limits apply.
  [[nodiscard]] virtual bool limits(int depth, bool limited, MicroBatchBudget& budget) const = 0;
  /// A sequence's KV started its copy to the host KV buffer.
  virtual void on_offload() = 0;
  /// A micro-batch was submitted.
  virtual void on_submitted() = 0;
};

/// Builds an engine's hook over its parts (EngineConfig::step_phases), once,
/// when the engine is created. Errors: the technique's (invalid_argument
/// for a config it cannot run), which fail LlmEngine::create.
using StepPhaseFactory = std::function<Result<std::unique_ptr<StepPhaseHook>>(const EngineParts& parts)>;

}  // namespace shardline::engine
