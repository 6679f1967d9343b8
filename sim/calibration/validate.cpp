#include "sim/calibration/validate.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "sim/calibration/calibrate.hpp"
#include "sim/calibration/parallel.hpp"
#include "sim/calibration/workload.hpp"
#include "engine/group/engine_builder.hpp"
#include "model/config.hpp"

namespace shardline::sim::calibration {
namespace {

engine::ParallelConfig config_of(int tp, int pp, int sp, int dp) {
  engine::ParallelConfig pc;
  pc.tp = tp;
  pc.pp = pp;
  pc.sp = sp;
  pc.dp = dp;
  return pc;
}

struct Measured {
  double total_tok_s = 0, decode_step_ms = 0;
};

/// The case run for real: its strategy as engine options on CPU devices,
/// the machine's threads split over them.
Result<Measured> measure_case(const ValidationCase& c, const ValidateOptions& o, int threads,
                              const comm::LinkSpec& sidp_link) {
  const sim::Strategy& s = c.strategy;
  ParallelBenchOptions po;
  po.engine.model_dir = o.shape_dir;
  po.engine.load_format = model::LoadFormat::dummy;
  po.engine.num_threads = std::max(1, threads / s.parallel.world_size());
  if (s.shift) po.engine.shift = engine::ShiftOptions{*s.shift};
  if (s.seesaw) {
    po.engine.seesaw = s.seesaw->policy;
    po.engine.parallel_decode = s.seesaw->decode;
  }
  if (s.sidp) {
    engine::SidpOptions so;
    so.initial_mode = s.sidp->mode == engine::SidpModeSetting::cas ? engine::SidpMode::cas : engine::SidpMode::was;
    so.link = sidp_link;
    so.cache_slots = s.sidp->cache_slots;
    po.sidp = so;
  }
  po.configs = {s.parallel};
  po.token_budgets = {s.token_budget};
  po.num_prompts = o.num_prompts;
  po.input_len = o.input_len;
  po.output_len = o.output_len;
  po.max_batch = o.max_batch;
  po.measure_hardware = false;
  po.prefill_run = false;  // (total tok/s and the decode step come from the full run)
  auto r = run_parallel_bench(po);
  if (!r) return r.error();
  if (r->results.size() != 1)
    return make_error(ErrorCode::internal, "validate: case " + c.name + " gave " + std::to_string(r->results.size()) +
                                               " results, not 1");
  return Measured{r->results[0].total_tok_s, r->results[0].decode_step_ms};
}

}  // namespace

const std::vector<std::string>& validation_case_names() {
  static const std::vector<std::string> names = {"single", "tp=2",  "pp=2-fixed", "pp=2-throttle", "sp=2",
                                                 "dp=2",   "shift", "seesaw",     "sidp-was",      "sidp-cas"};
  return names;
}

Result<ValidationCase> validation_case(const std::string& name, const ValidateOptions& o) {
  ValidationCase c;
  c.name = name;
  sim::Strategy& s = c.strategy;
  if (name == "single") {
    s.parallel = config_of(1, 1, 1, 1);
  } else if (name == "tp=2") {
    s.parallel = config_of(2, 1, 1, 1);
  } else if (name == "pp=2-fixed" || name == "pp=2-throttle") {
    s.parallel = config_of(1, 2, 1, 1);
    s.token_budget = name == "pp=2-fixed" ? "fixed" : "throttle";
  } else if (name == "sp=2") {
    s.parallel = config_of(1, 1, 2, 1);
  } else if (name == "dp=2") {
    s.parallel = config_of(1, 1, 1, 2);
  } else if (name == "shift") {  // Shift Parallelism (seed 001): base sp=2, shift config tp=2
    s.parallel = config_of(1, 1, 2, 1);
    engine::ShiftPolicyOptions shift;
    shift.threshold = o.shift_threshold;
    s.shift = shift;
  } else if (name == "seesaw") {  // Seesaw (seed 000): prefill in pp=2, decode in tp=2
    s.parallel = config_of(1, 2, 1, 1);
    sim::SeesawStrategy seesaw;
    seesaw.decode = config_of(2, 1, 1, 1);
    // The engine's host KV buffer is its swap space (EngineOptions default).
    seesaw.host_buffer_bytes_per_device =
        static_cast<double>(engine::EngineOptions{}.swap_space_bytes) / s.parallel.group_size();
    s.seesaw = seesaw;
  } else if (name == "sidp-was" || name == "sidp-cas") {  // SiDP (seed 002), one mode throughout
    s.parallel = config_of(1, 1, 1, 2);
    sim::SidpStrategy sidp;
    sidp.mode = name == "sidp-was" ? engine::SidpModeSetting::was : engine::SidpModeSetting::cas;
    s.sidp = sidp;
  } else {
    std::string all;
    for (const std::string& n : validation_case_names()) all += (all.empty() ? "" : ", ") + n;
    return make_error(ErrorCode::invalid_argument, "unknown validation case '" + name + "' (cases: " + all + ")");
  }
  return c;
}

bool rounds_agree(const ValidationRow& row, double agreement) {
  const auto two_best_agree = [agreement](std::vector<double> v, bool higher_is_faster) {
    if (v.size() < 2) return false;
    std::sort(v.begin(), v.end());
    if (higher_is_faster) std::reverse(v.begin(), v.end());
    return v[0] > 0 && v[1] > 0 && std::abs(v[1] / v[0] - 1) <= agreement;
  };
  return two_best_agree(row.round_total_tok_s, true) && two_best_agree(row.round_decode_step_ms, false);
}

Result<ValidationReport> run_validation(const ValidateOptions& o,
                                        const std::function<void(const ValidationRow&)>& progress) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 2 || o.max_batch < 1 || o.min_rounds < 1 ||
      o.max_rounds < o.min_rounds || o.calibration_repeats < 1 || !(o.agreement > 0) || !(o.sidp_link_ratio > 0))
    return make_error(ErrorCode::invalid_argument,
                      "validate: need positive sizes, output_len >= 2, 1 <= min_rounds <= max_rounds, "
                      "calibration_repeats >= 1, agreement > 0 and sidp_link_ratio > 0");
  std::vector<ValidationCase> cases;
  for (const std::string& name : o.cases.empty() ? validation_case_names() : o.cases) {
    auto c = validation_case(name, o);
    if (!c) return c.error();
    cases.push_back(std::move(c).value());
  }
  auto config = model::load_model_config(o.shape_dir);
  if (!config) return config.error();
  const int threads = o.num_threads > 0 ? o.num_threads : omp_get_num_procs();
  const auto t0 = Clock::now();

  ValidationReport rep;
  CalibrateOptions co;
  co.shape_dir = o.shape_dir;
  co.num_threads = threads;
  co.repeats = o.calibration_repeats;
  co.was_link_ratio = o.sidp_link_ratio;  // (the WaS fit's runs paced as the SiDP cases are)
  co.was_link_latency_us = o.sidp_link_latency_us;
  co.shift_threshold = o.shift_threshold;  // (the Shift fit's group as the shift case's)
  auto calibration = CpuCalibration::create(co);
  if (!calibration) return calibration.error();
  rep.calibration_repeats = co.repeats;
  comm::LinkSpec link;  // the SiDP cases' link, real and simulated alike: the calibration's WaS link

  // Rounds: a calibration round (while calibration_repeats last), then
  // every case not yet done. A slow period of the machine falls on
  // different cases in different rounds, and on the calibration as on the
  // cases; each measurement keeps its fastest.
  rep.rows.resize(cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    rep.rows[i].name = cases[i].name;
    rep.rows[i].strategy = cases[i].strategy.label();
  }
  for (int round = 0; round < std::max(o.max_rounds, o.calibration_repeats); ++round) {
    bool ran = false;
    if (round < o.calibration_repeats) {
      std::fprintf(stderr, "validate: calibration round %d of %d on %s\n", round + 1, o.calibration_repeats,
                   o.shape_dir.c_str());
      if (Status st = calibration->measure_round(); !st.ok()) return st.error();
      ran = true;
      if (round == 0) {
        link = calibration->was_link();
        rep.sidp_link_gbps = link.gbps;
      }
    }
    for (std::size_t i = 0; i < cases.size() && round < o.max_rounds; ++i) {
      ValidationRow& row = rep.rows[i];
      if (round >= o.min_rounds && row.steady) continue;
      auto m = measure_case(cases[i], o, threads, link);
      if (!m) return m.error();
      ran = true;
      row.round_total_tok_s.push_back(m->total_tok_s);
      row.round_decode_step_ms.push_back(m->decode_step_ms);
      const auto [lo, hi] = std::minmax_element(row.round_total_tok_s.begin(), row.round_total_tok_s.end());
      row.measured_total_tok_s = *hi;
      row.spread = *lo > 0 ? *hi / *lo - 1 : 0;
      row.measured_decode_step_ms = *std::min_element(row.round_decode_step_ms.begin(), row.round_decode_step_ms.end());
      row.steady = rounds_agree(row, o.agreement);
      if (progress) progress(row);
      rep.rounds = std::max(rep.rounds, round + 1);
    }
    if (!ran) break;
  }

  // The simulations, on the device fitted to the fastest calibration runs.
  auto device = calibration->fit();
  if (!device) return device.error();
  rep.device = *device;
  const auto workload = sim::fixed_workload(o.num_prompts, o.input_len, o.output_len);
  sim::SimOptions so;
  so.max_batch = o.max_batch;
  so.dispatch = sim::SimOptions::Dispatch::round_robin;  // as in-process DP deals them
  const auto err = [](double simulated, double measured) { return measured > 0 ? simulated / measured - 1 : 0.0; };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const ValidationCase& c = cases[i];
    sim::ClusterSpec cluster;
    cluster.name = "cpu";
    cluster.device = *device;
    cluster.num_devices = std::max(1, c.strategy.parallel.world_size());
    if (c.strategy.sidp) {
      cluster.device.intra_node_bw_bytes_per_s = {link.gbps * 1e9, "the validation's emulated SiDP link"};
      cluster.device.intra_node_latency_s = {link.latency_us * 1e-6, "the validation's emulated SiDP link"};
    }
    auto sim_result = sim::simulate(*config, cluster, c.strategy, workload, so);
    if (!sim_result) return sim_result.error();
    ValidationRow& row = rep.rows[i];
    row.simulated_total_tok_s = sim_result->total_tok_s;
    row.simulated_decode_step_ms = sim_result->decode_step_ms;
    row.total_tok_s_error = err(row.simulated_total_tok_s, row.measured_total_tok_s);
    row.decode_step_ms_error = err(row.simulated_decode_step_ms, row.measured_decode_step_ms);
  }
  rep.wall_s = seconds_since(t0);
  return rep;
}

}  // namespace shardline::sim::calibration
