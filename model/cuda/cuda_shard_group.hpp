#pragma once
/// \file
/// Tensor-, sequence- and pipeline-parallel CUDA runners in one process as
/// one executor (issue 41, items 1-3; ranks sharing one GPU): tp x sp x pp
/// CudaModelRunners, group rank r = (stage * sp + sp_rank) * tp + tp_rank
/// (engine::rank_coord's order) holding its ShardSpec's share, joined by
/// InProcDeviceCommunicators: a TP group per (stage, sp_rank) (o_proj / down
/// all-reduces, the logits all-gather), an SP group per (stage, tp_rank)
/// (Ulysses' all-to-alls, the residual's all-gather) and a PP group per
/// (sp_rank, tp_rank) (the residual from stage s to s + 1, a device-to-device
/// copy).
///
/// Every rank has a thread of its own that runs the submitted steps in
/// order. submit() hands every rank the same StepInput (a copy): the stages
/// run one after another as their residuals arrive, and with pp > 1 up to pp
/// micro-batches are in flight (gLLM / the CPU group's asynchronous
/// pipeline: stage s works on micro-batch i while stage s + 1 works on
/// i - 1; max_in_flight() = pp). collect() waits for the oldest step on
/// every rank, checks that the last stage's ranks agree (the same sampled
/// ids, the same logits, bit for bit: each gathers the whole logits) and
/// returns the last stage's output.
///
/// A rank whose step fails is marked dead in its host groups, so that its
/// peers' collectives and receives fail at once instead of waiting for the
/// timeout; the step fails, and the group is broken from then on (a
/// collective may have completed on some ranks only): later steps fail at
/// once, as an in-process CPU engine group does.
///
/// Shift Parallelism (seed 001 §3.3; issue 41 item 5), with a ShiftChooser
/// and pp = 1: every rank also holds its shard of the shift config TP' =
/// sp x tp over the same ranks, as TP' rank tp_rank * sp + sp_rank (the
/// §3.3.1 order, engine::shift_spec_of): then it attends the same query
/// heads and KV heads in the same local slots as in the base config, so its
/// shift runner works on the base runner's KV cache (CudaRunnerOptions::
/// kv_memory) and no KV moves at a shift. The chooser picks each step's
/// config (the engine's ShiftPolicy: small decode steps in TP', large ones
/// in the base SP x TP); every rank runs the step in that config.
///
/// Seesaw (seed 000 §4.1, dynamic re-sharding; issue 41 item 4), with a
/// decode config cd of the same group size: every rank also holds its shard
/// of cd (own weights, resident), and its two caches, cp's and cd's, lay out
/// one device allocation of the larger one's size each their own way (the
/// CPU group's KV memory). use_step_config() switches between them; the
/// engine moves every sequence's KV through its host buffer between the
/// phases (KvCacheIo's mover through kv_copier(), which follows the active
/// config), which re-shards it.
///
/// Ranks on distinct GPUs (`devices`): a TP / SP / PP group whose ranks each
/// have a GPU of their own talks over NCCL (comm/nccl.hpp; a collective
/// waits on the communicator's stream, as the in-process one does), one
/// whose ranks share a GPU over InProcDeviceCommunicators.
///
/// Seesaw's weights are both configs' resident, or (`reload_weights`) the
/// active one's only, the other's uploaded again at each switch from the
/// host copy of the model.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "common/result.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/executor.hpp"
#include "model/weights.hpp"

namespace shardline::model {

/// The sizes of one parallel config of a group (dp is the worker count, not
/// the group's).
struct ShardDims {
  int tp = 1;
  int pp = 1;
  int sp = 1;
  [[nodiscard]] int size() const noexcept { return tp * pp * sp; }
  bool operator==(const ShardDims&) const = default;
};

class CudaShardGroup final : public ModelExecutor {
 public:
  /// Shift Parallelism: true when a step is to run in the shift config.
  /// Called once per step, on the caller's thread.
  using ShiftChooser = std::function<bool(const StepInput& input)>;

