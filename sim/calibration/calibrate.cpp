#include "sim/calibration/calibrate.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "sim/calibration/hardware.hpp"
#include "sim/calibration/parallel.hpp"
#include "engine/group/parallel_executor.hpp"
#include "engine/kv_budget.hpp"
#include "engine/sidp/sidp_group.hpp"
#include "engine/sidp_memory.hpp"
#include "model/config.hpp"
#include "sim/cost_model.hpp"
#include "sim/simulator.hpp"

namespace shardline::sim::calibration {
namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0) {  // (printf-style, up to 3 numbers)
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

/// A decode run of `pc` on CPU devices of `threads` threads each, run as
/// the validation's cases run (sim::calibration::run_parallel_bench): the engines are
/// built first and start together, each on its own thread. `pc` is either
/// dp devices at once (dp x batch prompts dealt round-robin; the first
/// device's steps are measured) or one engine group (the TP fit's tp=2) at
/// `batch` sequences. with_prefill: a prefill-only run first, for
/// prefill_tok_s (of all devices together, per DP device).
///
/// An engine on a thread of its own, as the cases and the workers run
/// engines. (With an idle OpenMP pool left on the main thread such an
/// engine ran 10-15% slower; build_engine and generate_data_parallel now
/// free it: common/openmp_pool.hpp.)
Result<DecodeRun> decode_run(const CalibrateOptions& o, int batch, int threads, const engine::ParallelConfig& pc,
                             bool with_prefill, const std::optional<engine::SidpOptions>& sidp = std::nullopt,
                             const std::optional<engine::ShiftOptions>& shift = std::nullopt) {
  ParallelBenchOptions po;
  po.sidp = sidp;
  po.engine.shift = shift;
  po.engine.model_dir = o.shape_dir;
  po.engine.load_format = model::LoadFormat::dummy;
  po.engine.num_threads = threads;
  po.configs = {pc};
  po.token_budgets = {"fixed"};
  po.num_prompts = batch * pc.dp;
  po.input_len = o.input_len;
  po.output_len = o.output_len;
  po.max_batch = batch;
  po.measure_hardware = false;  // (measured apart)
  po.prefill_run = with_prefill;
  auto r = run_parallel_bench(po);
  if (!r) return r.error();
  if (r->results.size() != 1 || r->results[0].decode_batch != batch)
    return make_error(ErrorCode::internal, "calibrate: the decode run at batch " + std::to_string(batch) +
                                               " ran no full-batch decode step");
  const ParallelConfigResult& x = r->results[0];
  DecodeRun d;
  d.model_step_ms = std::max(0.0, x.decode_step_ms - x.decode_own_ms);
  d.own_ms = x.decode_own_ms;
  d.prefill_tok_s = x.prefill_tok_s / pc.dp;
  return d;
}

/// The faster of two runs of one shape, measurement by measurement.
DecodeRun fastest(const DecodeRun& a, const DecodeRun& b) {
  DecodeRun f = a;
  const auto lower = [](double x, double y) { return x > 0 && (y <= 0 || x < y) ? x : y; };
  f.model_step_ms = lower(a.model_step_ms, b.model_step_ms);
  f.own_ms = std::min(a.own_ms, b.own_ms);
  f.prefill_tok_s = std::max(a.prefill_tok_s, b.prefill_tok_s);
  return f;
}

/// `best` with a's measured rates raised to b's where b's are higher (and
/// its latency lowered): the faster of two measurements of the machine.
void keep_faster(sim::DeviceSpec& best, const sim::DeviceSpec& b) {
  if (b.peak_flops.value > best.peak_flops.value) best.peak_flops = b.peak_flops;
  if (b.memory_bw_bytes_per_s.value > best.memory_bw_bytes_per_s.value)
    best.memory_bw_bytes_per_s = b.memory_bw_bytes_per_s;
  if (b.host_link_bw_bytes_per_s.value > best.host_link_bw_bytes_per_s.value)
    best.host_link_bw_bytes_per_s = b.host_link_bw_bytes_per_s;
  if (b.intra_node_bw_bytes_per_s.value > best.intra_node_bw_bytes_per_s.value)
    best.intra_node_bw_bytes_per_s = b.intra_node_bw_bytes_per_s;
  if (b.intra_node_latency_s.value < best.intra_node_latency_s.value)
    best.intra_node_latency_s = b.intra_node_latency_s;
}

}  // namespace

