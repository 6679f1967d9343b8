#pragma once
/// \file
/// The cluster simulator (`shardline simulate`, docs/simulator.md): a
/// discrete-event run of Shardline's own engine over a workload on a
/// described cluster. Each DP replica is a real engine::LlmEngine (its
/// Scheduler, block manager, token budget policy: fixed or gLLM's Token
/// Throttling) over a SimulatedExecutor, which prices every micro-batch with
/// the cost model (sim::CostModel, Seesaw App. A) for the cluster's
/// device and advances a virtual clock. So a scheduling change shows in the
/// simulator the day it lands: there is no second scheduler to drift.
///
/// The run, as the real cluster does it offline: every request arrives at
/// t = 0; the orchestrator deals them over the replicas' queues of 2 x
/// max_batch requests (orchestrator::WorkerPool::dispatch) and tops a queue
/// up as its requests finish (or deals them all round-robin, as in-process
/// DP does: SimOptions::dispatch); the replica whose engine thread is
/// furthest behind in virtual time steps next. Requests run with ignore_eos for exactly their
/// output_len tokens.
///
/// Reported as `shardline bench` reports a measured run (same names and
/// definitions, sim/calibration/parallel.hpp): total_tok_s = (prompt + generated) /
/// elapsed; prefill_tok_s from a second run with one output token each;
/// decode_tok_s = (generated - num_prompts) / (elapsed - prefill elapsed);
/// decode_step_ms = median time between the engine's consecutive step()
/// returns over pure-decode micro-batches at the largest decode batch; plus
/// TTFT / TPOT percentiles, KV use, the pipeline bubble, phase times and the
/// simulator's own speed.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "engine/group/parallel_config.hpp"
#include "engine/policies/seesaw_policy.hpp"
#include "engine/policies/sidp_mode_policy.hpp"
#include "engine/policies/shift_policy.hpp"
#include "model/config.hpp"
#include "sim/hardware_spec.hpp"

