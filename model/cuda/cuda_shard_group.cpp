#include "model/cuda/cuda_shard_group.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <utility>

#include "model/cuda/inproc_device_comm.hpp"
#if SHARDLINE_HAVE_NCCL
#include "comm/nccl.hpp"
#endif

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

/// The device communicators of one group whose ranks are `devices` (rank i
/// on devices[i]), bootstrapped over `group`: InProcDeviceCommunicators when
/// every rank shares one GPU, NCCL when each has its own (NCCL refuses two
/// ranks on one GPU). NcclCommunicator::create is collective: every rank's
/// runs on a thread of its own. Errors: unsupported for a group that mixes
/// shared and distinct GPUs, or distinct GPUs in a build without NCCL; what
/// the communicators' create return.
Result<std::vector<std::unique_ptr<comm::Communicator>>> group_comms(comm::InProcGroup& group,
                                                                     const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  std::vector<std::unique_ptr<comm::Communicator>> out(static_cast<std::size_t>(n));
  const std::set<int> distinct(devices.begin(), devices.end());
  if (distinct.size() == 1) {
    for (int i = 0; i < n; ++i) {
      auto c = device_comm(group, i, devices[static_cast<std::size_t>(i)]);
      if (!c) return std::move(c).error();
      out[static_cast<std::size_t>(i)] = std::move(c).value();
    }
    return out;
  }
  std::string list;
  for (int d : devices) list += (list.empty() ? "cuda:" : ",") + std::to_string(d);
  if (static_cast<int>(distinct.size()) != n)
    return make_error(ErrorCode::unsupported, "cuda shard group: a group of ranks on " + list +
                                                  " mixes shared and distinct GPUs; its ranks must all share one "
                                                  "GPU or each have its own");
#if SHARDLINE_HAVE_NCCL
  std::vector<std::unique_ptr<comm::Communicator>> hosts;
  for (int i = 0; i < n; ++i) {
    auto h = group.communicator(i);
    if (!h) return std::move(h).error();
    hosts.push_back(std::move(h).value());
  }
  std::vector<std::optional<Error>> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      const auto k = static_cast<std::size_t>(i);
      auto c = comm::NcclCommunicator::create(*hosts[k], comm::NcclOptions{devices[k], true});
      if (c)
        out[k] = std::move(c).value();
      else
        errors[k] = std::move(c).error();
    });
  for (std::thread& t : threads) t.join();
  for (auto& e : errors)
    if (e) return make_error(e->code, "cuda shard group: NCCL over " + list + ": " + e->message);
  return out;
#else
  return make_error(ErrorCode::unsupported, "cuda shard group: ranks on distinct GPUs (" + list +
                                                ") talk over NCCL, and this build has no NCCL (nccl.h / libnccl "
                                                "were not found)");
#endif
}

// Group rank r = (stage * sp + sp_rank) * tp + tp_rank, in every config
// (model::shard_spec_at); each kind of group is numbered by the other two
// coordinates.
ShardSpec spec_of(const ShardDims& d, int r) { return shard_spec_at(d.tp, d.sp, d.pp, r); }
using Place = CudaShardGroup::Place;
Place tp_place(const ShardDims& d, int r) { return {r / d.tp, spec_of(d, r).tp_rank}; }
Place sp_place(const ShardDims& d, int r) {
  const ShardSpec s = spec_of(d, r);
  return {s.stage * d.tp + s.tp_rank, s.sp_rank};
}
Place pp_place(const ShardDims& d, int r) { return {r % (d.tp * d.sp), spec_of(d, r).stage}; }
/// §3.3.1 (model::shift_spec_at): one group of every rank.
Place shift_place(const ShardDims& d, int r) { return {0, shift_spec_at(d.tp, d.sp, r).tp_rank}; }

}  // namespace

