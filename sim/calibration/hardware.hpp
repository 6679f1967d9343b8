#pragma once
/// \file
/// Hardware limits measured in the same run as a benchmark, so ratios to them
/// are honest on whatever machine runs it.

#include "common/dtype.hpp"
#include "kernels/cpu/ggml_quants.hpp"

namespace shardline::sim::calibration {

/// STREAM triad a[i] = b[i] + s * c[i] over three arrays of `array_bytes`
/// each, `num_threads` OpenMP threads, best of `repeats`. Counts 3 * array
/// bytes per pass (STREAM convention). Returns GB/s (1e9 bytes / s).
[[nodiscard]] double measure_triad_bandwidth_gbs(int num_threads, long array_bytes = 256L << 20,
                                                 int repeats = 5);

/// memcpy of `array_bytes` split over `num_threads` OpenMP threads (each
/// copies its contiguous share), best of `repeats`: what a copy between two
/// CPU devices' memories costs (a SiDP weight fetch, a Seesaw KV swap: both
/// memcpy on this machine). Counts the bytes copied once (a copy reads and
/// writes each: about half the traffic-counted bandwidth). Returns GB/s.
[[nodiscard]] double measure_copy_bandwidth_gbs(int num_threads, long array_bytes = 256L << 20, int repeats = 3);

/// OpenBLAS `cblas_sgemm` on square n x n x n F32 matrices with `num_threads`
/// BLAS threads, best of `repeats`. Returns GFLOP/s (2 n^3 / s / 1e9).
[[nodiscard]] double measure_sgemm_gflops(int num_threads, int n = 2048, int repeats = 3);

/// Shardline's own batch-invariant linear layer (kernels/cpu/linear.hpp) on
/// an n x n x n problem with F32 or BF16 weights (BF16: BF16 compute,
/// VDPBF16PS) and the calling thread's OpenMP threads, best of `repeats`.
/// Returns GFLOP/s.
[[nodiscard]] double measure_linear_gflops(int n = 2048, int repeats = 3, DType dtype = DType::f32);

/// Shardline's linear layer on quantized weights (kernels/cpu/quant_linear.hpp,
/// the kernel it picks on this CPU) on an n x n x n problem with W in
/// GGML `type` (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K; any valid blocks: the speed
/// does not depend on the values) and the calling thread's OpenMP threads,
/// best of `repeats`. Includes quantizing x, as every call does. Returns
/// GFLOP/s (2 n^3 / s / 1e9); 0 for a type it does not compute.
[[nodiscard]] double measure_quant_linear_gflops(kernels::GgmlType type, int n = 2048, int repeats = 3);

/// The instruction peak of the dot products a linear layer in `dtype` runs:
/// independent register-only FMAs (F32: VFMADD, 32 FLOP per zmm / 16 per
/// ymm) or BF16 dot products (VDPBF16PS, 64 FLOP per zmm) on `num_threads`
/// threads, no memory traffic, best of `repeats`. The compute ceiling no
/// GEMM can pass. Without AVX512-BF16, BF16 compute is emulated with two F32
/// FMAs per pair (kernels/cpu/linear.cpp), so its peak is the F32 one.
/// Returns GFLOP/s.
[[nodiscard]] double measure_fma_peak_gflops(int num_threads, DType dtype, int repeats = 3);

/// An in-process all-reduce (comm/inproc.hpp) of `bytes` of F32 between
/// `num_ranks` threads, best of `repeats`. Returns the bytes one rank sends
/// per second, counting the ring-equivalent volume 2 (n-1)/n * bytes (the
/// convention of sim/cost_model.hpp).
[[nodiscard]] double measure_inproc_allreduce_bytes_per_s(int num_ranks = 2, long bytes = 8L << 20,
                                                          int repeats = 5);
/// Seconds of one all-reduce of a single float between `num_ranks` threads
/// (median of `repeats`): the per-collective latency.
[[nodiscard]] double measure_inproc_allreduce_latency_s(int num_ranks = 2, int repeats = 200);

}  // namespace shardline::sim::calibration
