#pragma once
/// \file
/// An engine group: the ranks that together hold one model replica under a
/// ParallelConfig (TP x SP x PP), driven by the scheduler of rank 0.
///
/// Rank 0 (the driver: stage 0, sp_rank 0, tp_rank 0) runs the engine's
/// scheduler and is the group's ModelExecutor. For each micro-batch it sends
/// the step metadata (engine/group/step_codec.hpp) to every other rank first
/// (gLLM, seed 004 §3.3), then runs its own shard of stage 0. Every other
/// rank runs a ShardWorker loop: metadata in, activations from the previous
/// stage in (stage > 0), its shard, activations out to the same (sp, tp)
/// coordinate of the next stage; the last stage's (0, 0) rank sends the
/// logits back to the driver. With PP the driver can submit up to pp
/// micro-batches before collecting the first (asynchronous pipeline): stage s
/// works on micro-batch i while stage s+1 works on i-1.
///
/// All traffic goes over the group's communicators (any backend: in-process
/// threads, TCP processes); a dead or silent peer turns into an io error
/// within the communicator timeout.
///
/// Seesaw (seed 000 §4.1, dynamic model re-sharding): a group may hold a
/// second config cd (decode) beside its own cp (prefill) over the same
/// devices: device d is group rank d in both, and every rank holds a shard
/// of each (own packed weights; one KV memory per device, which each config
/// lays out its own way: ShardRunner::create_on_kv_memory). The header
/// kind tells each rank which shard runs a step; use_step_config() switches
/// between phases, with nothing in flight. No KV crosses a switch on the
/// devices: the engine offloads it to its host buffer under one config and
/// restores it under the other (engine/kv_cache_io.hpp), which re-shards it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/inproc.hpp"
#include "comm/paced.hpp"
#include "common/result.hpp"
#include "engine/group/group_kv.hpp"
#include "engine/group/parallel_config.hpp"
#include "engine/group/step_config_switch.hpp"
#include "engine/group/step_control.hpp"
#include "engine/policies/shift_policy.hpp"
#include "model/executor.hpp"
#include "model/shard_runner.hpp"

