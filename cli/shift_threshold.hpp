#pragma once
/// \file
/// `--shift-threshold auto` (Shift Parallelism, seed 001 Alg. 3; docs/parallel.md):
/// T is where the cost model (sim/cost_model.hpp,
/// CostModel::shift_threshold) predicts that a step of n decoding sequences
/// runs faster in the base config SP×TP than in the shift config TP' = SP×TP,
/// with the hardware numbers measured here and now: STREAM triad bandwidth,
/// Shardline's GEMM rate and an in-process all-reduce among the group's
/// devices, each device taking 1/(sp*tp) of the machine's bandwidth and GEMM
/// rate (CPU devices share one memory bus). ArcticInference fixes T = 512
/// instead. The benchmark measures the real crossover beside it
/// (`shardline bench shift`, docs/parallel.md).

#include "cli/engine_flags.hpp"
#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"

namespace shardline::cli {

/// When `f.shift` and `f.shift_threshold` is "auto", measures the machine and
/// sets o.shift->policy.threshold to the cost model's T for the group
/// `parallel` (o.num_threads threads per device, at most
/// o.max_num_batched_tokens), logging T and its inputs. Otherwise nothing.
/// Errors: invalid_argument (the model config cannot be read, a config the
/// cost model refuses).
[[nodiscard]] Status resolve_shift_threshold(const EngineFlags& f, const engine::ParallelConfig& parallel,
                                             engine::EngineOptions& o);

}  // namespace shardline::cli
