#include "engine/tcp_group.hpp"

#include "comm/address.hpp"
#include "comm/subgroup.hpp"

namespace shardline::engine {

namespace {

constexpr int kTagSetup = 100;
constexpr std::int32_t kSetupVersion = 1;
constexpr int kTpTagBase = 1 << 24;
constexpr int kSpTagBase = 2 << 24;

}  // namespace

Result<GroupComms> connect_tcp_group(const ParallelConfig& pc, int group_rank, const TcpGroupOptions& o) {
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
  return g;
}

Result<std::unique_ptr<ParallelExecutor>> create_tcp_group_executor(std::shared_ptr<const model::ModelWeights> weights,
                                                                   const ParallelConfig& pc,
                                                                   const model::CpuRunnerOptions& options,
                                                                   const TcpGroupOptions& tcp) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "tcp group: no weights");
  if (Status st = model::check_shardable(weights->config, pc.tp, pc.sp, pc.pp); !st) return st.error();
  Result<GroupComms> comms = connect_tcp_group(pc, 0, tcp);
  if (!comms.ok()) return std::move(comms).error();
  const std::int32_t setup[8] = {kSetupVersion,
                                 pc.tp,
                                 pc.pp,
                                 pc.sp,
                                 options.num_kv_blocks,
                                 options.block_size,
                                 options.kv_cache_dtype == DType::bf16 ? 1 : 0,
                                 weights->config.num_hidden_layers};
  for (int r = 1; r < pc.group_size(); ++r)
    if (Status st = comms.value().world->send(setup, sizeof setup, r, kTagSetup); !st) return st.error();
  Result<std::unique_ptr<model::ShardRunner>> runner =
      model::ShardRunner::create(weights, shard_spec_of(pc, 0), options, comms.value().shard_comms());
  if (!runner.ok()) return std::move(runner).error();
  return ParallelExecutor::create(pc, std::move(runner).value(), std::move(comms).value());
}

Status serve_tcp_group_rank(std::shared_ptr<const model::ModelWeights> weights, const ParallelConfig& pc,
                            int group_rank, int num_threads, const TcpGroupOptions& tcp) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "tcp group: no weights");
  if (group_rank <= 0 || group_rank >= pc.group_size())
    return make_error(ErrorCode::invalid_argument, "--rank must be in [1, " + std::to_string(pc.group_size()) +
                                                       ") for " + pc.to_string());
  if (Status st = model::check_shardable(weights->config, pc.tp, pc.sp, pc.pp); !st) return st;
  Result<GroupComms> comms = connect_tcp_group(pc, group_rank, tcp);
  if (!comms.ok()) return std::move(comms).error();
  std::int32_t setup[8] = {};
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
  model::CpuRunnerOptions options;
  options.num_kv_blocks = setup[4];
  options.block_size = setup[5];
  options.kv_cache_dtype = setup[6] == 1 ? DType::bf16 : DType::f32;
  options.num_threads = num_threads;
  Result<std::unique_ptr<model::ShardRunner>> runner =
      model::ShardRunner::create(weights, shard_spec_of(pc, group_rank), options, comms.value().shard_comms());
  if (!runner.ok()) return std::move(runner).error();
  ShardWorker worker(pc, group_rank, std::move(runner).value(), std::move(comms).value(), num_threads);
  return worker.serve();
}

}  // namespace shardline::engine
