#pragma once
/// \file
/// This machine as a simulator device (sim::DeviceSpec, "cpu"): its limits
/// measured now, and the cost model's efficiency terms fitted to real engine
/// steps (`shardline simulate --calibrate`, docs/simulator.md).
///
/// Measured (sim/calibration/hardware.hpp, all cores): peak_flops = Shardline's own
/// batch-invariant linear on 2048^3 (the GEMM every step runs),
/// memory_bw_bytes_per_s = STREAM triad, the in-process all-reduce's
/// bandwidth and latency for the links (CPU devices are threads of one
/// process), host_link_bw_bytes_per_s = a memcpy's rate (a Seesaw swap or
/// a SiDP weight fetch between CPU devices is one), memory_bytes =
/// MemAvailable. CPU devices share one memory bus.
///
/// Fitted (calibrate only): real decode runs of `shape` on one device, at a
/// small batch (the step reads weights: memory-bound), a large one
/// (compute-bound) and curve_batches between, each run as the validation's
/// cases run (sim::calibration::run_parallel_bench: the engine on its own thread; the
/// median model time of pure-decode steps at full batch = step wall minus
/// the engine's own time, scheduling and sampling; the large batch also
/// runs prefill-only for the prefill rate). With the cost model's raw times
/// at those batches (data / memory bandwidth, FLOPs / GEMM rate):
///   step_overhead_ms     = the engine's per-step time outside the model
///   memory_bw_efficiency = T_mem(small) / measured model time(small), capped at 1
///   gemm_efficiency      = T_comp(large) / measured model time(large), capped at 1
/// where the small batch is taken as memory-bound and the large one as
/// compute-bound; each fitted number's source line gives the measurement.
///
/// Between the two a decode step is neither: the engine overlaps its
/// weight reads with its FLOPs only in part, so a roofline with one GEMM
/// efficiency prices a batch of 16 or 32 10-17% fast (measured by
/// `simulate --validate`). So decode runs at curve_batches too, and
///   gemm_efficiency_by_rows(b) = the fraction of peak_flops at which the
///       cost model's step at batch b (with the fitted memory terms) takes
///       the measured model time (bisection; at a memory-bound batch, the
///       least fraction that keeps the step memory-bound)
/// for every batch run: the achieved fraction of the GEMM peak by the rows
/// of the step (sim::DeviceSpec::gemm_efficiency_by_rows).
///
/// Repeats. This machine has slow episodes (a neighbour takes part of a
/// core for tens of seconds) and they only ever slow it. So each
/// measurement above is made `repeats` times, interleaved (triad, linear,
/// small run, large run, the split's runs, then again), and the fastest of
/// each is kept: the machine's undisturbed speed, which a run between two
/// episodes sees.
///
/// The split fit (on >= 2 threads): the same runs, each as 2 engines at
/// once on half the threads (a dp=2 run: what a config of 2 CPU devices
/// does; the engines are built first and start together), and
/// Shardline's linear on half the threads for the peak. The terms fitted
/// there go into sim::DeviceSpec::split, which prices runs with 2 or more
/// busy devices: threads that do not share one GEMM lose less time to
/// synchronisation than the all-thread device's 1/N slices assume.
///
/// The TP fit (with the split, tp_fit): decode runs of one tp=2 group (the
/// 2 devices in tensor parallelism) at the same batches, and the split
/// device's tp_gemm_efficiency_by_rows fitted to them as above, on the
/// cost model's tp=2 step. A DP device's curve prices TP ranks 6-25% fast
/// at batch 32 (measured by `simulate --validate`), and more at larger
/// batches: TP ranks run in lockstep, an all-reduce after o_proj and after
/// down_proj of each layer, so each waits for the slower rank and their
/// memory-bound phases fall at the same time, where DP ranks drift apart
/// and overlap one's attention with the other's GEMMs
/// (sim::HardwareSpec::tp_flops_by_rows).
///
/// The Shift fit (with the TP fit, shift_fit): decode runs of one Shift
/// group (seed 001: base sp=2, its decode steps in the shift config tp=2 on
/// the same devices and KV cache) at the same batches, and the split
/// device's shift_gemm_efficiency_by_rows fitted to them as the TP curve
/// is. On this machine a Shift group's tp=2 decode steps ran 0-10% faster
/// than a plain tp=2 group's (every kernel alike; the cause is not found,
/// docs/simulator.md), and a TP curve priced them up to 22% slow.
///
/// The WaS fit (with the split, was_fit): decode runs of one SiDP group of
/// the 2 devices in WaS (seed 002 §4.1; each rank owns half the FFN layers
/// and its housekeeper thread fetches the others over a paced link) at the
/// same batches, and the split device's was_copy_exposed_by_rows fitted to
/// them: the fraction of the fetch copy that the step shows. The simulator
/// first added the whole copy and priced WaS's decode step 8-18% slow
/// (`simulate --validate`, 2026-11-28): a CPU rank's copy runs on a
/// housekeeper thread beside the compute thread and partly hides.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/paced.hpp"
#include "common/result.hpp"
#include "model/config.hpp"
#include "sim/hardware_spec.hpp"