sim::DeviceSpec measure_cpu_device(int num_threads) {
  const int threads = num_threads > 0 ? num_threads : omp_get_num_procs();
  omp_set_num_threads(threads);
  const double triad = measure_triad_bandwidth_gbs(threads);
  const double copy = measure_copy_bandwidth_gbs(threads);
  const double linear = measure_linear_gflops();
  const double ar_bw = measure_inproc_allreduce_bytes_per_s(2);
  const double ar_lat = measure_inproc_allreduce_latency_s(2);
  auto mem = engine::available_memory_bytes();
  sim::DeviceSpec d;
  d.name = "cpu";
  d.description = "this machine (" + std::to_string(threads) + " threads); CPU devices are threads sharing its memory bus";
  d.weight_dtype = DType::f32;
  d.shared_memory_bus = true;
  const std::string now = "measured on this machine by `shardline simulate` (" + std::to_string(threads) + " threads)";
  d.peak_flops = {linear * 1e9, now + ": Shardline's batch-invariant linear on 2048^3, " + fmt("%.1f GFLOP/s", linear)};
  d.memory_bw_bytes_per_s = {triad * 1e9, now + ": STREAM triad, " + fmt("%.1f GB/s", triad)};
  d.memory_bytes = {static_cast<double>(mem.ok() ? *mem : (8ull << 30)),
                    mem.ok() ? now + ": MemAvailable" : "assumption: 8 GiB (MemAvailable unreadable)"};
  d.memory_utilization = {0.5, "the engine's default --kv-cache-memory-fraction 0.5 of free memory"};
  d.devices_per_node = {1024, "every CPU device of a run is a thread of this machine"};
  d.intra_node_bw_bytes_per_s = {ar_bw, now + ": in-process all-reduce, " + fmt("%.2f GB/s sent per rank", ar_bw / 1e9)};
  d.intra_node_latency_s = {ar_lat, now + ": in-process all-reduce of one float, " + fmt("%.1f us", ar_lat * 1e6)};
  d.inter_node_bw_bytes_per_s = {1.25e9, "assumption: 10 Gb/s Ethernet between machines"};
  d.inter_node_latency_s = {50e-6, "assumption: ~50 us per TCP message"};
  d.host_link_bw_bytes_per_s = {copy * 1e9, now + ": host memory is device memory, so a copy is a memcpy: " +
                                                fmt("%.1f GB/s copied", copy)};
  d.gemm_efficiency = {1.0, "uncalibrated: peak_flops is already a measured rate"};
  d.prefill_gemm_efficiency = {1.0, "uncalibrated: peak_flops is already a measured rate"};
  d.memory_bw_efficiency = {1.0, "uncalibrated: the bandwidth is already a measured rate"};
  d.step_overhead_ms = {0.0, "uncalibrated (run `shardline simulate --calibrate`)"};
  d.seq_overhead_ms = {0.0, "uncalibrated (run `shardline simulate --calibrate`)"};
  return d;
}