namespace shardline::engine {

/// Seesaw (seed 000 §4.1): what each rank does with its weights at a switch
/// between cp and cd.
enum class ReshardWeights {
  resident,  ///< "resident": both shards stay packed (memory of both, no work at a switch)
  reload,    ///< "reload": the inactive shard is freed and repacked from host memory at each switch
};
/// "resident" / "reload".
[[nodiscard]] const char* to_string(ReshardWeights weights) noexcept;
/// Parses to_string()'s names. Errors: invalid_argument naming the text.
[[nodiscard]] Result<ReshardWeights> parse_reshard_weights(std::string_view text);

/// Seesaw: checks that `cd` can be the decode config of a group whose own
/// config is `cp`: one group (dp = 1) on the same number of devices.
/// Errors: invalid_argument naming both configs.
[[nodiscard]] Status check_decode_config(const ParallelConfig& cp, const ParallelConfig& cd);

/// Seesaw's second config of a group.
struct SeesawGroupOptions {
  ParallelConfig decode;  ///< cd: the prefill config's group size, dp = 1
  ReshardWeights weights = ReshardWeights::resident;
};

/// The communicators of one rank of a group.
struct GroupComms {
  std::unique_ptr<comm::Communicator> world;  ///< all group_size ranks
  std::unique_ptr<comm::Communicator> tp;     ///< this stage's ranks with this sp_rank (null when tp == 1)
  std::unique_ptr<comm::Communicator> sp;     ///< this stage's ranks with this tp_rank (null when sp == 1)
  /// Shift Parallelism: the shift config's TP group over all sp*tp ranks, in
  /// the §3.3.1 order (this rank is shift_spec_of(...).tp_rank there); null
  /// without a shift config.
  std::unique_ptr<comm::Communicator> shift_tp;
  /// Seesaw: this rank's TP and SP groups under the decode config cd (null
  /// when cd has tp == 1 / sp == 1, or without a decode config).
  std::unique_ptr<comm::Communicator> decode_tp;
  std::unique_ptr<comm::Communicator> decode_sp;
  [[nodiscard]] model::ShardComms shard_comms() const { return {tp.get(), sp.get()}; }
  [[nodiscard]] model::ShardComms shift_shard_comms() const { return {shift_tp.get(), nullptr}; }
  [[nodiscard]] model::ShardComms decode_shard_comms() const { return {decode_tp.get(), decode_sp.get()}; }
};

/// Seesaw: one rank's shard of the decode config cd.
struct DecodeShard {
  ParallelConfig pc;                           ///< cd: same group size as the group's own config, dp = 1
  std::unique_ptr<model::ShardRunner> runner;  ///< shard_spec_of(pc, rank): own weights, the device's KV memory
  ReshardWeights weights = ReshardWeights::resident;
};

/// In-process communicators for every rank of a group ([group_size], index =
/// group rank), plus the groups so tests can mark a rank dead.
struct InProcGroupComms {
  std::vector<GroupComms> ranks;
  std::vector<std::shared_ptr<comm::InProcGroup>> groups;  ///< world first, then TP and SP groups
  /// [group_size]: (index into groups, rank there) of every group a rank is in.
  std::vector<std::vector<std::pair<int, int>>> memberships;
  /// Marks `group_rank` dead in every group it belongs to.
  [[nodiscard]] Status mark_dead(int group_rank);
};
/// With `shift`, also the shift config's TP group (GroupComms::shift_tp);
/// with `decode` (Seesaw's cd, same group size), its TP and SP groups
/// (GroupComms::decode_tp / decode_sp). The world is shared. With `link`
/// (an emulated interconnect of group_size devices, comm/paced.hpp), every
/// communicator is a PacedCommunicator on its members' device ports, its
/// collectives paced too: PP's activation sends and TP / SP collectives then
/// cost what the link would. Errors: invalid_argument (a decode config
/// that does not fit, a link of another size).
[[nodiscard]] Result<InProcGroupComms> make_inproc_group_comms(const ParallelConfig& pc, bool shift = false,
                                                               const ParallelConfig* decode = nullptr,
                                                               std::shared_ptr<comm::LinkModel> link = nullptr);

/// The shard spec of `group_rank` under `pc`.
[[nodiscard]] model::ShardSpec shard_spec_of(const ParallelConfig& pc, int group_rank);

/// Shift Parallelism (seed 001 §3.3.1): the shard spec of `group_rank` in
/// the shift config TP' = sp*tp (pp = 1). Device (sp_rank s, tp_rank t)
/// attends query-head block t*sp + s in the base config (Ulysses splits
/// each TP rank's heads over its SP group), so it is TP' rank t*sp + s: the
/// paper's SP_TP order, with which both configs attend the same KV heads in
/// the same local slots and no KV moves at a shift.
[[nodiscard]] model::ShardSpec shift_spec_of(const ParallelConfig& pc, int group_rank);
/// The group ranks of the shift TP group in TP' rank order ([sp*tp]).
[[nodiscard]] std::vector<int> shift_group_ranks(const ParallelConfig& pc);

/// The loop of a rank other than 0. Not thread-safe; serve() runs on the rank's thread.
class ShardWorker {
 public:
  /// `num_threads` > 0 sets the OpenMP threads of the serving thread.
  /// `decode`: the rank's shard of Seesaw's decode config (runs kind-3 steps).
  ShardWorker(ParallelConfig pc, int group_rank, std::unique_ptr<model::ShardRunner> runner, GroupComms comms,
              int num_threads, std::unique_ptr<model::ShardRunner> shift_runner = nullptr,
              std::optional<DecodeShard> decode = std::nullopt);
  /// Serves steps until the driver sends shutdown (ok) or a step fails (its
  /// error; the rank should then be treated as dead). While idle it waits for
  /// metadata without a time limit; a dead driver ends the wait with io.
  [[nodiscard]] Status serve();
  /// Milliseconds spent computing (stage + logits) so far.
  [[nodiscard]] double busy_ms() const { return busy_us_.load() / 1000.0; }
  [[nodiscard]] model::ShardRunner& runner() { return *runner_; }
  /// Its shard of the shift config (null without one).
  [[nodiscard]] model::ShardRunner* shift_runner() { return shift_runner_.get(); }
  /// Its shard of Seesaw's decode config (null without one).
  [[nodiscard]] model::ShardRunner* decode_runner() { return decode_ ? decode_->runner.get() : nullptr; }