namespace shardline::sim::calibration {

struct CalibrateOptions {
  std::string shape_dir;  ///< a model shape folder (config.json); dummy weights
  int num_threads = 0;    ///< 0: all cores
  int small_batch = 4;
  int large_batch = 64;
  /// Decode runs at these batches too (between small and large): with
  /// those two, the points of gemm_efficiency_by_rows.
  std::vector<int> curve_batches = {8, 16, 32};
  int input_len = 64;
  int output_len = 32;
  /// Also fit the device split over 2 devices running at once
  /// (sim::DeviceSpec::split), when there are >= 2 threads.
  bool split = true;
  /// With split: also fit the split device's TP curve
  /// (sim::DeviceSpec::tp_gemm_efficiency_by_rows) to decode runs of one
  /// tp=2 group at the same batches.
  bool tp_fit = true;
  /// With tp_fit: also fit the split device's Shift curve
  /// (sim::DeviceSpec::shift_gemm_efficiency_by_rows) to decode runs of one
  /// Shift group (base sp=2; steps of <= shift_threshold tokens, every
  /// decode step here, in tp=2) at the same batches.
  bool shift_fit = true;
  long long shift_threshold = 256;
  /// With split: also fit the split device's WaS copy exposure
  /// (sim::DeviceSpec::was_copy_exposed_by_rows) to decode runs of one SiDP
  /// group of its devices in WaS at the same batches, their link paced to
  /// was_link_ratio x the measured triad (as `simulate --validate` paces
  /// its SiDP cases) with was_link_latency_us per transfer.
  bool was_fit = true;
  double was_link_ratio = 0.19;
  double was_link_latency_us = 10;
  /// Each measurement made this many times, interleaved; the fastest kept.
  int repeats = 3;
};

/// One measured decode run at `batch` sequences per device.
struct DecodeRun {
  double model_step_ms = 0;  ///< median model time of pure-decode steps at full batch (step wall - own), ms
  double own_ms = 0;         ///< the engine's own time (scheduling, sampling) in those steps, median, ms
  double prefill_tok_s = 0;  ///< prompt tokens / wall time of a prefill-only run (the large batch's)
};

/// The calibration made round by round: each measure_round() makes every
/// measurement once (triad, linear, the decode runs of each fit), keeping
/// the fastest of each over the rounds; fit() fits the device to the
/// fastest. calibrate_cpu_device is `repeats` rounds, then fit().
/// `simulate --validate` interleaves the rounds with its cases' rounds, so
/// that a slow period of the machine falls on both sides of the comparison.
class CpuCalibration {
 public:
  /// Errors: invalid_argument (non-positive sizes), the shape folder's
  /// config errors.
  [[nodiscard]] static Result<CpuCalibration> create(const CalibrateOptions& options);
  /// One round of every measurement. Errors: engine build and run errors.
  [[nodiscard]] Status measure_round();
  /// The device fitted to the fastest of each measurement so far. Errors:
  /// invalid_argument before the first round.
  [[nodiscard]] Result<sim::DeviceSpec> fit() const;
  [[nodiscard]] int rounds() const { return rounds_; }
  /// The WaS fit's paced link: was_link_ratio x the first round's triad
  /// (gbps 0 before the first round).
  [[nodiscard]] const comm::LinkSpec& was_link() const { return was_link_; }

 private:
  static constexpr int kDevices = 2;  ///< the split fit: 2 devices, each on half the threads, running at once
  CalibrateOptions o_;
  std::shared_ptr<const model::ModelConfig> config_;
  int threads_ = 1, per_device_ = 1;
  bool split_ = false;
  std::vector<int> batches_;  ///< of the decode runs, ascending: small, the curve's, large
  int rounds_ = 0;
  sim::DeviceSpec measured_;  ///< the machine's limits, the fastest of each
  double split_linear_ = 0;   ///< GFLOP/s on per_device_ threads, the fastest
  comm::LinkSpec was_link_;
  /// {batch, the fastest run}, ascending in batch.
  std::vector<std::pair<int, DecodeRun>> runs_, split_runs_, tp_runs_, shift_runs_, was_runs_;
};

/// The CPU device with measured limits and neutral efficiency terms (1, 1,
/// overhead 0): what `simulate` uses without a calibration file. A few
/// seconds.
[[nodiscard]] sim::DeviceSpec measure_cpu_device(int num_threads = 0);

/// measure_cpu_device plus the fitted terms. Errors: engine build errors
/// (a bad shape folder), invalid_argument (non-positive sizes).
[[nodiscard]] Result<sim::DeviceSpec> calibrate_cpu_device(const CalibrateOptions& options);

}  // namespace shardline::sim::calibration