/// kv_copier()'s answer: forwards to the active config's copier, so the
/// pointer the engine keeps stays valid across Seesaw's switches.
class CudaShardGroup::ActiveCopier final : public kvstore::KvCopier {
 public:
  explicit ActiveCopier(CudaShardGroup& group) : group_(group) {}
  [[nodiscard]] int num_devices() const override { return group_.group_size(); }
  [[nodiscard]] bool supports_streaming() const override { return true; }
  [[nodiscard]] Status copy_out(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                                std::span<std::byte> chunk) override {
    CudaKvCopier* c = group_.active_copier();
    if (c == nullptr) return make_error(ErrorCode::internal, "cuda shard group: no KV copier");
    return c->copy_out(block_table, range, chunk);
  }
  [[nodiscard]] Status copy_in(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                               std::span<const std::byte> chunk) override {
    CudaKvCopier* c = group_.active_copier();
    if (c == nullptr) return make_error(ErrorCode::internal, "cuda shard group: no KV copier");
    return c->copy_in(block_table, range, chunk);
  }
  [[nodiscard]] Status copy_out_batch(std::span<const kvstore::KvCopyItem> items,
                                      std::span<const std::span<std::byte>> chunks) override {
    CudaKvCopier* c = group_.active_copier();
    if (c == nullptr) return make_error(ErrorCode::internal, "cuda shard group: no KV copier");
    return c->copy_out_batch(items, chunks);
  }

 private:
  CudaShardGroup& group_;
};

CudaShardGroup::CudaShardGroup() = default;

Status CudaShardGroup::build(Shards& shards, const std::shared_ptr<const ModelWeights>& weights,
                             const CudaRunnerOptions& options, const std::vector<int>& devices,
                             const std::vector<void*>& kv_memory, const std::vector<std::size_t>& kv_memory_bytes) {
  const ShardDims d = shards.dims;
  const int n = d.size();
  shards.tp_kind.size = d.tp;
  shards.sp_kind.size = d.sp;
  shards.pp_kind.size = d.pp;
  const std::pair<Kind*, Place (*)(const ShardDims&, int)> kinds[] = {
      {&shards.tp_kind, &tp_place}, {&shards.sp_kind, &sp_place}, {&shards.pp_kind, &pp_place}};
  for (const auto& [kind, place] : kinds) {
    if (kind->size == 1) continue;
    const int num_groups = n / kind->size;
    std::vector<std::vector<int>> members(static_cast<std::size_t>(num_groups),
                                          std::vector<int>(static_cast<std::size_t>(kind->size)));
    for (int r = 0; r < n; ++r) {
      const Place p = place(d, r);
      members[static_cast<std::size_t>(p.group)][static_cast<std::size_t>(p.rank)] = r;
    }
    kind->comms.resize(static_cast<std::size_t>(n));
    for (int g = 0; g < num_groups; ++g) {
      auto group = comm::InProcGroup::create(kind->size);
      if (!group) return std::move(group).error();
      kind->groups.push_back(std::move(group).value());
      std::vector<int> devs;
      for (int r : members[static_cast<std::size_t>(g)]) devs.push_back(devices[static_cast<std::size_t>(r)]);
      auto comms = group_comms(*kind->groups.back(), devs);
      if (!comms) return std::move(comms).error();
      for (int i = 0; i < kind->size; ++i)
        kind->comms[static_cast<std::size_t>(members[static_cast<std::size_t>(g)][static_cast<std::size_t>(i)])] =
            std::move((*comms)[static_cast<std::size_t>(i)]);
    }
  }
  const auto comm_of = [](const Kind& k, int r) {
    return k.comms.empty() ? nullptr : k.comms[static_cast<std::size_t>(r)].get();
  };
  for (int r = 0; r < n; ++r) {
    ShardComms comms;
    comms.tp = comm_of(shards.tp_kind, r);
    comms.sp = comm_of(shards.sp_kind, r);
    comms.pp = comm_of(shards.pp_kind, r);
    CudaRunnerOptions o = options;
    o.device_index = devices[static_cast<std::size_t>(r)];
    if (!kv_memory.empty()) {
      o.kv_memory = kv_memory[static_cast<std::size_t>(r)];
      o.kv_memory_bytes = kv_memory_bytes[static_cast<std::size_t>(r)];
    }
    auto runner = CudaModelRunner::create(weights, o, spec_of(d, r), comms);
    if (!runner) return std::move(runner).error();
    shards.runners.push_back(std::move(runner).value());
  }
  return Status::ok_status();
}

