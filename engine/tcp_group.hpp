#pragma once
/// \file
/// Engine groups whose ranks are processes (or nodes) connected over TCP
/// (comm/tcp.hpp). Rank 0 is the engine's executor (inside `shardline run` /
/// `node start` with `--group-master`); every other rank is a
/// `shardline shard serve` process.
///
/// After the TCP rendezvous, rank 0 sends every rank a setup message over
/// the world communicator: int32[9] {version 2, tp, pp, sp, num_kv_blocks,
/// block_size, kv dtype (0 f32, 1 bf16), num_layers, shift (0/1)}, so all
/// ranks size their KV caches alike and a rank started with another
/// parallel config, model depth or --shift fails with a clear error
/// (mismatch) instead of computing garbage. TP and SP groups are sub-groups
/// of the TCP world (comm/subgroup.hpp), tag bases 1 << 24 and 2 << 24.
///
/// Shift Parallelism (seed 001 §3.3): with a shift config every rank also
/// holds its shard of TP' = sp*tp (own packed weights, the base shard's KV
/// cache), and its TP' group is the sub-group shift_group_ranks(pc) of the
/// world in that order (MemberOrder::as_given, the §3.3.1 head order), tag
/// base 3 << 24. Rank 0 picks each step's config (its ShiftPolicy) and tells
/// the others in the step header, as in an in-process group.

#include <chrono>
#include <memory>
#include <optional>
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
/// and SP sub-groups, + the shift TP' group with `shift`). Blocks until
/// every rank has joined (or the timeout).
/// Errors: invalid_argument (bad address, wrong key), io (a rank missing).
[[nodiscard]] Result<GroupComms> connect_tcp_group(const ParallelConfig& pc, int group_rank,
                                                  const TcpGroupOptions& options, bool shift = false);

/// Rank 0 of a TCP group: connects, sends the setup, builds its shard and the
/// executor. `options.num_threads` = OpenMP threads of rank 0. With
/// `shift`, also its shift shard and the policy; every other rank must then
/// serve with shift too. Errors: invalid_argument (a config the model cannot
/// shard; with shift: pp > 1, a group of one, a model TP' cannot shard, a
/// bad policy), what connecting returns.
[[nodiscard]] Result<std::unique_ptr<ParallelExecutor>> create_tcp_group_executor(
    std::shared_ptr<const model::ModelWeights> weights, const ParallelConfig& pc,
    const model::CpuRunnerOptions& options, const TcpGroupOptions& tcp,
    std::optional<ShiftOptions> shift = std::nullopt);

/// A rank > 0: connects, receives and checks the setup, builds its shard
/// (and with `shift` its shift shard) and serves steps until rank 0 shuts
/// the group down (ok) or fails (the error). Errors: invalid_argument (bad
/// rank or config), mismatch (the setup differs from this rank's config,
/// --shift included), io, what serving returns.
[[nodiscard]] Status serve_tcp_group_rank(std::shared_ptr<const model::ModelWeights> weights,
                                         const ParallelConfig& pc, int group_rank, int num_threads,
                                         const TcpGroupOptions& tcp, bool shift = false);

}  // namespace shardline::engine
