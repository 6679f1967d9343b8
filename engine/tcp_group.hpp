#pragma once
/// \file
/// Engine groups whose ranks are processes (or nodes) connected over TCP
/// (comm/tcp.hpp). Rank 0 is the engine's executor (inside `shardline run` /
/// `node start` with `--group-master`); every other rank is a
/// `shardline shard serve` process.
///
/// After the TCP rendezvous, rank 0 sends every rank a setup message over
/// the world communicator: int32[8] {version 1, tp, pp, sp, num_kv_blocks,
/// block_size, kv dtype (0 f32, 1 bf16), num_layers}, so all ranks size
/// their KV caches alike and a rank started with another parallel config or
/// model depth fails with a clear error instead of computing garbage. TP and
/// SP groups are sub-groups of the TCP world (comm/subgroup.hpp), tag bases
/// 1 << 24 and 2 << 24.

#include <chrono>
#include <memory>
#include <string>

#include "comm/tcp.hpp"
#include "common/result.hpp"
#include "engine/parallel_config.hpp"
#include "engine/parallel_executor.hpp"
#include "model/shard_runner.hpp"
#include "model/weights.hpp"

namespace shardline::engine {

struct TcpGroupOptions {
  std::string master = "127.0.0.1:0";  ///< rank 0's address; rank 0 binds it
  std::string key;                     ///< shared secret (e.g. the cluster key); empty = none
  std::chrono::milliseconds timeout{60'000};  ///< rendezvous and per-call timeout
};

/// Joins the group as `group_rank` and builds its communicators (world + TP
/// and SP sub-groups). Blocks until every rank has joined (or the timeout).
/// Errors: invalid_argument (bad address, wrong key), io (a rank missing).
[[nodiscard]] Result<GroupComms> connect_tcp_group(const ParallelConfig& pc, int group_rank,
                                                  const TcpGroupOptions& options);

/// Rank 0 of a TCP group: connects, sends the setup, builds its shard and the
/// executor. `options.num_threads` = OpenMP threads of rank 0.
[[nodiscard]] Result<std::unique_ptr<ParallelExecutor>> create_tcp_group_executor(
    std::shared_ptr<const model::ModelWeights> weights, const ParallelConfig& pc,
    const model::CpuRunnerOptions& options, const TcpGroupOptions& tcp);

/// A rank > 0: connects, receives and checks the setup, builds its shard and
/// serves steps until rank 0 shuts the group down (ok) or fails (the error).
[[nodiscard]] Status serve_tcp_group_rank(std::shared_ptr<const model::ModelWeights> weights,
                                         const ParallelConfig& pc, int group_rank, int num_threads,
                                         const TcpGroupOptions& tcp);

}  // namespace shardline::engine