Status CudaShardGroup::make_shift_runners(const std::shared_ptr<const ModelWeights>& weights,
                                          const CudaRunnerOptions& options) {
  const int n = group_size();
  shift_kind_.size = n;
  {
    auto group = comm::InProcGroup::create(n);
    if (!group) return std::move(group).error();
    shift_kind_.groups.push_back(std::move(group).value());
  }
  std::vector<int> devs(static_cast<std::size_t>(n));  // by TP' rank
  for (int r = 0; r < n; ++r)
    devs[static_cast<std::size_t>(shift_place(base_.dims, r).rank)] = devices_[static_cast<std::size_t>(r)];
  auto comms = group_comms(*shift_kind_.groups[0], devs);
  if (!comms) return std::move(comms).error();
  for (int r = 0; r < n; ++r)
    shift_kind_.comms.push_back(std::move((*comms)[static_cast<std::size_t>(shift_place(base_.dims, r).rank)]));
  for (int r = 0; r < n; ++r) {
    const ShardSpec spec = shift_spec_at(base_.dims.tp, base_.dims.sp, r);
    ShardComms comms;
    comms.tp = shift_kind_.comms[static_cast<std::size_t>(r)].get();
    // The base runner's cache: the same heads in the same slots (§3.3.1).
    const CudaModelRunner& base_runner = *base_.runners[static_cast<std::size_t>(r)];
    const DeviceKvCache base = base_runner.device_kv_cache();
    CudaRunnerOptions so = options;
    so.device_index = devices_[static_cast<std::size_t>(r)];
    so.kv_memory = base.data;
    so.kv_memory_bytes = base_runner.kv_cache_bytes();
    auto runner = CudaModelRunner::create(weights, so, spec, comms);
    if (!runner) return runner.error();
    if ((*runner)->device_kv_cache().layout.kv_heads != base.layout.kv_heads)
      return make_error(ErrorCode::internal, "cuda shard group: shift rank " + std::to_string(spec.tp_rank) +
                                                 " attends other KV heads than base rank " + std::to_string(r));
    shift_runners_.push_back(std::move(runner).value());
  }
  return Status::ok_status();
}

Status CudaShardGroup::build_pair(const std::shared_ptr<const ModelWeights>& weights,
                                  const CudaRunnerOptions& options) {
  const int n = group_size();
  std::vector<void*> memory;
  std::vector<std::size_t> bytes;
  for (int r = 0; r < n; ++r) {
    const std::size_t b = std::max(cuda_runner_kv_cache_bytes(weights->config, options, spec_of(base_.dims, r)),
                                   cuda_runner_kv_cache_bytes(weights->config, options, spec_of(decode_->dims, r)));
    const int device = devices_[static_cast<std::size_t>(r)];
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      (void)cudaGetLastError();
      return make_error(ErrorCode::internal, "cuda shard group: cudaSetDevice(" + std::to_string(device) +
                                                 "): " + cudaGetErrorString(e));
    }
    auto buf = kernels::cuda::DeviceBuffer::allocate(b);
    if (!buf)
      return make_error(buf.error().code, "cuda shard group: rank " + std::to_string(r) + "'s KV memory (" +
                                               std::to_string(b) + " bytes): " + buf.error().message);
    if (Status s = buf->fill_bytes(0); !s) return s;
    memory.push_back(buf->data());
    bytes.push_back(b);
    kv_memory_.push_back(std::move(buf).value());
  }
  if (Status s = build(base_, weights, options, devices_, memory, bytes); !s) return s;
  // Under reload the decode config's runners start without weights: a
  // rank's GPU holds one config's at a time.
  CudaRunnerOptions decode_options = options;
  decode_options.upload_weights = !reload_weights_;
  return build(*decode_, weights, decode_options, devices_, memory, bytes);
}

