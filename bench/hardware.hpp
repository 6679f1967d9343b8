#pragma once
/// \file
/// Hardware limits measured in the same run as a benchmark, so ratios to them
/// are honest on whatever machine runs it.

namespace shardline::bench {

/// STREAM triad a[i] = b[i] + s * c[i] over three arrays of `array_bytes`
/// each, `num_threads` OpenMP threads, best of `repeats`. Counts 3 * array
/// bytes per pass (STREAM convention). Returns GB/s (1e9 bytes / s).
[[nodiscard]] double measure_triad_bandwidth_gbs(int num_threads, long array_bytes = 256L << 20,
                                                 int repeats = 5);

/// OpenBLAS `cblas_sgemm` on square n x n x n F32 matrices with `num_threads`
/// BLAS threads, best of `repeats`. Returns GFLOP/s (2 n^3 / s / 1e9).
[[nodiscard]] double measure_sgemm_gflops(int num_threads, int n = 2048, int repeats = 3);

/// Shardline's own batch-invariant linear layer (kernels/cpu/linear.hpp) on
/// an n x n x n F32 problem with the calling thread's OpenMP threads, best of
/// `repeats`. Returns GFLOP/s.
[[nodiscard]] double measure_linear_gflops(int n = 2048, int repeats = 3);

/// An in-process all-reduce (comm/inproc.hpp) of `bytes` of F32 between
/// `num_ranks` threads, best of `repeats`. Returns the bytes one rank sends
/// per second, counting the ring-equivalent volume 2 (n-1)/n * bytes (the
/// convention of orchestrator/cost_model.hpp).
[[nodiscard]] double measure_inproc_allreduce_bytes_per_s(int num_ranks = 2, long bytes = 8L << 20,
                                                          int repeats = 5);
/// Seconds of one all-reduce of a single float between `num_ranks` threads
/// (median of `repeats`): the per-collective latency.
[[nodiscard]] double measure_inproc_allreduce_latency_s(int num_ranks = 2, int repeats = 200);

}  // namespace shardline::bench
