#include "engine/tcp_group.hpp"

#include "comm/address.hpp"
#include "comm/subgroup.hpp"

namespace shardline::engine {

namespace {

constexpr int kTagSetup = 100;
constexpr std::int32_t kSetupVersion = 2;
constexpr int kSetupWords = 9;
constexpr int kTpTagBase = 1 << 24;
constexpr int kSpTagBase = 2 << 24;
constexpr int kShiftTagBase = 3 << 24;

/// A shift config needs pp = 1, several devices, and a model TP' = sp*tp can
/// shard (the checks of InProcEngineGroup::create). Errors: invalid_argument.
Status check_shift_config(const model::ModelConfig& c, const ParallelConfig& pc) {
  if (pc.pp != 1 || pc.group_size() < 2)
    return make_error(ErrorCode::invalid_argument,
                      "--shift needs a group of sp and / or tp > 1 with pp = 1, got " + pc.to_string());
  if (Status st = model::check_shardable(c, pc.group_size(), 1, 1); !st)
    return make_error(ErrorCode::invalid_argument, "--shift: the shift config tp=" + std::to_string(pc.group_size()) +
                                                       " cannot shard this model: " + st.error().message);
  return Status::ok_status();
}

/// The shift config's shard of `group_rank`: own packed weights, `base`'s KV cache.
Result<std::unique_ptr<model::ShardRunner>> make_shift_runner(std::shared_ptr<const model::ModelWeights> weights,
                                                             const ParallelConfig& pc, int group_rank,
                                                             const GroupComms& comms, model::ShardRunner& base) {
  return model::ShardRunner::create_sharing_kv(std::move(weights), shift_spec_of(pc, group_rank),
                                               comms.shift_shard_comms(), base);
}

}  // namespace

Result<GroupComms> connect_tcp_group(const ParallelConfig& pc, int group_rank, const TcpGroupOptions& o,
                                     bool shift) {
  Result<std::pair<std::string, int>> addr = comm::parse_host_port(o.master);
  if (!addr.ok()) return std::move(addr).error();
  if (group_rank != 0 && addr.value().second == 0)
    return make_error(ErrorCode::invalid_argument, "rank " + std::to_string(group_rank) + " needs rank 0's port");
  comm::TcpOptions t;
  t.rank = group_rank;
  t.world_size = pc.group_size();
  t.master_host = addr.value().first;
  t.master_port = addr.value().second;
  t.timeout = o.timeout;
  t.key = o.key;
  Result<std::unique_ptr<comm::TcpCommunicator>> world = comm::TcpGroup::create(t);
  if (!world.ok()) return std::move(world).error();
  GroupComms g;
  g.world = std::move(world).value();
  const RankCoord me = rank_coord(pc, group_rank);
  if (pc.tp > 1) {
    auto sub = comm::make_subgroup(*g.world, tp_group_ranks(pc, me), kTpTagBase);
    if (!sub.ok()) return std::move(sub).error();
    g.tp = std::move(sub).value();
  }
  if (pc.sp > 1) {
    auto sub = comm::make_subgroup(*g.world, sp_group_ranks(pc, me), kSpTagBase);
    if (!sub.ok()) return std::move(sub).error();
    g.sp = std::move(sub).value();
  }
  if (shift) {
    // TP' rank i is group rank shift_group_ranks(pc)[i] (§3.3.1), not increasing when sp, tp > 1.
    auto sub = comm::make_subgroup(*g.world, shift_group_ranks(pc), kShiftTagBase, comm::MemberOrder::as_given);
    if (!sub.ok()) return std::move(sub).error();
    g.shift_tp = std::move(sub).value();
  }
  return g;
}

Result<std::unique_ptr<ParallelExecutor>> create_tcp_group_executor(std::shared_ptr<const model::ModelWeights> weights,
                                                                   const ParallelConfig& pc,
                                                                   const model::CpuRunnerOptions& options,
                                                                   const TcpGroupOptions& tcp,
                                                                   std::optional<ShiftOptions> shift) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "tcp group: no weights");
  if (Status st = model::check_shardable(weights->config, pc.tp, pc.sp, pc.pp); !st) return st.error();
  std::optional<ShiftPolicy> policy;
  if (shift) {
    if (Status st = check_shift_config(weights->config, pc); !st) return st.error();
    auto made = ShiftPolicy::create(shift->policy);
    if (!made) return std::move(made).error();
    policy = std::move(made).value();
  }
  Result<GroupComms> comms = connect_tcp_group(pc, 0, tcp, shift.has_value());
  if (!comms.ok()) return std::move(comms).error();
  const std::int32_t setup[kSetupWords] = {kSetupVersion,
                                           pc.tp,
                                           pc.pp,
                                           pc.sp,
                                           options.num_kv_blocks,
                                           options.block_size,
                                           options.kv_cache_dtype == DType::bf16 ? 1 : 0,
                                           weights->config.num_hidden_layers,
                                           shift ? 1 : 0};
  for (int r = 1; r < pc.group_size(); ++r)
    if (Status st = comms.value().world->send(setup, sizeof setup, r, kTagSetup); !st) return st.error();
  Result<std::unique_ptr<model::ShardRunner>> runner =
      model::ShardRunner::create(weights, shard_spec_of(pc, 0), options, comms.value().shard_comms());
  if (!runner.ok()) return std::move(runner).error();
  std::unique_ptr<model::ShardRunner> shift_runner;
  if (shift) {
    auto made = make_shift_runner(weights, pc, 0, comms.value(), *runner.value());
    if (!made.ok()) return std::move(made).error();
    shift_runner = std::move(made).value();
  }
  Result<std::unique_ptr<ParallelExecutor>> exec =
      ParallelExecutor::create(pc, std::move(runner).value(), std::move(comms).value());
  if (!exec.ok()) return std::move(exec).error();
  if (shift)
    if (Status st = exec.value()->set_shift(std::move(shift_runner), std::move(*policy)); !st) return st.error();
  return exec;
}