Result<std::unique_ptr<CudaShardGroup>> CudaShardGroup::create(std::shared_ptr<const ModelWeights> weights,
                                                               const CudaRunnerOptions& options, int tp, int pp,
                                                               int sp, ShiftChooser shift,
                                                               std::optional<ShardDims> decode,
                                                               std::vector<int> devices, bool reload_weights) {
  if (tp < 1 || pp < 1 || sp < 1 || tp * pp * sp < 2)
    return make_error(ErrorCode::invalid_argument,
                      "cuda shard group: tp, pp and sp must be >= 1 and tp*pp*sp >= 2, got tp=" + std::to_string(tp) +
                          " pp=" + std::to_string(pp) + " sp=" + std::to_string(sp));
  if (shift && pp != 1)
    return make_error(ErrorCode::invalid_argument, "cuda shard group: Shift Parallelism needs pp = 1 (the shift config "
                                                   "is TP over the base config's sp x tp ranks), got pp=" +
                                                       std::to_string(pp));
  if (!weights) return make_error(ErrorCode::invalid_argument, "cuda shard group: no weights");
  const ShardDims dims{tp, pp, sp};
  if (decode && (shift || decode->tp < 1 || decode->pp < 1 || decode->sp < 1 || decode->size() != dims.size()))
    return make_error(ErrorCode::invalid_argument,
                      "cuda shard group: Seesaw's decode config must have the group's " + std::to_string(dims.size()) +
                          " ranks (and no --shift), got tp=" + std::to_string(decode->tp) + " pp=" +
                          std::to_string(decode->pp) + " sp=" + std::to_string(decode->sp));
  if (devices.empty()) devices.assign(static_cast<std::size_t>(dims.size()), options.device_index);
  if (static_cast<int>(devices.size()) != dims.size())
    return make_error(ErrorCode::invalid_argument, "cuda shard group: " + std::to_string(devices.size()) +
                                                       " rank devices for a group of " + std::to_string(dims.size()));
  if (reload_weights && !(decode && *decode != dims))
    return make_error(ErrorCode::invalid_argument, "cuda shard group: reload weights is Seesaw's: it needs a decode "
                                                   "config other than the group's");
  std::unique_ptr<CudaShardGroup> g(new CudaShardGroup());
  g->base_.dims = dims;
  g->devices_ = std::move(devices);
  g->reload_weights_ = reload_weights;
  if (reload_weights) g->host_weights_ = weights;
  g->choose_shift_ = std::move(shift);
  if (decode && *decode != dims) {
    g->decode_ = std::make_unique<Shards>();
    g->decode_->dims = *decode;
    if (Status s = g->build_pair(weights, options); !s) return s.error();
  } else if (Status s = build(g->base_, weights, options, g->devices_, {}, {}); !s) {
    return s.error();
  }
  if (g->choose_shift_)
    if (Status s = g->make_shift_runners(weights, options); !s) return s.error();
  // The copiers are made here, not on demand: the engine's thread and its
  // KV mover's thread both reach them.
  g->make_copier(g->base_);
  if (g->decode_) g->make_copier(*g->decode_);
  g->kv_copier_ = std::make_unique<ActiveCopier>(*g);
  for (int r = 0; r < dims.size(); ++r) g->threads_.emplace_back([p = g.get(), r] { p->serve(r); });
  return g;
}

