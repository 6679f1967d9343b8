#pragma once
/// \file
/// A ModelExecutor that runs no model: it takes each step the real engine
/// (engine::LlmEngine, its Scheduler and token budget policy) hands it,
/// prices the step with the cost model (sim::CostModel, Seesaw App.
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
///
/// Seesaw (seed 000 §4–5): with a decode config the executor has two step
/// configs, cp (`config`) and cd, and the real engine's Seesaw phases drive
/// it (use_step_config, the engine's KvCacheIo and KvMover over kv_copier()).
/// The copier moves no bytes: it prices each copy on the group's emulated
/// host links (PCIe), one copy stream per worker as in the paper:
///
///   start = max(link_free, now),  link_free = start + latency + bytes / group_size / host_bw
///
/// (every device moves its shard over its own link in parallel). An offload
/// (a finished prefill's KV going to the host KV buffer) overlaps the next
/// steps (§5.2 "overlap swap-out with computation"). An onboard (the
/// prefetcher's swap-in) must land before a step that decodes its sequence
/// starts, so stage 0 of such a step waits for it (§5.2 "asynchronous
/// swap-in": the sequence is not scheduled before the copy is done). A
/// transition waits for the link and the pipeline to drain, then re-shards
/// the weights by reloading the new config's shard of every device from host
/// memory (§4.1 "model weights are re-sharded by reloading the required
/// shards from CPU memory"): latency + weight_bytes / (tp*pp) / host_bw. The
/// engine runs its mover synchronously (SeesawOptions::async_kv = false):
/// the copies' virtual time is what overlaps, here.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "engine/group/parallel_config.hpp"
#include "engine/policies/shift_policy.hpp"
#include "kvstore/kv_stream.hpp"
#include "model/executor.hpp"
#include "sim/cost_model.hpp"

namespace shardline::sim {

struct SimulatedExecutorOptions {
  engine::ParallelConfig config;  ///< the engine group's config (dp ignored)
  /// Shift Parallelism: the config of steps with few tokens (tp' = sp*tp,
  /// sp = 1) and the policy's options; none: every step runs in `config`.
  std::optional<engine::ParallelConfig> shift_config;
  engine::ShiftPolicyOptions shift;
  /// The cost model of shift-config steps below the large-step size (the
  /// device's Shift curve, sim::group_hardware(..., shift_steps)); null: the
  /// executor's model. Not owned; outlives the executor.
  const sim::CostModel* shift_model = nullptr;
  /// Seesaw: the decode config cd (`config` is cp); none: one config.
  std::optional<engine::ParallelConfig> decode_config;
  /// KV copies (kv_copier()) and weight reloads: the model's KV shape (what
  /// a copied chunk holds), the whole model's weight bytes, and the link of
  /// each device that KV copies go over: the host link (Seesaw's host KV
  /// buffer) or the network to the KV replicas (DéjàVu's recovery, which
  /// restores a resumed request's KV). kv_link_bw_bytes_per_s = 0: no copier.
  kvstore::KvModelShape kv_shape;
  double weight_bytes = 0;
  double kv_link_bw_bytes_per_s = 0;
  double kv_link_latency_ms = 0;
  /// DéjàVu's token streaming (seed 003 §4.1.1): every step's new KV goes to
  /// a replica over the KV link while the step computes; a stage's time is
  /// max(its compute, latency + its new KV bytes per rank / bandwidth).
  bool replicate_kv = false;
  /// SiDP (seed 002): the rank's step time from the step's shape and the
  /// cost model's estimate of it on one device (WaS: the weight fetches
  /// overlapped; CaS: the FFN at the layers' owners). Needs pp = 1; null:
  /// the estimate.
  std::function<double(const sim::StepShape&, const sim::StepCost&)> price;
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
  double kv_wait_ms = 0;  ///< stage 0 waited this long for KV still on a link (onboards, restores)
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
      const sim::CostModel& model, SimulatedExecutorOptions options,
      const sim::CostModel* large_model = nullptr, long long large_step_tokens = 256);

