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

}  // namespace shardline::bench