CudaShardGroup::~CudaShardGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  kv_copier_.reset();
  // Runners before the KV memory they use and the communicators they hold.
  shift_runners_.clear();
  if (decode_) decode_->runners.clear();
  base_.runners.clear();
  // NCCL's teardown is collective (ncclCommFinalize completes once every
  // rank has finalized): every communicator goes on a thread of its own.
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  std::vector<Kind*> kinds = {&base_.tp_kind, &base_.sp_kind, &base_.pp_kind, &shift_kind_};
  if (decode_) kinds.insert(kinds.end(), {&decode_->tp_kind, &decode_->sp_kind, &decode_->pp_kind});
  for (Kind* k : kinds)
    for (auto& c : k->comms) comms.push_back(std::move(c));
  std::vector<std::thread> teardown;
  for (auto& c : comms) teardown.emplace_back([&c] { c.reset(); });
  for (std::thread& t : teardown) t.join();
}

void CudaShardGroup::make_copier(Shards& shards) {
  std::vector<DeviceKvCache> caches;
  for (const auto& r : shards.runners) caches.push_back(r->device_kv_cache());
  auto c = CudaKvCopier::create(base_.runners[0]->kv_model_shape(), std::move(caches));
  if (c) shards.copier = std::move(c).value();
}

CudaKvCopier* CudaShardGroup::active_copier() { return (decode_active_ ? *decode_ : base_).copier.get(); }

kvstore::KvCopier* CudaShardGroup::kv_copier() {
  if (base_.copier == nullptr || (decode_ && decode_->copier == nullptr)) return nullptr;
  return kv_copier_.get();
}

Status CudaShardGroup::use_step_config(StepConfig config) {
  if (!decode_) return make_error(ErrorCode::unsupported, "cuda shard group: one parallel config only");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.empty())
      return make_error(ErrorCode::invalid_argument, "cuda shard group: a config switch with steps in flight");
  }
  const bool to_decode = config == StepConfig::decode;
  if (to_decode == decode_active_) return Status::ok_status();
  if (reload_weights_) {
    // Seesaw's reload (seed 000 §4.1): each rank frees the outgoing
    // config's weights, then uploads the incoming one's from host memory.
    Shards& out = to_decode ? base_ : *decode_;
    Shards& in = to_decode ? *decode_ : base_;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t r = 0; r < in.runners.size(); ++r) {
      if (Status s = out.runners[r]->release_weights(); !s) {
        broken_ = true;  // ranks before r are in the other config now
        return s;
      }
      if (Status s = in.runners[r]->load_weights(*host_weights_); !s) {
        broken_ = true;  // neither config holds this rank's weights now
        return make_error(s.error().code, "cuda shard group: rank " + std::to_string(r) +
                                              " could not reload its weights: " + s.error().message);
      }
    }
    reload_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++reloads_;
  }
  decode_active_ = to_decode;
  return Status::ok_status();
}

std::size_t CudaShardGroup::weight_bytes() const {
  std::size_t total = 0;
  for (const auto& r : base_.runners) total += r->weight_bytes();
  if (decode_)
    for (const auto& r : decode_->runners) total += r->weight_bytes();
  for (const auto& r : shift_runners_) total += r->weight_bytes();
  return total;
}

Result<StepOutput> CudaShardGroup::run_rank(int rank, const StepInput& input, Mode mode) {
  const auto r = static_cast<std::size_t>(rank);
  CudaModelRunner& runner = mode == Mode::shift ? *shift_runners_[r] : *shards_of(mode).runners[r];
  Result<StepOutput> out = runner.execute(input);
  if (!out) {
    // Its peers' in-process collectives and receives fail now, not at the
    // timeout (NCCL peers wait for their communicator's timeout).
    if (mode == Mode::shift) {
      (void)shift_kind_.groups[0]->mark_dead(shift_place(base_.dims, rank).rank);
    } else {
      Shards& s = shards_of(mode);
      const std::pair<Kind*, Place (*)(const ShardDims&, int)> kinds[] = {
          {&s.tp_kind, &tp_place}, {&s.sp_kind, &sp_place}, {&s.pp_kind, &pp_place}};
      for (const auto& [kind, place] : kinds)
        if (kind->size > 1) {
          const Place p = place(s.dims, rank);
          (void)kind->groups[static_cast<std::size_t>(p.group)]->mark_dead(p.rank);
        }
    }
  }
  return out;
}