namespace shardline::sim {

/// One request of a workload: only its token lengths matter.
struct SimRequest {
  int prompt_len = 0;  ///< prompt tokens (>= 1)
  int output_len = 0;  ///< generated tokens (>= 1)
};

/// Seesaw (seed 000): phases of prefill in cp (Strategy::parallel) and
/// decode in cd, with a host KV buffer between them, run by the real
/// engine's Seesaw code (engine/llm_engine.hpp) and its policy.
struct SeesawStrategy {
  engine::ParallelConfig decode;  ///< cd: same devices as cp (tp*pp*sp equal)
  engine::SeesawPolicyOptions policy;  ///< transition-minimizing by default (§4.2)
  /// The host KV buffer per device, bytes (the paper allocates 80 GiB of CPU
  /// memory per GPU, §6.1).
  double host_buffer_bytes_per_device = 80.0 * double(1ull << 30);
};

/// DéjàVu (seed 003 §4.2.3, §5.2.3): failures injected into a run. A
/// failure takes down one DP group (every stage: the restarted group loads
/// its weights again); the requests it was running come back on the
/// restarted group once the failure is noticed and the weights are loaded
/// (detect_s + the rank's weight shard over the host link).
struct FailureInjection {
  /// True (DéjàVu): every step's new KV streams to a replica on another
  /// node (over the inter-node link, overlapped with the step), and a
  /// request resumes from its last token, its KV restored from the replica
  /// over that link. False (the paper's baseline): it starts from scratch.
  bool replicate_kv = true;
  std::vector<double> at_s;  ///< failures at these virtual times, seconds, ascending
  /// > 0: one failure when a request of the group first has this many
  /// generated tokens (the paper's "failure at token generation step N").
  int at_token = 0;
  int group = 0;  ///< the DP group that fails
  /// Until the failure is noticed, seconds (the orchestrator's heartbeat
  /// timeout, orchestrator::WorkerPoolOptions::heartbeat_timeout_s).
  double detect_s = 3.0;
  /// > 0: also failures at a rate, as a Poisson process of mean time
  /// between failures mtbf_s (virtual seconds; exponential gaps, each from
  /// the previous failure), drawn from `seed`: DéjàVu's "failures at a
  /// given frequency" (§5.2.3). 0: none.
  double mtbf_s = 0;
  std::uint64_t seed = 1;
};

/// SiDP (seed 002): a DP group of single-device ranks that share the FFN
/// weights: each layer's FFN lives on one owner (balanced: layer l on rank
/// l mod dp), each rank keeps the rest of the model and `cache_slots` FFN
/// slots, and the KV cache gets the freed memory (engine/sidp_memory.hpp).
/// Each rank is a real engine. In WaS a rank steps on its own and fetches
/// the (L - owned) non-owned FFN layers over the intra-node link while it
/// computes: its step takes max(the step, their fetch), or on a shared
/// memory bus (CPU devices) the step plus the copy. In CaS the ranks step
/// in lockstep rounds and every layer's FFN runs at its owner for the
/// round's G tokens (n x the round's ranks): a step takes its non-FFN part
/// + L x (T_ffn(G) + sending its rows there and back). The real
/// orchestrator policy (engine::SidpModePolicy, on the virtual clock)
/// switches the mode from the ranks' running sequences and waiting prompts.
struct SidpStrategy {
  engine::SidpModeSetting mode = engine::SidpModeSetting::automatic;
  /// b*, on the group's running sequences; 0: dp x the cost model's
  /// overlapped b* (CostModel::sidp_switch_batch_overlapped), as the real
  /// orchestrator computes it.
  long long switch_batch = 0;
  double hysteresis = 0.25;
  double min_dwell_s = 3.0;
  int cache_slots = 2;
};

/// A way to run the workload on the cluster.
struct Strategy {
  engine::ParallelConfig parallel;   ///< group shape and dp replicas; world_size() <= the cluster's devices
  std::string token_budget = "fixed";  ///< engine/policies/token_budget_policies.hpp: fixed or throttle
  /// Shift Parallelism: steps of at most T tokens run in tp' = sp*tp
  /// (seed 001 Alg. 3); needs sp*tp > 1 and pp = 1.
  std::optional<engine::ShiftPolicyOptions> shift;
  /// Seesaw: `parallel` is cp, this holds cd (pp = 1 or not; no Shift).
  std::optional<SeesawStrategy> seesaw;
  /// DéjàVu: failures and how the group recovers (not with Seesaw).
  std::optional<FailureInjection> failures;
  /// SiDP: `parallel` must be dp >= 2 single-device ranks (no Shift,
  /// Seesaw or failures).
  std::optional<SidpStrategy> sidp;
  /// "tp=2,pp=1,sp=1,dp=4 fixed", "seesaw pp=4:tp=4 fixed" and the like.
  [[nodiscard]] std::string label() const;
};

struct SimOptions {
  int max_batch = 256;                 ///< running sequences at most per engine group (`--max-batch`)
  int max_num_batched_tokens = 2048;   ///< tokens per step at most
  int block_size = 16;                 ///< KV block, tokens
  bool prefill_run = true;             ///< also simulate max_tokens = 1 (for prefill_tok_s, decode_tok_s)
  /// How requests reach the DP replicas. orchestrator: as the cluster's
  /// WorkerPool does (queues of 2 x max_batch, dealt one request per
  /// replica per round, topped up as requests finish). round_robin: request i on replica
  /// i % dp, all at t = 0 (engine/data_parallel.hpp: in-process DP, what
  /// `bench --parallel dp=N` runs).
  enum class Dispatch { orchestrator, round_robin };
  Dispatch dispatch = Dispatch::orchestrator;
};

/// p50 / p90 / p99 and mean of a latency, ms.
struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};

