#pragma once
/// \file
/// The simulator against this machine (`shardline simulate --validate`,
/// docs/simulator.md "Validation against this machine"). Each case runs for
/// real, on in-process CPU devices (bench::run_parallel_bench), and
/// simulated (sim::simulate) on the CPU device calibrated at the start
/// (bench/calibrate.hpp). The two are compared on total tok/s and on the
/// decode step time (bench's definitions of both).
///
/// Drift control. This machine's speed moves with its neighbours' load: it
/// has slow episodes (another tenant takes part of a core) in which a
/// 2-thread step is 20-30% slower, more than the 15% bound the validation
/// checks. So a speed probe (a short single-device decode run at a fixed
/// batch on all threads: its median step, ms) runs right before and after
/// the calibration, and again between cases: probe, case 1, probe, case 2,
/// ..., probe. A measurement counts only when the probes on both sides of
/// it are within drift_tolerance of the calibration's: the machine was as
/// fast as when it was calibrated. Otherwise the case is measured again (up
/// to max_attempts) and its row says whether it was steady in the end.
///
/// Why not correct for the drift instead: an episode does not slow every
/// config alike. Scaling the predictions by the probe's slowdown made them
/// worse (a 2-thread probe loses more to a stolen core than two 1-thread
/// devices do), so the validation compares like with like.
///
/// The calibration likewise runs between two probes, and again (up to
/// max_attempts) while either is more than drift_tolerance slower than the
/// fastest probe seen: episodes only ever slow the machine, so the fastest
/// probe is its undisturbed speed.
///
/// Real runs use the machine's threads split over the case's devices (one
/// thread per device of a 2-device case on 2 cores), as CPU devices do.

#include <functional>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "sim/hardware_spec.hpp"
#include "sim/simulator.hpp"

namespace shardline::bench {

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
  double drift_tolerance = 0.10;  ///< a probe may differ from the calibration's by this much
  int max_attempts = 4;           ///< measurements of a case (and calibrations) at most
  int probe_batch = 32, probe_input_len = 32, probe_output_len = 12;  ///< the speed probe
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
  int attempts = 0;      ///< measurements taken (the last one is reported)
  bool steady = false;   ///< both probes within drift_tolerance of the calibration's
  double probe_before_ms = 0, probe_after_ms = 0;  ///< the speed probe around the kept measurement
  double speed = 1;      ///< calibration probe / mean of the two (information only)
  double measured_total_tok_s = 0, simulated_total_tok_s = 0;
  double measured_decode_step_ms = 0, simulated_decode_step_ms = 0;
  double total_tok_s_error = 0;     ///< simulated / measured - 1
  double decode_step_ms_error = 0;  ///< simulated / measured - 1
};

struct ValidationReport {
  sim::DeviceSpec device;          ///< the calibrated CPU device the cases were simulated on
  double calibration_probe_ms = 0;  ///< mean of the probes right before and after the calibration
  int calibration_attempts = 0;     ///< calibrations made (again while a probe was slow)
  double sidp_link_gbps = 0;       ///< the SiDP cases' emulated link
  std::vector<ValidationRow> rows;
  double wall_s = 0;
};

/// Calibrates, then measures and simulates each case with the probes around
/// it. `progress` (optional) sees each row as it is done. Errors: a bad
/// case name or shape folder, engine and simulator errors.
[[nodiscard]] Result<ValidationReport> run_validation(const ValidateOptions& options,
                                                      const std::function<void(const ValidationRow&)>& progress = {});

}  // namespace shardline::bench