Status serve_tcp_group_rank(std::shared_ptr<const model::ModelWeights> weights, const ParallelConfig& pc,
                            int group_rank, int num_threads, const TcpGroupOptions& tcp, bool shift) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "tcp group: no weights");
  if (group_rank <= 0 || group_rank >= pc.group_size())
    return make_error(ErrorCode::invalid_argument, "--rank must be in [1, " + std::to_string(pc.group_size()) +
                                                       ") for " + pc.to_string());
  if (Status st = model::check_shardable(weights->config, pc.tp, pc.sp, pc.pp); !st) return st;
  if (shift)
    if (Status st = check_shift_config(weights->config, pc); !st) return st;
  Result<GroupComms> comms = connect_tcp_group(pc, group_rank, tcp, shift);
  if (!comms.ok()) return std::move(comms).error();
  std::int32_t setup[kSetupWords] = {};
  if (Status st = comms.value().world->recv(setup, sizeof setup, 0, kTagSetup); !st) return st;
  const auto mismatch = [&](const std::string& what, int mine, int theirs) {
    return Status(make_error(ErrorCode::mismatch, "rank " + std::to_string(group_rank) + ": " + what + " is " +
                                                      std::to_string(mine) + " here but " + std::to_string(theirs) +
                                                      " on rank 0"));
  };
  if (setup[0] != kSetupVersion) return mismatch("setup version", kSetupVersion, setup[0]);
  if (setup[1] != pc.tp) return mismatch("tp", pc.tp, setup[1]);
  if (setup[2] != pc.pp) return mismatch("pp", pc.pp, setup[2]);
  if (setup[3] != pc.sp) return mismatch("sp", pc.sp, setup[3]);
  if (setup[7] != weights->config.num_hidden_layers)
    return mismatch("num_hidden_layers", weights->config.num_hidden_layers, setup[7]);
  if (setup[8] != (shift ? 1 : 0))
    return make_error(ErrorCode::mismatch, "rank " + std::to_string(group_rank) + ": --shift is " +
                                               (shift ? "on" : "off") + " here but " + (setup[8] ? "on" : "off") +
                                               " on rank 0 (start every rank of the group with the same --shift)");
  model::CpuRunnerOptions options;
  options.num_kv_blocks = setup[4];
  options.block_size = setup[5];
  options.kv_cache_dtype = setup[6] == 1 ? DType::bf16 : DType::f32;
  options.num_threads = num_threads;
  Result<std::unique_ptr<model::ShardRunner>> runner =
      model::ShardRunner::create(weights, shard_spec_of(pc, group_rank), options, comms.value().shard_comms());
  if (!runner.ok()) return std::move(runner).error();
  std::unique_ptr<model::ShardRunner> shift_runner;
  if (shift) {
    auto made = make_shift_runner(weights, pc, group_rank, comms.value(), *runner.value());
    if (!made.ok()) return std::move(made).error();
    shift_runner = std::move(made).value();
  }
  ShardWorker worker(pc, group_rank, std::move(runner).value(), std::move(comms).value(), num_threads,
                     std::move(shift_runner));
  return worker.serve();
}

}  // namespace shardline::engine