  [[nodiscard]] Result<model::StepOutput> execute(const model::StepInput& input) override;
  [[nodiscard]] int vocab_size() const override { return options_.vocab_size; }
  [[nodiscard]] int num_kv_blocks() const override { return options_.num_kv_blocks; }
  [[nodiscard]] int block_size() const override { return options_.block_size; }
  [[nodiscard]] bool samples_on_device() const override { return true; }
  [[nodiscard]] int max_in_flight() const override { return active_.pp; }
  // Seesaw's two configs and its KV copies (file comment).
  [[nodiscard]] bool has_step_configs() const override { return options_.decode_config.has_value(); }
  [[nodiscard]] Status use_step_config(model::StepConfig config) override;
  [[nodiscard]] kvstore::KvModelShape kv_model_shape() const override {
    return has_copier() ? options_.kv_shape : kvstore::KvModelShape{};
  }
  [[nodiscard]] kvstore::KvCopier* kv_copier() override { return has_copier() ? &copier_ : nullptr; }
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
  /// Seesaw's config switches, the engine thread's time in them (waiting for
  /// the link and the pipeline, then reloading weights), of which reloading,
  /// ms; bytes copied each way on the KV links (Seesaw's offloads and
  /// onboards; restores of resumed KV count as to_device); time the steps
  /// waited for KV to land, ms; bytes streamed to replicas.
  struct LinkStats {
    std::uint64_t transitions = 0;
    double transition_ms = 0;
    double reload_ms = 0;
    double bytes_to_host = 0, bytes_to_device = 0;
    double onboard_wait_ms = 0;
    double replicated_bytes = 0;
  };
  [[nodiscard]] const LinkStats& link_stats() const { return link_; }

 private:
  struct Pending {
    double end_ms = 0;
    std::size_t record = 0;
    std::vector<std::uint64_t> logits_seqs;  ///< [num_logits] the sequence of each logits row
  };
  /// Prices KV copies on the KV links (Seesaw's host links, the network to
  /// the replicas); moves nothing.
  class LinkCopier final : public kvstore::KvCopier {
   public:
    explicit LinkCopier(SimulatedExecutor& owner) : owner_(owner) {}
    [[nodiscard]] int num_devices() const override { return owner_.active_.group_size(); }
    [[nodiscard]] bool copies_bytes() const override { return false; }
    [[nodiscard]] Status copy_out(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                                  std::span<std::byte> chunk) override;
    [[nodiscard]] Status copy_in(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                                 std::span<const std::byte> chunk) override;

   private:
    SimulatedExecutor& owner_;
  };
  SimulatedExecutor(const sim::CostModel& model, SimulatedExecutorOptions options,
                    const sim::CostModel* large_model, long long large_step_tokens);
  [[nodiscard]] bool has_copier() const { return options_.kv_link_bw_bytes_per_s > 0; }
  /// Puts a copy of `bytes` on the KV links; returns when it lands, ms.
  double link_copy(double bytes, bool to_host);

  const sim::CostModel& model_;
  const sim::CostModel* large_model_;
  long long large_step_tokens_;
  SimulatedExecutorOptions options_;
  engine::ParallelConfig active_;  ///< the config steps run in (cp or cd with Seesaw)
  std::optional<engine::ShiftPolicy> shift_;
  LinkCopier copier_{*this};
  double link_free_ms_ = 0;
  /// Onboarded sequences not stepped yet: first block id -> when its KV lands.
  std::map<std::int32_t, double> onboard_ready_ms_;
  LinkStats link_;
  double now_ms_ = 0;
  std::vector<double> stage_free_ms_;
  std::vector<double> stage_busy_ms_;
  std::deque<Pending> pending_;
  std::vector<MicroBatchRecord> records_;
  std::map<std::uint64_t, TokenTimes> token_times_;
};

}  // namespace shardline::sim