void CudaShardGroup::serve(int rank) {
  std::uint64_t next = 0;  // the id of the next step this rank runs
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (stopping_) return true;
        for (const auto& j : jobs_)
          if (j->id == next) return true;
        return false;
      });
      if (stopping_) return;
      for (const auto& j : jobs_)
        if (j->id == next) job = j;
    }
    Result<StepOutput> out = run_rank(rank, job->input, job->mode);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->outputs[static_cast<std::size_t>(rank)] = std::move(out);
      ++job->done;
    }
    cv_.notify_all();
    ++next;
  }
}

int CudaShardGroup::max_in_flight() const {
  return decode_active_ ? decode_->dims.pp : base_.dims.pp;
}

Status CudaShardGroup::submit(const StepInput& input) {
  if (broken_)
    return make_error(ErrorCode::io, "cuda shard group: a rank failed in an earlier step; the group must be rebuilt");
  Mode mode = Mode::base;
  if (decode_active_)
    mode = Mode::decode;
  else if (choose_shift_ && choose_shift_(input))
    mode = Mode::shift;
  auto job = std::make_shared<Job>();
  job->input = input;
  job->mode = mode;
  job->outputs.resize(static_cast<std::size_t>(group_size()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    // (Shift needs pp = 1: its steps, like the base ones, run one at a time.)
    if (static_cast<int>(jobs_.size()) >= max_in_flight())
      return make_error(ErrorCode::invalid_argument, "cuda shard group: " + std::to_string(jobs_.size()) +
                                                         " steps in flight already");
    job->id = next_job_id_++;
    jobs_.push_back(job);
    max_seen_in_flight_ = std::max(max_seen_in_flight_, static_cast<int>(jobs_.size()));
  }
  ++(mode == Mode::decode ? decode_steps_ : mode == Mode::shift ? shift_steps_ : base_steps_);
  cv_.notify_all();
  return Status::ok_status();
}

Result<StepOutput> CudaShardGroup::collect() {
  std::shared_ptr<Job> job;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (jobs_.empty()) return make_error(ErrorCode::invalid_argument, "cuda shard group: nothing in flight");
    job = jobs_.front();
    cv_.wait(lock, [&] { return job->done == group_size(); });
    jobs_.pop_front();
  }
  for (auto& o : job->outputs)
    if (!*o) {
      broken_ = true;
      return o->error();
    }
  // The last stage's ranks hold the step's output; each gathered it whole
  // (the shift config has one stage).
  const ShardDims d = job->mode == Mode::decode ? decode_->dims : base_.dims;
  const std::size_t last =
      job->mode == Mode::shift ? 0 : static_cast<std::size_t>(d.pp - 1) * static_cast<std::size_t>(d.tp * d.sp);
  const StepOutput& first = **job->outputs[last];
  for (std::size_t r = last + 1; r < job->outputs.size(); ++r) {
    const StepOutput& o = **job->outputs[r];
    if (o.sampled_token_ids != first.sampled_token_ids || o.logits.size() != first.logits.size() ||
        std::memcmp(o.logits.data(), first.logits.data(), o.logits.size() * sizeof(float)) != 0) {
      broken_ = true;
      return make_error(ErrorCode::internal, "cuda shard group: rank " + std::to_string(r) +
                                                 " ended the step with other logits or ids than rank " +
                                                 std::to_string(last));
    }
  }
  return std::move(*job->outputs[last]);
}

Result<StepOutput> CudaShardGroup::execute(const StepInput& input) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.empty())
      return make_error(ErrorCode::invalid_argument, "cuda shard group: execute() with steps in flight");
  }
  if (Status s = submit(input); !s) return s.error();
  return collect();
}

}  // namespace shardline::model