namespace {

/// One of `num_devices` devices sharing d's totals, as the cost model sees
/// it: the peak at `flops_fraction`, the bandwidth at `memory_fraction`.
sim::HardwareSpec device_share(const sim::DeviceSpec& d, int num_devices, double flops_fraction,
                                        double memory_fraction) {
  const double share = 1.0 / num_devices;
  sim::HardwareSpec hw;
  hw.flops_per_s = d.peak_flops.value * flops_fraction * share;
  hw.memory_bw_bytes_per_s = d.memory_bw_bytes_per_s.value * memory_fraction * share;
  hw.comm_bw_bytes_per_s = d.intra_node_bw_bytes_per_s.value;
  hw.comm_latency_s = d.intra_node_latency_s.value;
  return hw;
}

/// Calibration runs F32 weights, KV and activations.
constexpr sim::ElementSizes kF32Sizes{4, 4, 4};

/// A full-batch decode step of a calibration run: `batch` sequences at the
/// median context of its decode steps.
sim::StepShape decode_step(const CalibrateOptions& o, int batch) {
  sim::StepShape s;
  for (int i = 0; i < batch; ++i) s.add_sequence(o.input_len + o.output_len / 2, 1);
  return s;
}

/// Fits d's efficiency terms and overheads to two decode runs of one of
/// `num_devices` devices that share d's measured totals (peak_flops and
/// memory bandwidth are the machine's: each device gets 1/num_devices).
Status fit_terms(sim::DeviceSpec& d, const model::ModelConfig& config, const CalibrateOptions& o,
                 const DecodeRun& small_run, const DecodeRun& large_run, int num_devices) {
  const DecodeRun* small = &small_run;
  const DecodeRun* large = &large_run;
  const double share = 1.0 / num_devices;
  const std::string who = num_devices > 1 ? fmt(" (each of %.0f devices running at once)", num_devices) : "";
  // The cost model's raw times (efficiency 1) at those batches, at the
  // median context of the full-batch decode steps.
  auto model = sim::CostModel::create(sim::ModelShape::from_config(config), kF32Sizes,
                                               device_share(d, num_devices, 1.0, 1.0));
  if (!model) return model.error();
  auto raw = [&](int batch) { return model->estimate(engine::ParallelConfig{}, decode_step(o, batch)); };
  auto rs = raw(o.small_batch);
  auto rl = raw(o.large_batch);
  if (!rs) return rs.error();
  if (!rl) return rl.error();
  const double t_mem_small = rs->weight_read_ms + rs->kv_read_ms;
  const std::string shape = o.shape_dir;
  // Memory: the small batch's step against weights + KV at triad rate. An
  // efficiency above 1 means the engine's reads beat triad: the rate is then
  // what the engine reached, at efficiency 1.
  {
    const double e = small->model_step_ms > 0 ? t_mem_small / small->model_step_ms : 1.0;
    const std::string run = fmt("decode at batch %.0f on ", o.small_batch) + shape + who +
                            fmt(" took %.3f ms per model step; its weights and KV at the measured rate take %.3f ms",
                                small->model_step_ms, t_mem_small);
    if (e > 1.0) {
      d.memory_bw_bytes_per_s.value *= e;  // (the machine's total, raised in proportion)
      d.memory_bw_bytes_per_s.source += "; raised by calibration: " + run;
      d.memory_bw_efficiency = {1.0, "fitted: 1 (the rate was raised to what the engine reached" + who + ")"};
    } else {
      d.memory_bw_efficiency = {e, "fitted: " + run};
    }
  }
  // Compute: the FLOP rates the engine reached in the large batch's decode
  // steps and in its prefill steps (a prefill step of large_batch prompts of
  // input_len tokens, capped at 2048 tokens per step); the peak is the
  // highest of those and the 2048^3 measurement, each efficiency its share.
  {
    sim::StepShape pre;
    const int per_step = std::max(1, std::min(o.large_batch, 2048 / o.input_len));
    for (int i = 0; i < per_step; ++i) pre.add_sequence(0, o.input_len);
    auto rp = model->estimate(engine::ParallelConfig{}, pre);
    if (!rp) return rp.error();
    const double decode_rate = large->model_step_ms > 0 ? rl->flops / (large->model_step_ms / 1e3) : 0;
    const double prefill_ms = large->prefill_tok_s > 0 ? pre.num_tokens() / large->prefill_tok_s * 1e3 : 0;
    const double prefill_rate = prefill_ms > 0 ? rp->flops / (prefill_ms / 1e3) : 0;
    // Rates of one device, against its share of the machine's peak.
    const double measured = d.peak_flops.value * share;
    const double peak = std::max({measured, decode_rate, prefill_rate});
    if (peak > measured)
      d.peak_flops.source += fmt("; raised by calibration to %.1f GFLOP/s, the rate the engine reached", peak / 1e9);
    d.peak_flops.value = peak * num_devices;
    d.gemm_efficiency = {decode_rate > 0 ? decode_rate / peak : 1.0,
                         fmt("fitted: decode at batch %.0f on ", o.large_batch) + shape + who +
                             fmt(" took %.3f ms per model step: %.1f GFLOP/s", large->model_step_ms, decode_rate / 1e9)};
    d.prefill_gemm_efficiency = {prefill_rate > 0 ? prefill_rate / peak : 1.0,
                                 "fitted: prefill on " + shape + who +
                                     fmt(" ran at %.1f prompt tokens/s (a prefill-only run, wall): %.1f GFLOP/s",
                                         large->prefill_tok_s, prefill_rate / 1e9)};
  }
  // own per step = a + b * sequences: the line through the two runs'
  // medians (small_batch < large_batch).
  const double span = o.large_batch - o.small_batch;
  double a = (small->own_ms * o.large_batch - large->own_ms * o.small_batch) / span;
  double b = (large->own_ms - small->own_ms) / span;
  if (a < 0 || b < 0) {  // noise: one term only
    a = std::max(0.0, (small->own_ms + large->own_ms) / 2);
    b = 0;
  }
  const std::string runs = fmt("the engine's own time (scheduling, sampling) per decode step was %.3f ms at "
                               "batch %.0f ",
                               small->own_ms, o.small_batch) +
                           fmt("and %.3f ms at batch %.0f (medians); fitted as a + b * sequences per step",
                               large->own_ms, o.large_batch);
  d.step_overhead_ms = {a, "fitted: " + runs + who};
  d.seq_overhead_ms = {b, "fitted: " + runs + who};
  return Status::ok_status();
}

/// d.gemm_efficiency_by_rows fitted to decode runs at several batches (on
/// one of `num_devices` devices sharing d's totals), after fit_terms: at
/// each batch, the fraction of peak_flops at which the cost model's step
/// takes the measured model time. With `tp` > 1 the runs are of one
/// tensor-parallel group of `tp` of those devices, the step is the cost
/// model's for that group (its all-reduces priced on d's link), and the
/// fit goes into d.tp_gemm_efficiency_by_rows, or with `shift` (the runs
/// are a Shift group's, its decode steps in tp=`tp`) into
/// d.shift_gemm_efficiency_by_rows.
Status fit_gemm_curve(sim::DeviceSpec& d, const model::ModelConfig& config, const CalibrateOptions& o,
                      const std::vector<std::pair<int, DecodeRun>>& runs, int num_devices, int tp = 1,
                      bool shift = false) {
  const auto shape = sim::ModelShape::from_config(config);
  auto& curve = shift ? d.shift_gemm_efficiency_by_rows : tp > 1 ? d.tp_gemm_efficiency_by_rows : d.gemm_efficiency_by_rows;
  auto& curve_source = shift  ? d.shift_gemm_efficiency_by_rows_source
                       : tp > 1 ? d.tp_gemm_efficiency_by_rows_source
                                : d.gemm_efficiency_by_rows_source;
  curve.clear();
  engine::ParallelConfig pc;
  pc.tp = tp;
  std::string points;
  for (const auto& [batch, run] : runs) {
    if (!(run.model_step_ms > 0)) continue;
    const sim::StepShape step = decode_step(o, batch);
    auto step_ms = [&](double e) -> Result<double> {
      auto model = sim::CostModel::create(shape, kF32Sizes,
                                                   device_share(d, num_devices, e, d.memory_bw_efficiency.value));
      if (!model) return model.error();
      auto c = model->estimate(pc, step);
      if (!c) return c.error();
      return c->total_ms;
    };
    auto at_peak = step_ms(1.0);
    if (!at_peak) return at_peak.error();
    // The step time falls as the fraction rises, down to the memory floor:
    // find the fraction where it reaches the measurement (or the floor).
    const double target = std::max(run.model_step_ms, *at_peak * (1 + 1e-9));
    double lo = 1e-4, hi = 1.0;
    for (int it = 0; it < 60; ++it) {
      const double mid = (lo + hi) / 2;
      auto t = step_ms(mid);
      if (!t) return t.error();
      (*t > target ? lo : hi) = mid;
    }
    curve.emplace_back(batch, hi);
    points += (points.empty() ? "" : ", ") + fmt("%.0f: %.3f ms", batch, run.model_step_ms);
  }
  const std::string source =
      "fitted: the fraction of peak_flops at which the cost model's " +
      (tp > 1 ? fmt("tp=%.0f decode step (its all-reduces priced apart) ", tp) : std::string("decode step ")) +
      "takes the measured model time, at each batch run on " + o.shape_dir +
      (shift   ? fmt(" (one Shift group, base sp=%.0f, its decode steps in tp=%.0f", tp, tp) +
                     fmt(", of 1/%.0f of the machine each)", num_devices)
       : tp > 1 ? fmt(" (one tp=%.0f group of 1/%.0f of the machine each)", tp, num_devices)
       : num_devices > 1 ? fmt(" (each of %.0f devices running at once)", num_devices)
                         : "") +
      " (batch: model ms per step): " + points;
  curve_source = source;
  return Status::ok_status();
}

/// s.was_copy_exposed_by_rows (s: the split device of d, its other terms
/// fitted) fitted to decode runs of one SiDP group of s's devices in WaS
/// over `link`: at each batch, the fraction f of the group's fetch copy
/// (sim::sidp_was_copy_ms) at which the simulator's WaS step,
/// max(T_step + f * copy, T_fetch) with T_step the cost model's rank step on
/// s, takes the measured model time; clamped to [0, 1] (0 where the
/// measurement is at or below T_step or T_fetch).
Status fit_was_copy(sim::DeviceSpec& s, const sim::DeviceSpec& d, const model::ModelConfig& config,
                    const CalibrateOptions& o, const std::vector<std::pair<int, DecodeRun>>& runs, int num_devices,
                    const sim::LinkSpec& link) {
  sim::ClusterSpec cluster;
  cluster.name = "cpu";
  cluster.device = d;
  cluster.device.split = std::make_shared<const sim::DeviceSpec>(s);
  cluster.device.split_devices = num_devices;
  cluster.num_devices = num_devices;
  auto model = sim::CostModel::create(sim::ModelShape::from_config(config),
                                               sim::element_sizes(cluster.device),
                                               sim::group_hardware(cluster, 1, num_devices));
  if (!model) return model.error();
  const int layers = config.num_hidden_layers;
  const int fetched = layers - engine::sidp_owned_ffn_layer_count(layers, num_devices, 0);  // rank 0's, measured
  const double copy_ms = sim::sidp_was_copy_ms(cluster.device, *model, num_devices, fetched);
  const double fetch_ms = fetched * model->sidp_weight_fetch_ms(link);
  s.was_copy_exposed_by_rows.clear();
  std::string points;
  for (const auto& [batch, run] : runs) {
    if (!(run.model_step_ms > 0) || !(copy_ms > 0)) continue;
    auto c = model->estimate(engine::ParallelConfig{}, decode_step(o, batch));
    if (!c) return c.error();
    const double f = run.model_step_ms <= fetch_ms ? 0.0 : (run.model_step_ms - c->total_ms) / copy_ms;
    s.was_copy_exposed_by_rows.emplace_back(batch, std::clamp(f, 0.0, 1.0));
    points += (points.empty() ? "" : ", ") + fmt("%.0f: %.3f ms against %.3f ms", batch, run.model_step_ms, c->total_ms);
  }
  s.was_copy_exposed_by_rows_source =
      fmt("fitted: the fraction of the fetch copy (%.0f ranks x %.0f layers' FFN at host_link_bw_bytes_per_s: ",
          num_devices, fetched) +
      fmt("%.3f ms) by which a real SiDP WaS rank's decode step (rank 0 of a dp=%.0f group, ", copy_ms, num_devices) +
      fmt("its link paced to %.2f GB/s) outlasts the cost model's step, at each batch run on ",
          link.bandwidth_bytes_per_s / 1e9) +
      o.shape_dir + " (batch: measured model ms per step against the model's): " + points;
  return Status::ok_status();
}

}  // namespace

