#pragma once
/// \file
/// The simulator against this machine (`shardline simulate --validate`,
/// docs/simulator.md "Validation against this machine"). Each case runs for
/// real, on in-process CPU devices (sim::calibration::run_parallel_bench), and
/// simulated (sim::simulate) on the CPU device calibrated in the same
/// rounds (sim/calibration/calibrate.hpp). The two are compared on total tok/s and on the
/// decode step time (bench's definitions of both).
///
/// Drift control. This machine's speed moves with its neighbours' load: it
/// has slow episodes (another tenant takes part of a core for tens of
/// seconds) in which a step is 20-40% slower, more than the 15% bound the
/// validation checks, and an episode does not slow every config alike (a
/// 2-thread device loses more to a stolen core than two 1-thread devices
/// do). Episodes only ever slow the machine, so the validation compares the
/// simulation with the machine's undisturbed speed: the fastest of several
/// measurements.
///  - The calibration makes each of its measurements `calibration_repeats`
///    times, interleaved, and keeps the fastest (sim/calibration/calibrate.hpp).
///  - The cases run in rounds: case 1, case 2, ..., case 10, then again, so
///    an episode falls on different cases in different rounds. Each of the
///    first `calibration_repeats` rounds begins with a calibration round,
///    so a slow period falls on the calibration as on the cases: with the
///    calibration made first, one slow period after it held every case and
///    put them all 3-18% below the simulation (2026-11-28). Each case
///    keeps its fastest total tok/s and its fastest decode step. A case is
///    steady when its two fastest rounds agree within `agreement` on both:
///    the best was seen twice, so it is the machine's speed, not a fluke.
///    After `min_rounds`, only the cases not yet steady run again, up to
///    `max_rounds`.
///
/// An earlier version gated each measurement on a speed probe run between
/// the cases; the probe did not see every disturbance of the runs around
/// it, and a calibration between two steady probes still came out 20-25%
/// slow once (docs/simulator.md).
///
/// Real runs use the machine's threads split over the case's devices (one
/// thread per device of a 2-device case on 2 cores), as CPU devices do.

#include <functional>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "sim/hardware_spec.hpp"
#include "sim/simulator.hpp"

namespace shardline::sim::calibration {

struct ValidateOptions {
  std::string shape_dir;  ///< a model shape folder (config.json); dummy weights
  int num_threads = 0;    ///< the machine's threads (0: all cores)
  /// The cases, by name (validation_case_names()); empty: all of them.
  std::vector<std::string> cases;
  int num_prompts = 32, input_len = 64, output_len = 32;  ///< every case's workload
  int max_batch = 32;  ///< running sequences at most per engine group
  /// Shift: steps of at most this many tokens run in the shift config
  /// (decodes do; the 2048-token prefill steps do not).
  long long shift_threshold = 256;
  /// SiDP: the emulated link between ranks (comm/paced.hpp) at this fraction
  /// of the measured triad bandwidth (H200: NVLink 900 GB/s / HBM 4.8 TB/s).
  double sidp_link_ratio = 0.19;
  double sidp_link_latency_us = 10;
  double agreement = 0.10;      ///< a case is steady when its two fastest rounds differ by at most this
  int min_rounds = 3;           ///< every case is measured this many times
  int max_rounds = 5;           ///< a case not yet steady is measured again, up to this many times
  int calibration_repeats = 3;  ///< calibration rounds (CalibrateOptions::repeats), one before each case round
};

/// A validated case: its name and what the simulator runs.
struct ValidationCase {
  std::string name;
  sim::Strategy strategy;
};

/// single, tp=2, pp=2-fixed, pp=2-throttle, sp=2, dp=2, shift, seesaw,
/// sidp-was, sidp-cas.
[[nodiscard]] const std::vector<std::string>& validation_case_names();

/// The case called `name`. Errors: invalid_argument naming it and listing
/// validation_case_names().
[[nodiscard]] Result<ValidationCase> validation_case(const std::string& name, const ValidateOptions& options);

struct ValidationRow {
  std::string name;      ///< the case
  std::string strategy;  ///< sim::Strategy::label()
  /// Every round's measurement, in order (total tok/s and decode step ms).
  std::vector<double> round_total_tok_s, round_decode_step_ms;
  bool steady = false;   ///< the two fastest rounds agree within ValidateOptions::agreement on both
  double spread = 0;     ///< fastest / slowest total tok/s - 1: how much the machine moved
  double measured_total_tok_s = 0, simulated_total_tok_s = 0;      ///< measured: the fastest round's
  double measured_decode_step_ms = 0, simulated_decode_step_ms = 0;  ///< measured: the fastest round's
  double total_tok_s_error = 0;     ///< simulated / measured - 1
  double decode_step_ms_error = 0;  ///< simulated / measured - 1
};

struct ValidationReport {
  sim::DeviceSpec device;          ///< the calibrated CPU device the cases were simulated on
  int calibration_repeats = 0;     ///< each calibration measurement was made this many times
  int rounds = 0;                   ///< rounds of cases run
  double sidp_link_gbps = 0;       ///< the SiDP cases' emulated link
  std::vector<ValidationRow> rows;
  double wall_s = 0;
};

/// Whether a row's two fastest rounds agree within `agreement` on both
/// measurements (false with fewer than 2 rounds).
[[nodiscard]] bool rounds_agree(const ValidationRow& row, double agreement);

/// Measures in rounds: a calibration round (CpuCalibration::measure_round,
/// in the first calibration_repeats rounds), then each case not yet done;
/// then fits the device to the fastest calibration runs and simulates each
/// case on it. Interleaved, a slow period of the machine falls on the
/// calibration as on the cases (before, a calibration made minutes before
/// the cases missed slow periods that then held whole cases).
/// `progress` (optional) sees each row after each of its rounds (its
/// simulated values are not known yet). Errors: a
/// bad case name or shape folder, engine and simulator errors.
[[nodiscard]] Result<ValidationReport> run_validation(const ValidateOptions& options,
                                                      const std::function<void(const ValidationRow&)>& progress = {});

}  // namespace shardline::sim::calibration