 private:
  ParallelConfig pc_;
  int rank_;
  RankCoord coord_;
  std::unique_ptr<model::ShardRunner> runner_;
  GroupComms comms_;
  int num_threads_;
  std::unique_ptr<model::ShardRunner> shift_runner_;  ///< shares runner_'s KV cache; declared after it
  std::optional<DecodeShard> decode_;
  RankCoord decode_coord_;  ///< this rank under decode_->pc
  StepConfigSwitch switch_;  ///< the phase's config (the last switch message's); step kinds
  std::atomic<std::int64_t> busy_us_{0};
};

/// Rank 0 of a group as the engine's ModelExecutor.
class ParallelExecutor final : public model::ModelExecutor {
 public:
  /// `runner` is rank 0's shard, `comms` its communicators.
  /// Errors: invalid_argument (runner or comms do not match pc).
  [[nodiscard]] static Result<std::unique_ptr<ParallelExecutor>> create(ParallelConfig pc,
                                                                         std::unique_ptr<model::ShardRunner> runner,
                                                                         GroupComms comms);
  ~ParallelExecutor() override;

  /// submit() then collect(); only when nothing is in flight.
  [[nodiscard]] Result<model::StepOutput> execute(const model::StepInput& input) override;
  /// The active config's pipeline depth.
  [[nodiscard]] int max_in_flight() const override { return active_config().pp; }
  [[nodiscard]] Status submit(const model::StepInput& input) override;
  [[nodiscard]] Result<model::StepOutput> collect() override;

  [[nodiscard]] int vocab_size() const override { return runner_->config().vocab_size; }
  [[nodiscard]] int num_kv_blocks() const override { return runner_->num_kv_blocks(); }
  [[nodiscard]] int block_size() const override { return runner_->block_size(); }

  /// Tells every other rank to stop serving (idempotent; also done by the destructor).
  [[nodiscard]] Status shutdown();

  /// The group's KV geometry (rank 0's runner's).
  [[nodiscard]] kvstore::KvModelShape kv_model_shape() const override { return runner_->kv_model_shape(); }
  /// Ranks in other processes: from now on kv_copier() copies sequences'
  /// KV through every rank's serving loop (engine/group/group_kv.hpp), from this
  /// thread or one other, concurrently with steps. Only for a world
  /// communicator whose send / recv may run on two threads at once (TCP);
  /// an in-process group copies through its views instead. Errors:
  /// invalid_argument (a group of one).
  [[nodiscard]] Status enable_kv_copier();
  [[nodiscard]] kvstore::KvCopier* kv_copier() override { return kv_copier_.get(); }
  [[nodiscard]] const ParallelConfig& parallel_config() const { return pc_; }
  [[nodiscard]] model::ShardRunner& runner() { return *runner_; }
  /// Milliseconds rank 0 spent computing its stage (and logits when pp == 1).
  [[nodiscard]] double busy_ms() const { return busy_us_ / 1000.0; }
  /// Bytes rank 0 sent in collectives and to the next stage during its last step.
  [[nodiscard]] std::uint64_t last_step_comm_bytes() const { return last_comm_bytes_; }
  /// Bytes of step metadata sent during the last step (to all ranks).
  [[nodiscard]] std::uint64_t last_step_meta_bytes() const { return last_meta_bytes_; }

  /// Shift Parallelism: from now on each step runs in the config `policy`
  /// picks; `shift_runner` is rank 0's shard of the shift config (TP' rank
  /// 0, sharing this runner's KV cache). Errors: invalid_argument (pp > 1,
  /// a group of one device, a runner that is not TP' rank 0 of sp*tp).
  [[nodiscard]] Status set_shift(std::unique_ptr<model::ShardRunner> shift_runner, ShiftPolicy policy);
  /// Replaces the policy (e.g. a job's threshold); between steps only.
  [[nodiscard]] Status set_shift_policy(ShiftPolicy policy);
  [[nodiscard]] bool has_shift() const { return shift_runner_ != nullptr; }
  [[nodiscard]] ShiftStats shift_stats() const { return switch_.shift_stats(); }
  /// The config the last step ran in.
  [[nodiscard]] ShiftMode last_step_mode() const { return switch_.last_shift_mode(); }
  /// Rank 0's shift runner (null without a shift config).
  [[nodiscard]] model::ShardRunner* shift_runner() { return shift_runner_.get(); }