Result<CpuCalibration> CpuCalibration::create(const CalibrateOptions& o) {
  if (o.small_batch < 1 || o.large_batch <= o.small_batch || o.input_len < 1 || o.output_len < 2 || o.repeats < 1)
    return make_error(ErrorCode::invalid_argument,
                      "calibrate: need 1 <= small batch < large batch, input_len >= 1, output_len >= 2, repeats >= 1");
  auto config = model::load_model_config(o.shape_dir);
  if (!config) return config.error();
  CpuCalibration c;
  c.o_ = o;
  c.config_ = std::make_shared<const model::ModelConfig>(std::move(config).value());
  c.threads_ = o.num_threads > 0 ? o.num_threads : omp_get_num_procs();
  c.split_ = o.split && c.threads_ >= 2;
  c.per_device_ = c.threads_ / kDevices;
  // The batches of the decode runs, ascending: small, the curve's, large.
  c.batches_ = {o.small_batch, o.large_batch};
  for (const int b : o.curve_batches)
    if (b > o.small_batch && b < o.large_batch) c.batches_.push_back(b);
  std::sort(c.batches_.begin(), c.batches_.end());
  c.batches_.erase(std::unique(c.batches_.begin(), c.batches_.end()), c.batches_.end());
  return c;
}

Status CpuCalibration::measure_round() {
  const CalibrateOptions& o = o_;
  const bool first = rounds_ == 0;
  const auto data_parallel = [](int devices) {
    engine::ParallelConfig pc;
    pc.dp = devices;
    return pc;
  };
  engine::ParallelConfig tp_group;  // the TP fit's group: kDevices devices in tensor parallelism
  tp_group.tp = kDevices;
  engine::ParallelConfig shift_group;  // the Shift fit's group: base sp=kDevices, decode in tp=kDevices
  shift_group.sp = kDevices;
  engine::ShiftOptions shift;
  shift.policy.threshold = o.shift_threshold;
  // Each measurement's fastest so far (slow episodes only ever slow the machine).
  const auto keep = [first](std::vector<std::pair<int, DecodeRun>>& runs, std::size_t i, int batch,
                            const DecodeRun& run) {
    if (first) runs.emplace_back(batch, run);
    else runs[i].second = fastest(runs[i].second, run);
  };
  omp_set_num_threads(threads_);
  const sim::DeviceSpec m = measure_cpu_device(threads_);
  if (first) {
    measured_ = m;
    // The WaS fit's group: kDevices SiDP ranks in WaS throughout, the link
    // paced to was_link_ratio x the first measured triad.
    was_link_.gbps = o.was_link_ratio * m.memory_bw_bytes_per_s.value / 1e9;
    was_link_.latency_us = o.was_link_latency_us;
  } else {
    keep_faster(measured_, m);
  }
  engine::SidpOptions was;
  was.dp = kDevices;
  was.initial_mode = model::sidp::SidpMode::was;
  was.link = was_link_;
  const auto done = [&] {
    omp_set_num_threads(threads_);
    ++rounds_;
    return Status::ok_status();
  };
  // A decode run of `pc` at every batch, each kept into `runs`.
  const auto run_batches = [&](std::vector<std::pair<int, DecodeRun>>& runs, int threads,
                               const engine::ParallelConfig& pc, bool prefill_at_largest,
                               const std::optional<engine::SidpOptions>& sidp = std::nullopt,
                               const std::optional<engine::ShiftOptions>& shift_options = std::nullopt) -> Status {
    for (std::size_t i = 0; i < batches_.size(); ++i) {
      auto run = decode_run(o, batches_[i], threads, pc, prefill_at_largest && i + 1 == batches_.size(), sidp,
                            shift_options);
      if (!run) return run.error();
      keep(runs, i, batches_[i], *run);
    }
    return Status::ok_status();
  };
  if (Status st = run_batches(runs_, threads_, data_parallel(1), true); !st.ok()) return st;
  if (!split_) return done();
  omp_set_num_threads(per_device_);
  split_linear_ = std::max(split_linear_, measure_linear_gflops());
  omp_set_num_threads(threads_);
  if (Status st = run_batches(split_runs_, per_device_, data_parallel(kDevices), true); !st.ok()) return st;
  if (o.tp_fit) {
    if (Status st = run_batches(tp_runs_, per_device_, tp_group, false); !st.ok()) return st;
    if (o.shift_fit)
      if (Status st = run_batches(shift_runs_, per_device_, shift_group, false, std::nullopt, shift); !st.ok())
        return st;
  }
  if (o.was_fit)
    if (Status st = run_batches(was_runs_, per_device_, data_parallel(kDevices), false, was); !st.ok()) return st;
  return done();
}

