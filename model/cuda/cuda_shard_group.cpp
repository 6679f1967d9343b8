#include "model/cuda/cuda_shard_group.hpp"

#include <cstring>

#include "model/cuda/inproc_device_comm.hpp"

namespace shardline::model {

namespace {

/// In-process host groups, one per index, of `size` ranks each.
Result<std::vector<std::shared_ptr<comm::InProcGroup>>> host_groups(int count, int size) {
  std::vector<std::shared_ptr<comm::InProcGroup>> out;
  for (int i = 0; i < count; ++i) {
    auto g = comm::InProcGroup::create(size);
    if (!g) return std::move(g).error();
    out.push_back(std::move(g).value());
  }
  return out;
}

/// Rank `rank` of `group` as a device communicator on `device`.
Result<std::unique_ptr<comm::Communicator>> device_comm(comm::InProcGroup& group, int rank, int device) {
  auto host = group.communicator(rank);
  if (!host) return std::move(host).error();
  auto dev = InProcDeviceCommunicator::create(std::move(host).value(), device);
  if (!dev) return std::move(dev).error();
  return std::unique_ptr<comm::Communicator>(std::move(dev).value());
}

}  // namespace

Status CudaShardGroup::make_comms(int device) {
  const int n = tp_ * pp_;
  if (tp_ > 1) {
    auto groups = host_groups(pp_, tp_);
    if (!groups) return std::move(groups).error();
    tp_groups_ = std::move(groups).value();
  }
  if (pp_ > 1) {
    auto groups = host_groups(tp_, pp_);
    if (!groups) return std::move(groups).error();
    pp_groups_ = std::move(groups).value();
  }
  for (int r = 0; r < n; ++r) {
    const int stage = r / tp_;
    const int tp_rank = r % tp_;
    std::unique_ptr<comm::Communicator> tp, pp;
    if (tp_ > 1) {
      auto c = device_comm(*tp_groups_[static_cast<std::size_t>(stage)], tp_rank, device);
      if (!c) return std::move(c).error();
      tp = std::move(c).value();
    }
    if (pp_ > 1) {
      auto c = device_comm(*pp_groups_[static_cast<std::size_t>(tp_rank)], stage, device);
      if (!c) return std::move(c).error();
      pp = std::move(c).value();
    }
    tp_comms_.push_back(std::move(tp));
    pp_comms_.push_back(std::move(pp));
  }
  return Status::ok_status();
}

Result<std::unique_ptr<CudaShardGroup>> CudaShardGroup::create(std::shared_ptr<const ModelWeights> weights,
                                                               const CudaRunnerOptions& options, int tp, int pp) {
  if (tp < 1 || pp < 1 || tp * pp < 2)
    return make_error(ErrorCode::invalid_argument, "cuda shard group: tp and pp must be >= 1 and tp*pp >= 2, got tp=" +
                                                       std::to_string(tp) + " pp=" + std::to_string(pp));
  std::unique_ptr<CudaShardGroup> g(new CudaShardGroup());
  g->tp_ = tp;
  g->pp_ = pp;
  if (Status s = g->make_comms(options.device_index); !s) return s.error();
  const int n = tp * pp;
  for (int r = 0; r < n; ++r) {
    ShardSpec spec;
    spec.tp = tp;
    spec.tp_rank = r % tp;
    spec.pp = pp;
    spec.stage = r / tp;
    ShardComms comms;
    comms.tp = g->tp_comms_[static_cast<std::size_t>(r)].get();
    comms.pp = g->pp_comms_[static_cast<std::size_t>(r)].get();
    auto runner = CudaModelRunner::create(weights, options, spec, comms);
    if (!runner) return std::move(runner).error();
    g->runners_.push_back(std::move(runner).value());
  }
  g->done_step_.assign(static_cast<std::size_t>(n), 0);
  for (int r = 0; r < n; ++r)
    g->outputs_.emplace_back(make_error(ErrorCode::internal, "cuda shard group: no step yet"));
  for (int r = 1; r < n; ++r) g->threads_.emplace_back([p = g.get(), r] { p->serve(r); });
  return g;
}

CudaShardGroup::~CudaShardGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  runners_.clear();
  tp_comms_.clear();
  pp_comms_.clear();
}

std::size_t CudaShardGroup::weight_bytes() const {
  std::size_t total = 0;
  for (const auto& r : runners_) total += r->weight_bytes();
  return total;
}

Result<StepOutput> CudaShardGroup::run_rank(int rank, const StepInput& input) {
  Result<StepOutput> out = runners_[static_cast<std::size_t>(rank)]->execute(input);
  if (!out) {
    // Its peers' collectives and receives fail now, not at the timeout.
    if (tp_ > 1) (void)tp_groups_[static_cast<std::size_t>(rank / tp_)]->mark_dead(rank % tp_);
    if (pp_ > 1) (void)pp_groups_[static_cast<std::size_t>(rank % tp_)]->mark_dead(rank / tp_);
  }
  return out;
}

void CudaShardGroup::serve(int rank) {
  std::uint64_t seen = 0;
  for (;;) {
    const StepInput* input = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || step_ > seen; });
      if (stopping_) return;
      seen = step_;
      input = input_;
    }
    Result<StepOutput> out = run_rank(rank, *input);
    {
      std::lock_guard<std::mutex> lock(mu_);
      outputs_[static_cast<std::size_t>(rank)] = std::move(out);
      done_step_[static_cast<std::size_t>(rank)] = seen;
    }
    cv_.notify_all();
  }
}

Result<StepOutput> CudaShardGroup::execute(const StepInput& input) {
  if (broken_)
    return make_error(ErrorCode::io, "cuda shard group: a rank failed in an earlier step; the group must be rebuilt");
  std::uint64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    input_ = &input;
    step = ++step_;
  }
  cv_.notify_all();
  Result<StepOutput> mine = run_rank(0, input);
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      for (std::size_t r = 1; r < done_step_.size(); ++r)
        if (done_step_[r] != step) return false;
      return true;
    });
    outputs_[0] = std::move(mine);
    input_ = nullptr;
  }
  for (std::size_t r = 0; r < outputs_.size(); ++r)
    if (!outputs_[r]) {
      broken_ = true;
      return outputs_[r].error();
    }
  // The last stage's ranks hold the step's output; each gathered it whole.
  const std::size_t last = static_cast<std::size_t>(pp_ - 1) * static_cast<std::size_t>(tp_);
  const StepOutput& first = *outputs_[last];
  for (std::size_t r = last + 1; r < outputs_.size(); ++r) {
    const StepOutput& o = *outputs_[r];
    if (o.sampled_token_ids != first.sampled_token_ids || o.logits.size() != first.logits.size() ||
        std::memcmp(o.logits.data(), first.logits.data(), o.logits.size() * sizeof(float)) != 0) {
      broken_ = true;
      return make_error(ErrorCode::internal, "cuda shard group: rank " + std::to_string(r) +
                                                 " ended the step with other logits or ids than rank " +
                                                 std::to_string(last));
    }
  }
  return std::move(outputs_[last]);
}

}  // namespace shardline::model