  /// tp x sp x pp ranks (at least 2) on CUDA device `options.device_index`,
  /// each a runner of `options` (num_kv_blocks blocks of its own KV heads in
  /// its stage's layers). Runners are created one after another on this
  /// thread. Errors: what CudaModelRunner::create returns (a model the
  /// config does not split, a device that is missing or too small);
  /// invalid_argument for a size < 1 or a group of one rank. With `shift`
  /// (see the file comment) every rank also builds its shift runner on its
  /// base runner's KV cache; invalid_argument with pp > 1, or a model the
  /// shift config (tp' = sp x tp) does not split.
  /// With `decode` (Seesaw, seed 000 §4.1; see the file comment) every rank
  /// also holds its shard of that config over the same ranks, and each
  /// rank's two caches share one device allocation of the larger one's
  /// size; steps run in this config until use_step_config(decode).
  /// invalid_argument for a decode config of another size, or with `shift`.
  /// `devices`: group rank r's CUDA device (empty: every rank on
  /// options.device_index). Each TP, SP, PP (and shift) group's ranks share
  /// one GPU (in-process device communicators) or each have their own
  /// (NCCL); unsupported for a group that mixes the two, or for distinct
  /// GPUs without NCCL; invalid_argument for a list of another size.
  /// `reload_weights` (Seesaw's `--reshard-weights reload`, with `decode`):
  /// only the active config's weights are on the GPUs; use_step_config frees
  /// the outgoing config's and uploads the incoming one's from `weights`,
  /// which must keep its matrices in host memory. invalid_argument without
  /// a decode config.
  [[nodiscard]] static Result<std::unique_ptr<CudaShardGroup>> create(std::shared_ptr<const ModelWeights> weights,
                                                                      const CudaRunnerOptions& options, int tp,
                                                                      int pp = 1, int sp = 1,
                                                                      ShiftChooser shift = {},
                                                                      std::optional<ShardDims> decode = std::nullopt,
                                                                      std::vector<int> devices = {},
                                                                      bool reload_weights = false);
  /// Stops the rank threads, then frees the runners and communicators.
  ~CudaShardGroup() override;
  CudaShardGroup(const CudaShardGroup&) = delete;
  CudaShardGroup& operator=(const CudaShardGroup&) = delete;

  /// One step on every rank, in the active config: submit() then collect(),
  /// with nothing in flight (invalid_argument otherwise). Errors: as collect.
  [[nodiscard]] Result<StepOutput> execute(const StepInput& input) override;
  /// The active config's pipeline depth (pp; 1 for a shift step's config).
  [[nodiscard]] int max_in_flight() const override;
  /// Hands a copy of `input` to every rank, in the config chosen now.
  /// Errors: io on a broken group; invalid_argument with max_in_flight()
  /// steps in flight already.
  [[nodiscard]] Status submit(const StepInput& input) override;
  /// The oldest submitted step's output. Errors: the first failing rank's
  /// error (then the group is broken); internal when the last stage's ranks
  /// disagree (a bug); invalid_argument with nothing in flight.
  [[nodiscard]] Result<StepOutput> collect() override;
  /// Most steps that were in flight at once so far.
  [[nodiscard]] int max_steps_in_flight_seen() const noexcept { return max_seen_in_flight_; }
  [[nodiscard]] int vocab_size() const override { return base_.runners[0]->vocab_size(); }
  [[nodiscard]] int num_kv_blocks() const override { return base_.runners[0]->num_kv_blocks(); }
  [[nodiscard]] int block_size() const override { return base_.runners[0]->block_size(); }
  [[nodiscard]] bool samples_on_device() const override { return true; }
  [[nodiscard]] kvstore::KvModelShape kv_model_shape() const override { return base_.runners[0]->kv_model_shape(); }
  /// DéjàVu on CUDA: every rank's KV cache of the active config through one
  /// CudaKvCopier per config, made by create() (a (layer, head) held by
  /// several ranks is read from the first and written to all); the pointer
  /// stays the same across Seesaw's switches. Null if a copier could not be
  /// made.
  [[nodiscard]] kvstore::KvCopier* kv_copier() override;
  /// Seesaw: whether the group holds a decode config.
  [[nodiscard]] bool has_step_configs() const override { return decode_ != nullptr; }
  /// Seesaw: runs the following steps in the prefill config (this group's
  /// own) or the decode config. The KV does not move here: the engine
  /// offloads it to its host buffer under one config and restores it under
  /// the other (the re-sharding happens in those copies). Under reload each
  /// rank's weights are swapped (the outgoing config's freed, the incoming
  /// one's uploaded). Errors: unsupported without a decode config;
  /// invalid_argument with steps in flight; a failed upload's error (the
  /// group is then broken).
  [[nodiscard]] Status use_step_config(StepConfig config) override;

  /// Seesaw's reload: weight swaps so far, and the milliseconds they took.
  [[nodiscard]] std::uint64_t weight_reloads() const noexcept { return reloads_; }
  [[nodiscard]] double weight_reload_ms() const noexcept { return reload_ms_; }
  [[nodiscard]] int tp() const noexcept { return base_.dims.tp; }
  [[nodiscard]] int pp() const noexcept { return base_.dims.pp; }
  [[nodiscard]] int sp() const noexcept { return base_.dims.sp; }
  [[nodiscard]] int group_size() const noexcept { return base_.dims.size(); }
  /// Group rank r's runner (r = (stage * sp + sp_rank) * tp + tp_rank).
  [[nodiscard]] const CudaModelRunner& rank(int r) const { return *base_.runners[static_cast<std::size_t>(r)]; }
  /// Seesaw: group rank r's runner of the decode config (null without one).
  [[nodiscard]] const CudaModelRunner* decode_rank(int r) const {
    return decode_ ? decode_->runners[static_cast<std::size_t>(r)].get() : nullptr;
  }
  /// Device bytes of weights over every rank and config (embeddings and
  /// norms are held by each rank of the stages that need them).
  [[nodiscard]] std::size_t weight_bytes() const;
  [[nodiscard]] bool broken() const noexcept { return broken_; }
  /// Shift: group rank r's shift runner (TP' rank tp_rank * sp + sp_rank);
  /// null without a shift config.
  [[nodiscard]] const CudaModelRunner* shift_rank(int r) const {
    return shift_runners_.empty() ? nullptr : shift_runners_[static_cast<std::size_t>(r)].get();
  }
  /// Steps run in the base, the shift and the (Seesaw) decode config so far.
  [[nodiscard]] std::uint64_t base_steps() const noexcept { return base_steps_; }
  [[nodiscard]] std::uint64_t shift_steps() const noexcept { return shift_steps_; }
  [[nodiscard]] std::uint64_t decode_steps() const noexcept { return decode_steps_; }

