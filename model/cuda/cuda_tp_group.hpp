#pragma once
/// \file
/// Tensor-parallel CUDA runners in one process as one executor (issue 41,
/// items 1-3, ranks sharing one GPU): `tp` CudaModelRunners, rank r holding
/// ShardSpec{tp, r}'s share, joined by InProcDeviceCommunicators over one
/// in-process host group. Rank 0 runs on the caller's thread; ranks 1..tp-1
/// each have a thread of their own that waits for a step. execute() hands
/// every rank the same StepInput, waits for all of them, checks that they
/// agree (the same sampled ids, the same logits, bit for bit: every rank
/// gathers the whole logits) and returns rank 0's output.
///
/// A rank whose step fails is marked dead in the host group, so that its
/// peers' collectives fail at once instead of waiting for the timeout; the
/// step fails on every rank, and the group is broken from then on (a
/// collective may have completed on some ranks only): later steps fail at
/// once, as an in-process CPU engine group does.
///
/// Ranks on distinct GPUs (NCCL) are not built yet.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "common/result.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/executor.hpp"
#include "model/weights.hpp"

namespace shardline::model {

class CudaTpGroup final : public ModelExecutor {
 public:
  /// `tp` ranks (>= 2) on CUDA device `options.device_index`, each a runner
  /// of `options` (num_kv_blocks blocks of its own KV heads). Runners are
  /// created one after another on this thread. Errors: what
  /// CudaModelRunner::create returns (a model tp does not split, a device
  /// that is missing or too small), invalid_argument for tp < 2.
  [[nodiscard]] static Result<std::unique_ptr<CudaTpGroup>> create(std::shared_ptr<const ModelWeights> weights,
                                                                   const CudaRunnerOptions& options, int tp);
  /// Stops the rank threads, then frees the runners and communicators.
  ~CudaTpGroup() override;
  CudaTpGroup(const CudaTpGroup&) = delete;
  CudaTpGroup& operator=(const CudaTpGroup&) = delete;

  /// One step on every rank. Errors: the first failing rank's error (then
  /// the group is broken); internal when the ranks disagree (a bug); io on
  /// a broken group.
  [[nodiscard]] Result<StepOutput> execute(const StepInput& input) override;
  [[nodiscard]] int vocab_size() const override { return runners_[0]->vocab_size(); }
  [[nodiscard]] int num_kv_blocks() const override { return runners_[0]->num_kv_blocks(); }
  [[nodiscard]] int block_size() const override { return runners_[0]->block_size(); }
  [[nodiscard]] bool samples_on_device() const override { return true; }

  [[nodiscard]] int tp() const noexcept { return static_cast<int>(runners_.size()); }
  [[nodiscard]] const CudaModelRunner& rank(int r) const { return *runners_[static_cast<std::size_t>(r)]; }
  /// Device bytes of weights over every rank (embeddings and norms are held by each).
  [[nodiscard]] std::size_t weight_bytes() const;
  [[nodiscard]] bool broken() const noexcept { return broken_; }

 private:
  CudaTpGroup() = default;
  void serve(int rank);
  /// Rank `rank`'s step; on a failure marks it dead in the host group.
  Result<StepOutput> run_rank(int rank, const StepInput& input);

  std::shared_ptr<comm::InProcGroup> host_group_;
  std::vector<std::unique_ptr<comm::Communicator>> comms_;  // outlive the runners
  std::vector<std::unique_ptr<CudaModelRunner>> runners_;
  std::vector<std::thread> threads_;  // ranks 1..tp-1

  std::mutex mu_;
  std::condition_variable cv_;
  const StepInput* input_ = nullptr;  ///< the step in progress
  std::uint64_t step_ = 0;             ///< steps handed out
  std::vector<std::uint64_t> done_step_;              ///< [tp] the last step each rank finished
  std::vector<Result<StepOutput>> outputs_;           ///< [tp] their outputs
  bool stopping_ = false;
  bool broken_ = false;
};

}  // namespace shardline::model
