#include "model/cuda/cuda_tp_group.hpp"

#include <cstring>

#include "model/cuda/inproc_device_comm.hpp"

namespace shardline::model {

Result<std::unique_ptr<CudaTpGroup>> CudaTpGroup::create(std::shared_ptr<const ModelWeights> weights,
                                                         const CudaRunnerOptions& options, int tp) {
  if (tp < 2)
    return make_error(ErrorCode::invalid_argument, "cuda tp group: tp must be >= 2, got " + std::to_string(tp));
  std::unique_ptr<CudaTpGroup> g(new CudaTpGroup());
  auto group = comm::InProcGroup::create(tp);
  if (!group) return std::move(group).error();
  g->host_group_ = std::move(group).value();
  for (int r = 0; r < tp; ++r) {
    auto host = g->host_group_->communicator(r);
    if (!host) return std::move(host).error();
    auto dev = InProcDeviceCommunicator::create(std::move(host).value(), options.device_index);
    if (!dev) return std::move(dev).error();
    g->comms_.push_back(std::move(dev).value());
  }
  for (int r = 0; r < tp; ++r) {
    ShardSpec spec;
    spec.tp = tp;
    spec.tp_rank = r;
    const ShardComms comms{g->comms_[static_cast<std::size_t>(r)].get(), nullptr};
    auto runner = CudaModelRunner::create(weights, options, spec, comms);
    if (!runner) return std::move(runner).error();
    g->runners_.push_back(std::move(runner).value());
  }
  g->done_step_.assign(static_cast<std::size_t>(tp), 0);
  for (int r = 0; r < tp; ++r) g->outputs_.emplace_back(make_error(ErrorCode::internal, "cuda tp group: no step yet"));
  for (int r = 1; r < tp; ++r) g->threads_.emplace_back([p = g.get(), r] { p->serve(r); });
  return g;
}

CudaTpGroup::~CudaTpGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  runners_.clear();
  comms_.clear();
}

std::size_t CudaTpGroup::weight_bytes() const {
  std::size_t total = 0;
  for (const auto& r : runners_) total += r->weight_bytes();
  return total;
}

Result<StepOutput> CudaTpGroup::run_rank(int rank, const StepInput& input) {
  Result<StepOutput> out = runners_[static_cast<std::size_t>(rank)]->execute(input);
  if (!out) (void)host_group_->mark_dead(rank);  // its peers' collectives fail now, not at the timeout
  return out;
}

void CudaTpGroup::serve(int rank) {
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

Result<StepOutput> CudaTpGroup::execute(const StepInput& input) {
  if (broken_)
    return make_error(ErrorCode::io, "cuda tp group: a rank failed in an earlier step; the group must be rebuilt");
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
  const StepOutput& first = *outputs_[0];
  for (std::size_t r = 1; r < outputs_.size(); ++r) {
    const StepOutput& o = *outputs_[r];
    if (o.sampled_token_ids != first.sampled_token_ids || o.logits.size() != first.logits.size() ||
        std::memcmp(o.logits.data(), first.logits.data(), o.logits.size() * sizeof(float)) != 0) {
      broken_ = true;
      return make_error(ErrorCode::internal, "cuda tp group: rank " + std::to_string(r) +
                                                 " ended the step with other logits or ids than rank 0");
    }
  }
  return std::move(outputs_[0]);
}

}  // namespace shardline::model
