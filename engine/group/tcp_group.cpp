#include "engine/group/tcp_group.hpp"

#include "comm/address.hpp"
#include "comm/subgroup.hpp"

namespace shardline::engine {

namespace {

constexpr int kTagSetup = 100;
constexpr std::int32_t kSetupVersion = 4;
constexpr int kSetupWords = 15;
constexpr int kTpTagBase = 1 << 24;
constexpr int kSpTagBase = 2 << 24;
constexpr int kShiftTagBase = 3 << 24;
constexpr int kDecodeTpTagBase = 4 << 24;
constexpr int kDecodeSpTagBase = 5 << 24;

/// Seesaw's decode config must use the group's devices and shard the model
/// (the checks of InProcEngineGroup::create). Errors: invalid_argument.
Status check_seesaw_config(const model::ModelConfig& c, const ParallelConfig& pc, const SeesawGroupOptions& seesaw,
                           bool shift) {
  if (shift) return make_error(ErrorCode::invalid_argument, "Seesaw's decode config and --shift cannot be combined");
  if (Status st = check_decode_config(pc, seesaw.decode); !st) return st;
  if (Status st = model::check_shardable(c, seesaw.decode.tp, seesaw.decode.sp, seesaw.decode.pp); !st)
    return make_error(ErrorCode::invalid_argument, "Seesaw: the decode config " + seesaw.decode.to_string() +
                                                       " cannot shard this model: " + st.error().message);
  return Status::ok_status();
}

/// A rank's shard of Seesaw's decode config: own packed weights (released
/// at once under reload: cp is active first), its cache in `base`'s KV memory.
Result<DecodeShard> make_decode_shard(std::shared_ptr<const model::ModelWeights> weights,
                                      const SeesawGroupOptions& seesaw, int group_rank, const GroupComms& comms,
                                      model::ShardRunner& base) {
  auto made = model::ShardRunner::create_on_kv_memory(std::move(weights), shard_spec_of(seesaw.decode, group_rank),
                                                      comms.decode_shard_comms(), base);
  if (!made.ok()) return std::move(made).error();
  DecodeShard d{seesaw.decode, std::move(made).value(), seesaw.weights};
  if (seesaw.weights == ReshardWeights::reload) d.runner->release_weights();
  return d;
}

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
                                     bool shift, const ParallelConfig* decode) {
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
  if (decode != nullptr) {  // Seesaw's cd: its own TP and SP groups over the same ranks
    const RankCoord dme = rank_coord(*decode, group_rank);
    if (decode->tp > 1) {
      auto sub = comm::make_subgroup(*g.world, tp_group_ranks(*decode, dme), kDecodeTpTagBase);
      if (!sub.ok()) return std::move(sub).error();
      g.decode_tp = std::move(sub).value();
    }
    if (decode->sp > 1) {
      auto sub = comm::make_subgroup(*g.world, sp_group_ranks(*decode, dme), kDecodeSpTagBase);
      if (!sub.ok()) return std::move(sub).error();
      g.decode_sp = std::move(sub).value();
    }
  }
  return g;
}

Result<std::unique_ptr<ParallelExecutor>> create_tcp_group_executor(std::shared_ptr<const model::ModelWeights> weights,
                                                                   const ParallelConfig& pc,
                                                                   const model::CpuRunnerOptions& options,
                                                                   const TcpGroupOptions& tcp,
                                                                   std::optional<ShiftOptions> shift,
                                                                   std::optional<SeesawGroupOptions> seesaw) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "tcp group: no weights");
  if (Status st = model::check_shardable(weights->config, pc.tp, pc.sp, pc.pp); !st) return st.error();
  if (seesaw)
    if (Status st = check_seesaw_config(weights->config, pc, *seesaw, shift.has_value()); !st) return st.error();
  std::optional<ShiftPolicy> policy;
  if (shift) {
    if (Status st = check_shift_config(weights->config, pc); !st) return st.error();
    auto made = ShiftPolicy::create(shift->policy);
    if (!made) return std::move(made).error();
    policy = std::move(made).value();
  }
  Result<GroupComms> comms = connect_tcp_group(pc, 0, tcp, shift.has_value(), seesaw ? &seesaw->decode : nullptr);
  if (!comms.ok()) return std::move(comms).error();
  const std::int32_t setup[kSetupWords] = {kSetupVersion,
                                           pc.tp,
                                           pc.pp,
                                           pc.sp,
                                           options.num_kv_blocks,
                                           options.block_size,
                                           options.kv_cache_dtype == DType::bf16 ? 1 : 0,
                                           weights->config.num_hidden_layers,
                                           shift ? 1 : 0,
                                           seesaw ? seesaw->decode.tp : 0,
                                           seesaw ? seesaw->decode.pp : 0,
                                           seesaw ? seesaw->decode.sp : 0,
                                           seesaw && seesaw->weights == ReshardWeights::reload ? 1 : 0,
                                           static_cast<std::int32_t>(options.overlap),
                                           static_cast<std::int32_t>(options.overlap_prefetch_bytes >> 10)};
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
  std::optional<DecodeShard> decode;
  if (seesaw) {
    auto made = make_decode_shard(weights, *seesaw, 0, comms.value(), *runner.value());
    if (!made.ok()) return std::move(made).error();
    decode = std::move(made).value();
  }
  Result<std::unique_ptr<ParallelExecutor>> exec =
      ParallelExecutor::create(pc, std::move(runner).value(), std::move(comms).value());
  if (!exec.ok()) return std::move(exec).error();
  if (shift)
    if (Status st = exec.value()->set_shift(std::move(shift_runner), std::move(*policy)); !st) return st.error();
  if (decode)
    if (Status st = exec.value()->set_decode_config(std::move(*decode)); !st) return st.error();
  // The ranks' caches are in their processes: KV copies go through their loops.
  if (Status st = exec.value()->enable_kv_copier(); !st) return st.error();
  return exec;
}

