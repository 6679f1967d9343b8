#include "model/cuda/cuda_shard_group.hpp"

#include <cstring>
#include <utility>

#include "model/cuda/inproc_device_comm.hpp"

namespace shardline::model {

namespace {

/// Rank `rank` of `group` as a device communicator on `device`.
Result<std::unique_ptr<comm::Communicator>> device_comm(comm::InProcGroup& group, int rank, int device) {
  auto host = group.communicator(rank);
  if (!host) return std::move(host).error();
  auto dev = InProcDeviceCommunicator::create(std::move(host).value(), device);
  if (!dev) return std::move(dev).error();
  return std::unique_ptr<comm::Communicator>(std::move(dev).value());
}

}  // namespace

// Group rank r = (stage * sp + sp_rank) * tp + tp_rank.
CudaShardGroup::Place CudaShardGroup::tp_place(int r) const { return {r / tp_, r % tp_}; }
CudaShardGroup::Place CudaShardGroup::sp_place(int r) const {
  return {(r / (tp_ * sp_)) * tp_ + r % tp_, (r / tp_) % sp_};
}
CudaShardGroup::Place CudaShardGroup::pp_place(int r) const { return {r % (tp_ * sp_), r / (tp_ * sp_)}; }
CudaShardGroup::Place CudaShardGroup::shift_place(int r) const {
  return {0, tp_place(r).rank * sp_ + sp_place(r).rank};  // §3.3.1: TP rank t's SP rank s attends block t*sp + s
}

Status CudaShardGroup::make_comms(int device) {
  const int n = tp_ * sp_ * pp_;
  tp_kind_.size = tp_;
  sp_kind_.size = sp_;
  pp_kind_.size = pp_;
  shift_kind_.size = choose_shift_ ? n : 1;
  const std::pair<Kind*, Place (CudaShardGroup::*)(int) const> kinds[] = {
      {&tp_kind_, &CudaShardGroup::tp_place}, {&sp_kind_, &CudaShardGroup::sp_place},
      {&pp_kind_, &CudaShardGroup::pp_place}, {&shift_kind_, &CudaShardGroup::shift_place}};
  for (const auto& [kind, place] : kinds) {
    if (kind->size == 1) continue;
    for (int g = 0; g < n / kind->size; ++g) {
      auto group = comm::InProcGroup::create(kind->size);
      if (!group) return std::move(group).error();
      kind->groups.push_back(std::move(group).value());
    }
    for (int r = 0; r < n; ++r) {
      const Place p = (this->*place)(r);
      auto c = device_comm(*kind->groups[static_cast<std::size_t>(p.group)], p.rank, device);
      if (!c) return std::move(c).error();
      kind->comms.push_back(std::move(c).value());
    }
  }
  return Status::ok_status();
}

Status CudaShardGroup::make_shift_runners(const std::shared_ptr<const ModelWeights>& weights,
                                          const CudaRunnerOptions& options) {
  const int n = group_size();
  for (int r = 0; r < n; ++r) {
    ShardSpec spec;
    spec.tp = n;
    spec.tp_rank = shift_place(r).rank;
    ShardComms comms;
    comms.tp = shift_kind_.comms[static_cast<std::size_t>(r)].get();
    // The base runner's cache: the same heads in the same slots (§3.3.1).
    const DeviceKvCache base = runners_[static_cast<std::size_t>(r)]->device_kv_cache();
    CudaRunnerOptions so = options;
    so.kv_memory = base.data;
    so.kv_memory_bytes = runners_[static_cast<std::size_t>(r)]->kv_cache_bytes();
    auto runner = CudaModelRunner::create(weights, so, spec, comms);
    if (!runner) return runner.error();
    if ((*runner)->device_kv_cache().layout.kv_heads != base.layout.kv_heads)
      return make_error(ErrorCode::internal, "cuda shard group: shift rank " + std::to_string(spec.tp_rank) +
                                                 " attends other KV heads than base rank " + std::to_string(r));
    shift_runners_.push_back(std::move(runner).value());
  }
  return Status::ok_status();
}

Result<std::unique_ptr<CudaShardGroup>> CudaShardGroup::create(std::shared_ptr<const ModelWeights> weights,
                                                               const CudaRunnerOptions& options, int tp, int pp,
                                                               int sp, ShiftChooser shift) {
  if (tp < 1 || pp < 1 || sp < 1 || tp * pp * sp < 2)
    return make_error(ErrorCode::invalid_argument,
                      "cuda shard group: tp, pp and sp must be >= 1 and tp*pp*sp >= 2, got tp=" + std::to_string(tp) +
                          " pp=" + std::to_string(pp) + " sp=" + std::to_string(sp));
  if (shift && pp != 1)
    return make_error(ErrorCode::invalid_argument, "cuda shard group: Shift Parallelism needs pp = 1 (the shift config "
                                                   "is TP over the base config's sp x tp ranks), got pp=" +
                                                       std::to_string(pp));
  std::unique_ptr<CudaShardGroup> g(new CudaShardGroup());
  g->tp_ = tp;
  g->pp_ = pp;
  g->sp_ = sp;
  g->choose_shift_ = std::move(shift);
  if (Status s = g->make_comms(options.device_index); !s) return s.error();
  const int n = tp * sp * pp;
  const auto comm_of = [&](const Kind& k, int r) {
    return k.comms.empty() ? nullptr : k.comms[static_cast<std::size_t>(r)].get();
  };
  for (int r = 0; r < n; ++r) {
    ShardSpec spec;
    spec.tp = tp;
    spec.tp_rank = g->tp_place(r).rank;
    spec.sp = sp;
    spec.sp_rank = g->sp_place(r).rank;
    spec.pp = pp;
    spec.stage = g->pp_place(r).rank;
    ShardComms comms;
    comms.tp = comm_of(g->tp_kind_, r);
    comms.sp = comm_of(g->sp_kind_, r);
    comms.pp = comm_of(g->pp_kind_, r);
    auto runner = CudaModelRunner::create(weights, options, spec, comms);
    if (!runner) return std::move(runner).error();
    g->runners_.push_back(std::move(runner).value());
  }
  if (g->choose_shift_)
    if (Status s = g->make_shift_runners(weights, options); !s) return s.error();
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
  shift_runners_.clear();  // on the base runners' KV caches
  runners_.clear();
  shift_kind_.comms.clear();
  tp_kind_.comms.clear();
  sp_kind_.comms.clear();
  pp_kind_.comms.clear();
}

kvstore::KvCopier* CudaShardGroup::kv_copier() {
  if (!kv_copier_) {
    std::vector<DeviceKvCache> caches;
    for (const auto& r : runners_) caches.push_back(r->device_kv_cache());
    auto c = CudaKvCopier::create(kv_model_shape(), std::move(caches));
    if (c) kv_copier_ = std::move(c).value();
  }
  return kv_copier_.get();
}

std::size_t CudaShardGroup::weight_bytes() const {
  std::size_t total = 0;
  for (const auto& r : runners_) total += r->weight_bytes();
  return total;
}

Result<StepOutput> CudaShardGroup::run_rank(int rank, const StepInput& input, bool shift) {
  CudaModelRunner& runner =
      shift ? *shift_runners_[static_cast<std::size_t>(rank)] : *runners_[static_cast<std::size_t>(rank)];
  Result<StepOutput> out = runner.execute(input);
  if (!out) {
    if (shift) (void)shift_kind_.groups[0]->mark_dead(shift_place(rank).rank);
    // Its peers' collectives and receives fail now, not at the timeout.
    if (tp_ > 1) (void)tp_kind_.groups[static_cast<std::size_t>(tp_place(rank).group)]->mark_dead(tp_place(rank).rank);
    if (sp_ > 1) (void)sp_kind_.groups[static_cast<std::size_t>(sp_place(rank).group)]->mark_dead(sp_place(rank).rank);
    if (pp_ > 1) (void)pp_kind_.groups[static_cast<std::size_t>(pp_place(rank).group)]->mark_dead(pp_place(rank).rank);
  }
  return out;
}

void CudaShardGroup::serve(int rank) {
  std::uint64_t seen = 0;
  for (;;) {
    const StepInput* input = nullptr;
    bool shift = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || step_ > seen; });
      if (stopping_) return;
      seen = step_;
      input = input_;
      shift = step_shift_;
    }
    Result<StepOutput> out = run_rank(rank, *input, shift);
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
  const bool shift = choose_shift_ && choose_shift_(input);
  ++(shift ? shift_steps_ : base_steps_);
  std::uint64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    input_ = &input;
    step_shift_ = shift;
    step = ++step_;
  }
  cv_.notify_all();
  Result<StepOutput> mine = run_rank(0, input, shift);
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
  const std::size_t last = static_cast<std::size_t>(pp_ - 1) * static_cast<std::size_t>(tp_ * sp_);
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