  /// Seesaw (seed 000 §4.1): adds the decode config cd; `decode.runner` is
  /// rank 0's cd shard (own weights, rank 0's KV memory). The group's own config is
  /// cp and stays active until use_step_config(decode). Errors:
  /// invalid_argument (a shift config, cd of another group size or dp != 1,
  /// a runner that is not rank 0 of cd).
  [[nodiscard]] Status set_decode_config(DecodeShard decode);
  [[nodiscard]] bool has_step_configs() const override { return decode_.has_value(); }
  /// Switches between cp and cd: tells every rank (kind 4), which under
  /// `reload` frees its outgoing shard's packed weights and packs the
  /// incoming one, does the same on rank 0 and waits for every rank's
  /// acknowledgement. Only with nothing in flight (invalid_argument); io
  /// from a dead rank. A switch to the active config does nothing.
  [[nodiscard]] Status use_step_config(model::StepConfig config) override;
  /// Milliseconds the slowest rank spent re-sharding weights at the last
  /// switch (0 with resident weights).
  [[nodiscard]] double last_reshard_ms() const { return last_reshard_ms_; }
  /// The config the next step runs in (cp unless cd is active).
  [[nodiscard]] const ParallelConfig& active_config() const { return switch_.decode_active() ? decode_->pc : pc_; }
  [[nodiscard]] model::StepConfig step_config() const { return switch_.phase(); }
  /// Rank 0's cd shard (null without a decode config).
  [[nodiscard]] model::ShardRunner* decode_runner() { return decode_ ? decode_->runner.get() : nullptr; }
  /// Steps submitted in `config` so far (all in prefill without a decode config).
  [[nodiscard]] std::uint64_t num_steps_in(model::StepConfig config) const {
    return switch_.num_steps_in(config);
  }

 private:
  struct InFlight {
    int num_logits = 0;
    bool ready = false;  ///< pp == 1: logits computed at submit
    model::StepOutput output;
  };
  ParallelExecutor(ParallelConfig pc, std::unique_ptr<model::ShardRunner> runner, GroupComms comms);

  ParallelConfig pc_;
  std::unique_ptr<model::ShardRunner> runner_;
  GroupComms comms_;
  std::deque<InFlight> in_flight_;
  bool shut_down_ = false;
  std::int64_t busy_us_ = 0;
  std::uint64_t last_comm_bytes_ = 0;
  std::uint64_t last_meta_bytes_ = 0;
  std::unique_ptr<model::ShardRunner> shift_runner_;  ///< shares runner_'s KV cache; declared after it
  std::optional<DecodeShard> decode_;
  /// Which config each step runs in: Shift's per-step choice and Seesaw's
  /// phase (cp / cd), and their counts.
  StepConfigSwitch switch_;
  double last_reshard_ms_ = 0;
  /// Held while a header and its body go out, so the KV copier's requests
  /// (another thread) never interleave with a step's.
  std::mutex meta_mu_;
  std::unique_ptr<GroupKvCopier> kv_copier_;
};

/// Shift Parallelism on an engine group (seed 001): the base config is the
/// group's `--parallel` SP×TP, the shift config TP over the same devices.
struct ShiftOptions {
  ShiftPolicyOptions policy;
};

/// A whole engine group inside this process: rank 0 is the executor (driven
/// by the caller's thread), ranks 1.. serve on their own threads. The group
/// is itself the engine's ModelExecutor: every step goes to rank 0's
/// ParallelExecutor.
class InProcEngineGroup final : public model::ModelExecutor {
 public:
  /// Builds every rank's shard of `weights` under `pc` (pc.dp must be 1: one
  /// group is one replica). options.num_threads = OpenMP threads per rank
  /// (0: cores / group_size, at least 1). Errors: invalid_argument (config not
  /// shardable, see model::check_shardable), out_of_memory.
  /// With `shift`, every rank also holds its shard of the shift config TP'
  /// = sp*tp (own packed weights, the base runner's KV cache) and each step
  /// runs in the config the shift policy picks; pp must be 1 and the model
  /// shardable over sp*tp TP ranks (invalid_argument otherwise).
  /// With `seesaw` (Seesaw's cd), every rank also holds its shard of cd
  /// (own weights; its cache, of the same num_kv_blocks, in the same KV
  /// memory as the rank's pc cache); steps run in
  /// pc until use_step_config(decode). With `reload` weights the cd shards
  /// start released. cd must have pc's group size, dp = 1, and shard the
  /// model; not with `shift` (invalid_argument).
  /// With `link`, the group's devices talk over an emulated interconnect
  /// (make_inproc_group_comms): pipeline sends and TP / SP collectives are
  /// paced to it (invalid_argument for a bad spec).
  [[nodiscard]] static Result<std::unique_ptr<InProcEngineGroup>> create(
      std::shared_ptr<const model::ModelWeights> weights, ParallelConfig pc, model::CpuRunnerOptions options,
      std::optional<ShiftOptions> shift = std::nullopt, std::optional<SeesawGroupOptions> seesaw = std::nullopt,
      std::optional<comm::LinkSpec> link = std::nullopt);
  ~InProcEngineGroup() override;
  InProcEngineGroup(const InProcEngineGroup&) = delete;
  InProcEngineGroup& operator=(const InProcEngineGroup&) = delete;