Status serve_tcp_group_rank(std::shared_ptr<const model::ModelWeights> weights, const ParallelConfig& pc,
                            int group_rank, int num_threads, const TcpGroupOptions& tcp, bool shift,
                            std::optional<SeesawGroupOptions> seesaw) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "tcp group: no weights");
  if (group_rank <= 0 || group_rank >= pc.group_size())
    return make_error(ErrorCode::invalid_argument, "--rank must be in [1, " + std::to_string(pc.group_size()) +
                                                       ") for " + pc.to_string());
  if (Status st = model::check_shardable(weights->config, pc.tp, pc.sp, pc.pp); !st) return st;
  if (shift)
    if (Status st = check_shift_config(weights->config, pc); !st) return st;
  if (seesaw)
    if (Status st = check_seesaw_config(weights->config, pc, *seesaw, shift); !st) return st;
  Result<GroupComms> comms = connect_tcp_group(pc, group_rank, tcp, shift, seesaw ? &seesaw->decode : nullptr);
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
  const auto cd_str = [](const std::int32_t* w) {
    if (w[0] == 0) return std::string("none");
    return ParallelConfig{w[0], w[1], w[2], 1}.to_string();
  };
  const std::int32_t mine_cd[3] = {seesaw ? seesaw->decode.tp : 0, seesaw ? seesaw->decode.pp : 0,
                                   seesaw ? seesaw->decode.sp : 0};
  if (setup[9] != mine_cd[0] || setup[10] != mine_cd[1] || setup[11] != mine_cd[2])
    return make_error(ErrorCode::mismatch, "rank " + std::to_string(group_rank) + ": Seesaw's decode config is " +
                                               cd_str(mine_cd) + " here but " + cd_str(setup + 9) +
                                               " on rank 0 (start every rank with the same --parallel-decode)");
  if (seesaw && setup[12] != (seesaw->weights == ReshardWeights::reload ? 1 : 0))
    return make_error(ErrorCode::mismatch, "rank " + std::to_string(group_rank) + ": --reshard-weights is " +
                                               to_string(seesaw->weights) + " here but " +
                                               (setup[12] ? "reload" : "resident") + " on rank 0");
  model::CpuRunnerOptions options;
  options.num_kv_blocks = setup[4];
  options.block_size = setup[5];
  options.kv_cache_dtype = setup[6] == 1 ? DType::bf16 : DType::f32;
  options.num_threads = num_threads;
  // rank 0's --step-overlap and its prefetch budget (KiB)
  if (setup[13] < 0 || setup[13] > static_cast<std::int32_t>(model::StepOverlap::nano_batch) || setup[14] < 0)
    return make_error(ErrorCode::mismatch, "rank " + std::to_string(group_rank) + ": bad step overlap in rank 0's setup");
  options.overlap = static_cast<model::StepOverlap>(setup[13]);
  options.overlap_prefetch_bytes = static_cast<std::size_t>(setup[14]) << 10;
  Result<std::unique_ptr<model::ShardRunner>> runner =
      model::ShardRunner::create(weights, shard_spec_of(pc, group_rank), options, comms.value().shard_comms());
  if (!runner.ok()) return std::move(runner).error();
  std::unique_ptr<model::ShardRunner> shift_runner;
  if (shift) {
    auto made = make_shift_runner(weights, pc, group_rank, comms.value(), *runner.value());
    if (!made.ok()) return std::move(made).error();
    shift_runner = std::move(made).value();
  }
  std::optional<DecodeShard> decode;
  if (seesaw) {
    auto made = make_decode_shard(weights, *seesaw, group_rank, comms.value(), *runner.value());
    if (!made.ok()) return std::move(made).error();
    decode = std::move(made).value();
  }
  ShardWorker worker(pc, group_rank, std::move(runner).value(), std::move(comms).value(), num_threads,
                     std::move(shift_runner), std::move(decode));
  return worker.serve();
}

}  // namespace shardline::engine
