#pragma once
/// \file
/// Engine groups whose ranks are processes (or nodes) connected over TCP
/// (comm/tcp.hpp). Rank 0 is the engine's executor (inside `shardline run` /
/// `node start` with `--group-master`); every other rank is a
/// `shardline shard serve` process.
///
/// After the TCP rendezvous, rank 0 sends every rank a setup message over
/// the world communicator: int32[13] {version 3, tp, pp, sp, num_kv_blocks,
/// block_size, kv dtype (0 f32, 1 bf16), num_layers, shift (0/1), Seesaw's
/// decode tp, pp, sp (0 0 0 without one), reshard weights (0 resident, 1
/// reload)}, so all ranks size their KV caches alike and a rank started
/// with another parallel config, model depth, --shift or decode config
/// fails with a clear error (mismatch) instead of computing garbage. TP and
/// SP groups are sub-groups of the TCP world (comm/subgroup.hpp), tag bases
/// 1 << 24 and 2 << 24.
///
/// Seesaw (seed 000 §4.1): with a decode config cd every rank also holds its
/// cd shard (own packed weights, or released until the first switch under
/// reload; its cache in the same KV memory), cd's TP and SP groups are
/// sub-groups with tag bases 4 << 24 and 5 << 24, and rank 0 switches the
/// group between the configs as in an in-process group. Rank 0's KV copies
/// (Seesaw's host KV buffer, swap preemption) reach the other ranks'
/// caches through their serving loops (engine/group/group_kv.hpp): every TCP
/// group's executor has a KvCopier.
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
#include "engine/group/parallel_config.hpp"
#include "engine/group/parallel_executor.hpp"
#include "model/shard_runner.hpp"
#include "model/weights.hpp"

namespace shardline::engine {

struct TcpGroupOptions {
  std::string master = "127.0.0.1:0";  ///< rank 0's address; rank 0 binds it
  std::string key;                     ///< shared secret (e.g. the cluster key); empty = none
  std::chrono::milliseconds timeout{60'000};  ///< rendezvous and per-call timeout
};

/// Joins the group as `group_rank` and builds its communicators (world + TP
/// and SP sub-groups, + the shift TP' group with `shift`, + cd's TP and SP
/// sub-groups with a Seesaw `decode` config). Blocks until every rank has
/// joined (or the timeout).
/// Errors: invalid_argument (bad address, wrong key), io (a rank missing).
[[nodiscard]] Result<GroupComms> connect_tcp_group(const ParallelConfig& pc, int group_rank,
                                                  const TcpGroupOptions& options, bool shift = false,
                                                  const ParallelConfig* decode = nullptr);

/// Rank 0 of a TCP group: connects, sends the setup, builds its shard and the
/// executor. `options.num_threads` = OpenMP threads of rank 0. With
/// `shift`, also its shift shard and the policy; every other rank must then
/// serve with shift too. With `seesaw`, also its shard of the decode config
/// cd (every other rank must serve with the same cd and weights mode).
/// Errors: invalid_argument (a config the model cannot shard; with shift:
/// pp > 1, a group of one, a model TP' cannot shard, a bad policy; with
/// seesaw: shift too, a cd of another group size or one the model cannot
/// shard), what connecting returns.
[[nodiscard]] Result<std::unique_ptr<ParallelExecutor>> create_tcp_group_executor(
    std::shared_ptr<const model::ModelWeights> weights, const ParallelConfig& pc,
    const model::CpuRunnerOptions& options, const TcpGroupOptions& tcp,
    std::optional<ShiftOptions> shift = std::nullopt, std::optional<SeesawGroupOptions> seesaw = std::nullopt);

/// A rank > 0: connects, receives and checks the setup, builds its shard
/// (and with `shift` its shift shard) and serves steps until rank 0 shuts
/// the group down (ok) or fails (the error). Errors: invalid_argument (bad
/// rank or config), mismatch (the setup differs from this rank's config,
/// --shift and Seesaw's decode config included), io, what serving returns.
[[nodiscard]] Status serve_tcp_group_rank(std::shared_ptr<const model::ModelWeights> weights,
                                         const ParallelConfig& pc, int group_rank, int num_threads,
                                         const TcpGroupOptions& tcp, bool shift = false,
                                         std::optional<SeesawGroupOptions> seesaw = std::nullopt);

}  // namespace shardline::engine