  /// Rank `rank`'s group and rank in it, for one kind of group.
  struct Place {
    int group = 0;
    int rank = 0;
  };

 private:
  /// One kind of group: [groups] in-process host groups and every rank's
  /// device communicator in its group (empty when the kind's size is 1).
  struct Kind {
    int size = 1;
    std::vector<std::shared_ptr<comm::InProcGroup>> groups;
    std::vector<std::unique_ptr<comm::Communicator>> comms;  ///< [group_size]; outlive the runners
  };
  /// One parallel config's ranks: their communicators, runners and copier.
  struct Shards {
    ShardDims dims;
    Kind tp_kind, sp_kind, pp_kind;
    std::vector<std::unique_ptr<CudaModelRunner>> runners;  ///< [group_size]
    std::unique_ptr<CudaKvCopier> copier;                   ///< made by create()
  };
  /// Which runners a step runs on.
  enum class Mode { base, shift, decode };
  class ActiveCopier;

  CudaShardGroup();
  /// Builds `shards`' communicators and runners (on `kv_memory[r]` when given).
  /// Rank r's runner is on devices[r].
  [[nodiscard]] static Status build(Shards& shards, const std::shared_ptr<const ModelWeights>& weights,
                                    const CudaRunnerOptions& options, const std::vector<int>& devices,
                                    const std::vector<void*>& kv_memory,
                                    const std::vector<std::size_t>& kv_memory_bytes);
  /// Builds every rank's shift runner (after the base runners).
  [[nodiscard]] Status make_shift_runners(const std::shared_ptr<const ModelWeights>& weights,
                                          const CudaRunnerOptions& options);
  /// Seesaw: allocates each rank's KV memory for both configs, then builds both.
  [[nodiscard]] Status build_pair(const std::shared_ptr<const ModelWeights>& weights,
                                  const CudaRunnerOptions& options);
  /// Rank `rank`'s thread: runs every submitted step in order.
  void serve(int rank);
  /// Rank `rank`'s step in `mode`; on a failure marks it dead in its host groups.
  Result<StepOutput> run_rank(int rank, const StepInput& input, Mode mode);
  [[nodiscard]] Shards& shards_of(Mode mode) { return mode == Mode::decode ? *decode_ : base_; }
  /// Makes `shards`' copier over its runners' caches (left null if a copy
  /// stream cannot be made: then kv_copier() is null).
  void make_copier(Shards& shards);
  /// The active config's copier.
  [[nodiscard]] CudaKvCopier* active_copier();

  std::vector<int> devices_;  ///< [group_size] each rank's CUDA device
  bool reload_weights_ = false;                       ///< Seesaw's reload (see create)
  std::shared_ptr<const ModelWeights> host_weights_;  ///< reload: the host copy the uploads read
  double reload_ms_ = 0;                              ///< reload: time in weight swaps so far
  std::uint64_t reloads_ = 0;
  Shards base_;
  std::unique_ptr<Shards> decode_;  ///< Seesaw's cd (null without one)
  std::vector<kernels::cuda::DeviceBuffer> kv_memory_;  ///< Seesaw: [group_size] caches shared by both configs
  Kind shift_kind_;
  ShiftChooser choose_shift_;
  std::vector<std::unique_ptr<CudaModelRunner>> shift_runners_;  ///< [group_size]; on base_'s KV caches
  std::vector<std::thread> threads_;                           ///< [group_size] one per rank
  std::atomic<bool> decode_active_{false};  ///< read by the KV mover's thread too
  std::unique_ptr<ActiveCopier> kv_copier_;

  /// A submitted step: every rank runs it, then collect() takes it.
  struct Job {
    std::uint64_t id = 0;
    StepInput input;  ///< the caller's, copied (its sampling rows point to the engine's sequences)
    Mode mode = Mode::base;
    std::vector<std::optional<Result<StepOutput>>> outputs;  ///< [group_size]
    int done = 0;  ///< ranks finished
  };

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;  ///< submitted, not collected, oldest first
  std::uint64_t next_job_id_ = 0;
  int max_seen_in_flight_ = 0;
  std::uint64_t base_steps_ = 0, shift_steps_ = 0, decode_steps_ = 0;
  bool stopping_ = false;
  bool broken_ = false;
};

}  // namespace shardline::model
