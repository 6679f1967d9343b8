#pragma once
/// \file
/// A ModelExecutor that runs no model: it takes each step the real engine
/// (engine::LlmEngine, its Scheduler and token budget policy) hands it,
/// prices the step with the cost model (orchestrator::CostModel, Seesaw App.
/// A) over the step's exact token counts, cached-KV lengths and attention
/// pairs, and advances a virtual clock. It "samples on its device": every
/// logits row gets token `sampled_token_id` (requests run with ignore_eos,
/// so lengths come from the workload).
///
/// Time. The engine thread is at `now()`. Submitting a micro-batch costs the
/// engine's own time on that thread (scheduling, launch, sampling:
/// DeviceSpec::step_overhead_ms + seq_overhead_ms per sequence of the
/// micro-batch); the micro-batch then enters pipeline stage
/// 0 when that stage is free, and each stage s starts it when the previous
/// stage has finished it and stage s is free:
///
///   start_s = max(end_{s-1}, free_s),  end_s = start_s + t_s,  free_s = end_s
///
/// with t_s = CostModel::estimate(config, step).stages[s].micro_batch_ms.
/// collect() returns the oldest micro-batch and moves now() to its end (the
/// engine waits for it). With pp = 1 a step simply takes overhead + t_0.
/// This is the pipeline the real engine drives (gLLM's asynchronous
/// micro-batches, seed 004 §3.3), so bubbles come out of the schedule, not
/// a formula.
///
/// Shift Parallelism (seed 001 §3, Alg. 3): with a shift config the
/// executor owns an engine::ShiftPolicy, as the real group's rank 0 does,
/// and prices each step in the config the policy picks for its token count.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "engine/parallel_config.hpp"
#include "engine/policies/shift_policy.hpp"
#include "model/executor.hpp"
#include "orchestrator/cost_model.hpp"

namespace shardline::sim {

struct SimulatedExecutorOptions {
  engine::ParallelConfig config;  ///< the engine group's config (dp ignored)
  /// Shift Parallelism: the config of steps with few tokens (tp' = sp*tp,
  /// sp = 1) and the policy's options; none: every step runs in `config`.
  std::optional<engine::ParallelConfig> shift_config;
  engine::ShiftPolicyOptions shift;
  int vocab_size = 32000;
  int num_kv_blocks = 0;  ///< the engine group's KV cache, in blocks (> 0)
  int block_size = 16;
  double step_overhead_ms = 0;  ///< engine-thread time per micro-batch
  double seq_overhead_ms = 0;   ///< ... plus this per sequence in it
  std::int32_t sampled_token_id = 3;
};

/// One micro-batch as the executor ran it (virtual times in ms).
struct MicroBatchRecord {
  double submit_ms = 0;   ///< engine thread submitted it
  double end_ms = 0;      ///< last stage finished it
  double busy_ms = 0;     ///< sum of its stage times
  int num_prefill_tokens = 0;
  int num_decode_tokens = 0;
  int num_seqs = 0;
  bool shifted = false;   ///< ran in the shift config
};

/// Per request: when its tokens came out (virtual ms).
struct TokenTimes {
  double first_ms = -1;
  double last_ms = -1;
  int num_tokens = 0;
};

class SimulatedExecutor final : public model::ModelExecutor {
 public:
  /// Errors: invalid_argument (num_kv_blocks or block_size < 1, pp of the
  /// config > the model's layers, a shift config without sp*tp > 1, bad
  /// shift options).
  /// `large_model` prices steps of at least `large_step_tokens` tokens (the
  /// device's GEMM efficiency differs with the rows; null: `model` prices
  /// every step). Both must outlive the executor.
  [[nodiscard]] static Result<std::unique_ptr<SimulatedExecutor>> create(
      const orchestrator::CostModel& model, SimulatedExecutorOptions options,
      const orchestrator::CostModel* large_model = nullptr, long long large_step_tokens = 256);

  [[nodiscard]] Result<model::StepOutput> execute(const model::StepInput& input) override;
  [[nodiscard]] int vocab_size() const override { return options_.vocab_size; }
  [[nodiscard]] int num_kv_blocks() const override { return options_.num_kv_blocks; }
  [[nodiscard]] int block_size() const override { return options_.block_size; }
  [[nodiscard]] bool samples_on_device() const override { return true; }
  [[nodiscard]] int max_in_flight() const override { return options_.config.pp; }
  [[nodiscard]] Status submit(const model::StepInput& input) override;
  [[nodiscard]] Result<model::StepOutput> collect() override;

  /// The engine thread's virtual time, ms.
  [[nodiscard]] double now_ms() const { return now_ms_; }
  /// Moves the engine thread's time forward (work arriving later); never back.
  void advance_to(double ms) { now_ms_ = std::max(now_ms_, ms); }
  [[nodiscard]] const std::vector<MicroBatchRecord>& records() const { return records_; }
  [[nodiscard]] const std::map<std::uint64_t, TokenTimes>& token_times() const { return token_times_; }
  /// Busy time of each pipeline stage, ms.
  [[nodiscard]] const std::vector<double>& stage_busy_ms() const { return stage_busy_ms_; }
  /// Shift policy switches so far (0 without Shift).
  [[nodiscard]] std::uint64_t shift_switches() const { return shift_ ? shift_->switches() : 0; }

 private:
  struct Pending {
    double end_ms = 0;
    std::size_t record = 0;
    std::vector<std::uint64_t> logits_seqs;  ///< [num_logits] the sequence of each logits row
  };
  SimulatedExecutor(const orchestrator::CostModel& model, SimulatedExecutorOptions options,
                    const orchestrator::CostModel* large_model, long long large_step_tokens)
      : model_(model), large_model_(large_model), large_step_tokens_(large_step_tokens), options_(std::move(options)), stage_free_ms_(options_.config.pp, 0.0),
        stage_busy_ms_(options_.config.pp, 0.0) {}

  const orchestrator::CostModel& model_;
  const orchestrator::CostModel* large_model_;
  long long large_step_tokens_;
  SimulatedExecutorOptions options_;
  std::optional<engine::ShiftPolicy> shift_;
  double now_ms_ = 0;
  std::vector<double> stage_free_ms_;
  std::vector<double> stage_busy_ms_;
  std::deque<Pending> pending_;
  std::vector<MicroBatchRecord> records_;
  std::map<std::uint64_t, TokenTimes> token_times_;
};

}  // namespace shardline::sim
