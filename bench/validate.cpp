#include "bench/validate.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "bench/calibrate.hpp"
#include "bench/parallel.hpp"
#include "bench/workload.hpp"
#include "engine/data_parallel.hpp"
#include "engine/engine_builder.hpp"
#include "engine/kv_budget.hpp"
#include "model/config.hpp"

namespace shardline::bench {
namespace {

engine::ParallelConfig config_of(int tp, int pp, int sp, int dp) {
  engine::ParallelConfig pc;
  pc.tp = tp;
  pc.pp = pp;
  pc.sp = sp;
  pc.dp = dp;
  return pc;
}

/// The speed probe: one single-device engine on all threads, kept for the
/// whole validation; each probe is a short decode run at a fixed batch and
/// returns the median step time of its pure-decode steps at full batch.
class SpeedProbe {
 public:
  static Result<SpeedProbe> create(const ValidateOptions& o, const model::ModelConfig& config, int threads) {
    engine::EngineOptions eo;
    eo.model_dir = o.shape_dir;
    eo.load_format = model::LoadFormat::dummy;
    eo.num_threads = threads;
    eo.max_num_seqs = o.probe_batch;
    eo.max_model_len = o.probe_input_len + o.probe_output_len;
    // KV for the probe's sequences (and a block each of slack), not a share
    // of free memory: the cases' engines need that.
    const std::uint64_t kv_per_token =
        engine::kv_bytes_per_block(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, 1,
                                   static_cast<int>(dtype_size(eo.kv_cache_dtype)));
    eo.kv_cache_bytes = kv_per_token * static_cast<std::uint64_t>(o.probe_batch) *
                        static_cast<std::uint64_t>(eo.max_model_len + 2 * eo.block_size);
    omp_set_num_threads(threads);
    auto e = engine::build_engine(eo);
    if (!e) return e.error();
    SpeedProbe p;
    p.instance_ = std::make_unique<engine::EngineInstance>(std::move(e).value());
    p.prompts_ = random_prompts(o.probe_batch, o.probe_input_len, config.vocab_size, 7);
    p.params_.temperature = 0.0f;
    p.params_.ignore_eos = true;
    p.params_.max_tokens = o.probe_output_len;
    p.threads_ = threads;
    p.batch_ = o.probe_batch;
    return p;
  }

  Result<double> measure() {
    engine::LlmEngine* e = instance_->engine.get();
    e->clear_step_stats();
    omp_set_num_threads(threads_);
    if (auto out = engine::generate_data_parallel({e}, prompts_, params_, threads_); !out) return out.error();
    const double ms = decode_median_ms(*e, batch_);
    if (!(ms > 0)) return make_error(ErrorCode::internal, "validate: the speed probe ran no full-batch decode step");
    return ms;
  }