struct SimResult {
  std::string strategy;     ///< Strategy::label()
  std::string parallel;     ///< ParallelConfig::to_string()
  std::string token_budget;
  int num_devices = 0;      ///< world_size()
  int num_requests = 0;
  long long prompt_tokens = 0, generated_tokens = 0;
  double elapsed_s = 0;            ///< virtual seconds until the last request finished
  double prefill_elapsed_s = 0;    ///< the max_tokens = 1 run (0 without it)
  double total_tok_s = 0, prefill_tok_s = 0, decode_tok_s = 0;
  /// Median over pure-decode micro-batches at the largest decode batch
  /// (leaving out those that waited for KV on a link and the first after a
  /// restart).
  double decode_step_ms = 0;
  int decode_batch = 0;            ///< sequences in those micro-batches
  Percentiles ttft_ms, tpot_ms;
  int num_kv_blocks = 0;           ///< per engine group (SiDP: the least over its ranks)
  long long kv_capacity_tokens = 0;  ///< KV tokens over all groups (num_kv_blocks x block size x dp; SiDP: summed over ranks)
  double kv_peak_fraction = 0;     ///< most blocks in use at once / num_kv_blocks, max over groups
  double bubble_fraction = 0;      ///< 1 - stage busy time / (pp * elapsed), mean over groups (0 without PP, and for Seesaw, whose phases run different stage counts)
  double prefill_time_s = 0;       ///< virtual time of micro-batches with prefill tokens, summed over groups
  double decode_time_s = 0;        ///< ... of pure-decode micro-batches
  long long num_micro_batches = 0;
  long long num_preemptions = 0;
  std::uint64_t shift_switches = 0;  ///< Shift: config switches, over groups
  double shift_step_fraction = 0;    ///< Shift: share of micro-batches in the shift config
  /// Seesaw, summed over groups: cp <-> cd transitions, the engine threads'
  /// time in them (draining, reloading weights), of which reloading; KV bytes
  /// over the host links each way; the steps' wait for onboards; the most
  /// bytes the host KV buffer of one group held.
  std::uint64_t seesaw_transitions = 0;
  double seesaw_transition_s = 0, seesaw_reload_s = 0;
  double seesaw_offload_bytes = 0, seesaw_onboard_bytes = 0;
  double seesaw_onboard_wait_s = 0;
  double seesaw_host_peak_bytes = 0;
  /// Failures (DéjàVu): how many, the time the groups were down (detection
  /// + weight reload), positions computed again, KV bytes streamed to the
  /// replicas and restored from them, the requests the first failure hit,
  /// when it came, and their mean finish time over the same run without
  /// failures (failure_free_elapsed_s is that run's elapsed time).
  /// SiDP: WaS <-> CaS switches, the share of rank steps in CaS, and b*.
  long long sidp_switches = 0;
  double sidp_cas_step_fraction = 0;
  long long sidp_switch_batch = 0;
  int num_failures = 0;
  double failure_downtime_s = 0;
  long long failure_recomputed_tokens = 0;
  double replicated_bytes = 0, restored_bytes = 0;
  int num_failure_hit_requests = 0;
  double first_failure_s = 0;
  double failure_latency_ratio = 0;
  double failure_free_elapsed_s = 0;
  double sim_wall_s = 0;           ///< real seconds the simulation took (both runs)
};

/// Simulates `workload` under `strategy` on `cluster` for a model of
/// `config`. Errors: invalid_argument (an empty workload or a length < 1, a
/// strategy needing more devices than the cluster has, bad options or
/// policy names, a shift strategy without sp*tp > 1, Seesaw configs on
/// other devices or with Shift, a failure injection with no time or token,
/// times not ascending or a group that does not exist), internal (a
/// request that did not end with exactly its tokens: an engine bug), out_of_memory (the
/// weights of a rank do not fit its device, or the KV left cannot hold the
/// longest request), engine errors.
[[nodiscard]] Result<SimResult> simulate(const model::ModelConfig& config, const ClusterSpec& cluster,
                                         const Strategy& strategy, const std::vector<SimRequest>& workload,
                                         const SimOptions& options = {});

/// KV blocks one engine group of `pc` (dp ignored) gets on `cluster`'s
/// device: the least over its ranks of (usable memory - the rank's weight
/// share - the activation workspace) / the rank's bytes per KV block.
/// Errors: out_of_memory naming the sizes.
[[nodiscard]] Result<int> kv_blocks_per_group(const model::ModelConfig& config, const ClusterSpec& cluster,
                                              const engine::ParallelConfig& pc, const SimOptions& options);

/// SiDP WaS (seed 002 §4.1) on devices sharing one memory bus (CPU
/// devices): the time, ms, that the copies of one step's weight fetches
/// take when made by cores. Each of the group's `num_ranks` ranks copies
/// its `fetched_layers` non-owned FFN layers (model.ffn_layer_bytes() each)
/// at once, sharing the machine's copy rate (host_link_bw_bytes_per_s, a
/// measured memcpy on CPU devices). The step gains
/// was_copy_exposed_at(device, rows) of it (sim/hardware_spec.hpp). 0 on
/// other devices: a GPU's copy engine makes the fetch while the SMs compute,
/// so only the link time (T_fetch) can hold the step.
[[nodiscard]] double sidp_was_copy_ms(const DeviceSpec& device, const sim::CostModel& model, int num_ranks,
                                      int fetched_layers);

/// `num` requests of `input_len` / `output_len` tokens (bench's workload).
[[nodiscard]] std::vector<SimRequest> fixed_workload(int num, int input_len, int output_len);

}  // namespace shardline::sim