Result<sim::DeviceSpec> CpuCalibration::fit() const {
  if (rounds_ < 1) return make_error(ErrorCode::invalid_argument, "calibrate: fit() before any measure_round()");
  const CalibrateOptions& o = o_;
  const model::ModelConfig& config = *config_;
  const std::string best_of = rounds_ > 1 ? fmt(" (the fastest of %.0f interleaved runs)", rounds_) : "";
  sim::DeviceSpec d = measured_;
  if (Status st = fit_terms(d, config, o, runs_.front().second, runs_.back().second, 1); !st.ok()) return st.error();
  if (Status st = fit_gemm_curve(d, config, o, runs_, 1); !st.ok()) return st.error();
  d.gemm_efficiency.source += best_of;
  d.memory_bw_efficiency.source += best_of;
  d.gemm_efficiency_by_rows_source += best_of;

  if (split_) {
    sim::DeviceSpec s = measured_;
    s.description = "this machine split over " + std::to_string(kDevices) + " CPU devices of " +
                    std::to_string(per_device_) + " thread(s), running at once";
    s.peak_flops = {split_linear_ * 1e9 * kDevices,
                    fmt("measured on this machine by `shardline simulate`: Shardline's linear on 2048^3 on "
                        "%.0f thread(s), %.1f GFLOP/s, times the devices",
                        per_device_, split_linear_)};
    if (Status st = fit_terms(s, config, o, split_runs_.front().second, split_runs_.back().second, kDevices);
        !st.ok())
      return st.error();
    if (Status st = fit_gemm_curve(s, config, o, split_runs_, kDevices); !st.ok()) return st.error();
    s.gemm_efficiency.source += best_of;
    s.memory_bw_efficiency.source += best_of;
    s.gemm_efficiency_by_rows_source += best_of;
    if (o.tp_fit) {
      if (Status st = fit_gemm_curve(s, config, o, tp_runs_, kDevices, kDevices); !st.ok()) return st.error();
      s.tp_gemm_efficiency_by_rows_source += best_of;
      if (o.shift_fit) {
        if (Status st = fit_gemm_curve(s, config, o, shift_runs_, kDevices, kDevices, /*shift=*/true); !st.ok())
          return st.error();
        s.shift_gemm_efficiency_by_rows_source += best_of;
      }
    }
    if (o.was_fit) {
      const auto link = sim::LinkSpec::from_gbps(was_link_.gbps, was_link_.latency_us);
      if (Status st = fit_was_copy(s, d, config, o, was_runs_, kDevices, link); !st.ok()) return st.error();
      s.was_copy_exposed_by_rows_source += best_of;
    }
    d.split = std::make_shared<const sim::DeviceSpec>(std::move(s));
    d.split_devices = kDevices;
  }
  return d;
}

Result<sim::DeviceSpec> calibrate_cpu_device(const CalibrateOptions& o) {
  auto c = CpuCalibration::create(o);
  if (!c) return c.error();
  for (int r = 0; r < o.repeats; ++r)
    if (Status st = c->measure_round(); !st.ok()) return st.error();
  return c->fit();
}

}  // namespace shardline::sim::calibration