 private:
  std::unique_ptr<engine::EngineInstance> instance_;
  std::vector<std::vector<std::int32_t>> prompts_;
  sampling::SamplingParams params_;
  int threads_ = 1, batch_ = 1;
};

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

Result<ValidationReport> run_validation(const ValidateOptions& o,
                                        const std::function<void(const ValidationRow&)>& progress) {
  if (o.num_prompts < 1 || o.input_len < 1 || o.output_len < 2 || o.max_batch < 1 || o.max_attempts < 1 ||
      !(o.drift_tolerance > 0) || !(o.sidp_link_ratio > 0) || o.probe_batch < 1 || o.probe_output_len < 3)
    return make_error(ErrorCode::invalid_argument,
                      "validate: need positive sizes, output_len >= 2, max_attempts >= 1, drift_tolerance > 0, "
                      "sidp_link_ratio > 0 and a probe of >= 3 output tokens");
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
  auto probe = SpeedProbe::create(o, *config, threads);
  if (!probe) return probe.error();
  // The calibration, between two probes near the fastest seen: slow
  // episodes only ever slow the machine, so the fastest probe is its
  // undisturbed speed, and a calibration taken in an episode (or across its
  // edge) would bias every prediction.
  auto first = probe->measure();
  if (!first) return first.error();
  auto before_cal = probe->measure();
  if (!before_cal) return before_cal.error();
  double fastest_ms = std::min(*first, *before_cal);
  const auto near_fastest = [&](double ms) { return ms / fastest_ms - 1 <= o.drift_tolerance; };
  std::optional<sim::DeviceSpec> device;
  for (rep.calibration_attempts = 1;; ++rep.calibration_attempts) {
    std::fprintf(stderr, "validate: calibrating on %s\n", o.shape_dir.c_str());
    auto d = calibrate_cpu_device(co);
    if (!d) return d.error();
    device = std::move(d).value();
    auto after_cal = probe->measure();
    if (!after_cal) return after_cal.error();
    fastest_ms = std::min(fastest_ms, *after_cal);
    rep.calibration_probe_ms = (*before_cal + *after_cal) / 2;
    const bool steady = near_fastest(*before_cal) && near_fastest(*after_cal);
    const double before_ms = *before_cal;
    before_cal = after_cal;
    if (steady || rep.calibration_attempts >= o.max_attempts) break;
    std::fprintf(stderr,
                 "validate: the probes around the calibration took %.1f and %.1f ms, the fastest %.1f; "
                 "calibrating again\n",
                 before_ms, *after_cal, fastest_ms);
  }
  rep.device = *device;
  const double last_probe_ms = *before_cal;

  // The SiDP cases' link, real and simulated alike.
  comm::LinkSpec link;
  link.gbps = o.sidp_link_ratio * device->memory_bw_bytes_per_s.value / 1e9;
  link.latency_us = o.sidp_link_latency_us;
  rep.sidp_link_gbps = link.gbps;

  const auto workload = sim::fixed_workload(o.num_prompts, o.input_len, o.output_len);
  sim::SimOptions so;
  so.max_batch = o.max_batch;
  so.dispatch = sim::SimOptions::Dispatch::round_robin;  // as in-process DP deals them

  double before = last_probe_ms;
  for (const ValidationCase& c : cases) {
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

    ValidationRow row;
    row.name = c.name;
    row.strategy = c.strategy.label();
    Measured m;
    const auto near_calibration = [&](double ms) {
      return std::abs(ms / rep.calibration_probe_ms - 1) <= o.drift_tolerance;
    };
    double after = before;
    for (row.attempts = 1;; ++row.attempts) {
      auto got = measure_case(c, o, threads, link);
      if (!got) return got.error();
      m = *got;
      auto p = probe->measure();
      if (!p) return p.error();
      after = *p;
      row.steady = near_calibration(before) && near_calibration(after);
      if (row.steady || row.attempts >= o.max_attempts) break;
      std::fprintf(stderr,
                   "validate: %s: the probes around the run took %.1f and %.1f ms, the calibration's %.1f; "
                   "measuring again\n",
                   c.name.c_str(), before, after, rep.calibration_probe_ms);
      before = after;
    }
    row.probe_before_ms = before;
    row.probe_after_ms = after;
    row.speed = rep.calibration_probe_ms / ((before + after) / 2);
    row.measured_total_tok_s = m.total_tok_s;
    row.measured_decode_step_ms = m.decode_step_ms;
    row.simulated_total_tok_s = sim_result->total_tok_s;
    row.simulated_decode_step_ms = sim_result->decode_step_ms;
    const auto err = [](double simulated, double measured) { return measured > 0 ? simulated / measured - 1 : 0.0; };
    row.total_tok_s_error = err(row.simulated_total_tok_s, m.total_tok_s);
    row.decode_step_ms_error = err(row.simulated_decode_step_ms, m.decode_step_ms);
    if (progress) progress(row);
    rep.rows.push_back(row);
    before = after;
  }
  rep.wall_s = seconds_since(t0);
  return rep;
}

}  // namespace shardline::bench