  // model::ModelExecutor, forwarded to rank 0's ParallelExecutor.
  [[nodiscard]] Result<model::StepOutput> execute(const model::StepInput& input) override {
    return executor_->execute(input);
  }
  [[nodiscard]] int max_in_flight() const override { return executor_->max_in_flight(); }
  [[nodiscard]] Status submit(const model::StepInput& input) override { return executor_->submit(input); }
  [[nodiscard]] Result<model::StepOutput> collect() override { return executor_->collect(); }
  [[nodiscard]] int vocab_size() const override { return executor_->vocab_size(); }
  [[nodiscard]] int num_kv_blocks() const override { return executor_->num_kv_blocks(); }
  [[nodiscard]] int block_size() const override { return executor_->block_size(); }
  [[nodiscard]] bool has_step_configs() const override { return executor_->has_step_configs(); }
  [[nodiscard]] Status use_step_config(model::StepConfig config) override {
    return executor_->use_step_config(config);
  }
  [[nodiscard]] kvstore::KvModelShape kv_model_shape() const override;
  /// Every rank's cache (they share this process), in group-rank order,
  /// under the active step config (Seesaw's cd caches while it is active).
  [[nodiscard]] std::vector<kvstore::KvCacheView> kv_cache_views() override;
  /// The same caches as the shift config's runners see them (empty without
  /// a shift config): the same memory and layout as kv_cache_views().
  [[nodiscard]] std::vector<kvstore::KvCacheView> shift_kv_cache_views();

  [[nodiscard]] ParallelExecutor& executor() { return *executor_; }
  [[nodiscard]] const ParallelConfig& parallel_config() const { return pc_; }
  /// Busy milliseconds of the (sp 0, tp 0) rank of each stage: [pp].
  [[nodiscard]] std::vector<double> stage_busy_ms() const;
  /// Simulates the death of `group_rank` (> 0): its communicators fail, its
  /// peers' calls fail with io.
  [[nodiscard]] Status kill_rank(int group_rank);
  /// The error a rank's loop ended with (ok while serving or after a clean stop).
  [[nodiscard]] Status rank_status(int group_rank) const;
  /// Packed weight bytes every rank holds now, over all its configs'
  /// shards ([group_size], group-rank order).
  [[nodiscard]] std::vector<std::size_t> packed_weight_bytes_per_rank();
  /// Per-rank OpenMP threads in use.
  [[nodiscard]] int threads_per_rank() const { return threads_per_rank_; }
  /// The emulated interconnect of the group's devices (null without one).
  [[nodiscard]] const std::shared_ptr<comm::LinkModel>& link() const { return link_; }

 private:
  InProcEngineGroup() = default;
  ParallelConfig pc_;
  int threads_per_rank_ = 1;
  InProcGroupComms comms_;  // keeps the groups alive
  std::shared_ptr<comm::LinkModel> link_;  // shared by every paced communicator of comms_
  std::unique_ptr<ParallelExecutor> executor_;
  std::vector<std::unique_ptr<ShardWorker>> workers_;  // [group_size - 1], rank r at r - 1
  std::vector<std::thread> threads_;
  mutable std::mutex status_mu_;
  std::vector<Status> statuses_;  // [group_size], guarded by status_mu_
};

}  // namespace shardline::engine
