#include "bench/calibrate.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "bench/hardware.hpp"
#include "bench/throughput.hpp"
#include "engine/kv_budget.hpp"
#include "model/config.hpp"
#include "orchestrator/cost_model.hpp"

namespace shardline::bench {
namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0) {  // (printf-style, up to 3 numbers)
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

/// One measured decode run at `batch` sequences.
struct DecodeRun {
  double model_step_ms = 0;     ///< median model time of pure-decode steps at full batch
  double own_ms = 0;            ///< the engine's own time (scheduling, sampling), whole run
  double num_steps = 0;
  double seq_steps = 0;         ///< sequences summed over steps (each request: one per generated token)
  double prefill_tok_s = 0;     ///< prompt tokens / model time of prefill-carrying steps
};

Result<DecodeRun> decode_run(const CalibrateOptions& o, int batch, int threads) {
  ThroughputOptions t;
  t.engine.model_dir = o.shape_dir;
  t.engine.load_format = model::LoadFormat::dummy;
  t.engine.num_threads = threads;
  t.num_prompts = batch;
  t.max_batch = batch;
  t.input_len = o.input_len;
  t.output_len = o.output_len;
  auto r = run_throughput(t);
  if (!r) return r.error();
  DecodeRun d;
  d.model_step_ms = r->decode_step_ms;
  d.own_ms = std::max(0.0, (r->elapsed_s - r->model_s) * 1e3);
  d.num_steps = r->num_steps;
  d.seq_steps = static_cast<double>(batch) * o.output_len;
  d.prefill_tok_s = r->prefill_tok_s;
  return d;
}

}  // namespace

sim::DeviceSpec measure_cpu_device(int num_threads) {
  const int threads = num_threads > 0 ? num_threads : omp_get_num_procs();
  omp_set_num_threads(threads);
  const double triad = measure_triad_bandwidth_gbs(threads);
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
  d.host_link_bw_bytes_per_s = {triad * 1e9 / 3, "host memory is device memory: a copy at a third of triad"};
  d.gemm_efficiency = {1.0, "uncalibrated: peak_flops is already a measured rate"};
  d.prefill_gemm_efficiency = {1.0, "uncalibrated: peak_flops is already a measured rate"};
  d.memory_bw_efficiency = {1.0, "uncalibrated: the bandwidth is already a measured rate"};
  d.step_overhead_ms = {0.0, "uncalibrated (run `shardline simulate --calibrate`)"};
  d.seq_overhead_ms = {0.0, "uncalibrated (run `shardline simulate --calibrate`)"};
  return d;
}

namespace {

/// `n` decode runs at `batch` at once, each on `threads` threads (its own
/// engine on its own thread): what n CPU devices of a config do. The
/// result is their mean.
Result<DecodeRun> concurrent_decode_runs(const CalibrateOptions& o, int batch, int threads, int n) {
  std::vector<Result<DecodeRun>> runs(static_cast<std::size_t>(n), make_error(ErrorCode::internal, "not run"));
  std::vector<std::thread> pool;
  for (int i = 0; i < n; ++i)
    pool.emplace_back([&, i] {
      omp_set_num_threads(threads);
      runs[static_cast<std::size_t>(i)] = decode_run(o, batch, threads);
    });
  for (std::thread& t : pool) t.join();
  DecodeRun mean;
  for (const auto& r : runs) {
    if (!r) return r.error();
    mean.model_step_ms += r->model_step_ms / n;
    mean.own_ms += r->own_ms / n;
    mean.num_steps += r->num_steps / n;
    mean.seq_steps += r->seq_steps / n;
    mean.prefill_tok_s += r->prefill_tok_s / n;
  }
  return mean;
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
  orchestrator::HardwareSpec hw;
  hw.flops_per_s = d.peak_flops.value * share;
  hw.memory_bw_bytes_per_s = d.memory_bw_bytes_per_s.value * share;
  hw.comm_bw_bytes_per_s = d.intra_node_bw_bytes_per_s.value;
  hw.comm_latency_s = d.intra_node_latency_s.value;
  orchestrator::ElementSizes sizes{4, 4, 4};
  auto model = orchestrator::CostModel::create(orchestrator::ModelShape::from_config(config), sizes, hw);
  if (!model) return model.error();
  auto raw = [&](int batch) -> Result<orchestrator::StepCost> {
    orchestrator::StepShape s;
    for (int i = 0; i < batch; ++i) s.add_sequence(o.input_len + o.output_len / 2, 1);
    return model->estimate(engine::ParallelConfig{}, s);
  };
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
    orchestrator::StepShape pre;
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
                                     fmt(" ran at %.1f prompt tokens/s: %.1f GFLOP/s", large->prefill_tok_s,
                                         prefill_rate / 1e9)};
  }
  // own = a * steps + b * sequence-steps, from the two runs.
  const double det = small->num_steps * large->seq_steps - large->num_steps * small->seq_steps;
  double a = 0, b = 0;
  if (std::abs(det) > 1e-9) {
    a = (small->own_ms * large->seq_steps - large->own_ms * small->seq_steps) / det;
    b = (small->num_steps * large->own_ms - large->num_steps * small->own_ms) / det;
  }
  if (a < 0 || b < 0) {  // noise: one term only
    a = std::max(0.0, (small->own_ms + large->own_ms) / (small->num_steps + large->num_steps));
    b = 0;
  }
  const std::string runs = fmt("the engine's own time (scheduling, sampling) was %.1f ms over %.0f steps ",
                               small->own_ms, small->num_steps) +
                           fmt("at batch %.0f and %.1f ms over ", o.small_batch, large->own_ms) +
                           fmt("%.0f steps at batch %.0f; fitted as a + b * sequences per step", large->num_steps,
                               o.large_batch);
  d.step_overhead_ms = {a, "fitted: " + runs + who};
  d.seq_overhead_ms = {b, "fitted: " + runs + who};
  return Status::ok_status();
}

}  // namespace

Result<sim::DeviceSpec> calibrate_cpu_device(const CalibrateOptions& o) {
  if (o.small_batch < 1 || o.large_batch <= o.small_batch || o.input_len < 1 || o.output_len < 2)
    return make_error(ErrorCode::invalid_argument,
                      "calibrate: need 1 <= small batch < large batch, input_len >= 1, output_len >= 2");
  auto config = model::load_model_config(o.shape_dir);
  if (!config) return config.error();
  const int threads = o.num_threads > 0 ? o.num_threads : omp_get_num_procs();
  sim::DeviceSpec d = measure_cpu_device(threads);
  const sim::DeviceSpec measured = d;
  auto small = decode_run(o, o.small_batch, threads);
  if (!small) return small.error();
  auto large = decode_run(o, o.large_batch, threads);
  if (!large) return large.error();
  if (Status st = fit_terms(d, *config, o, *small, *large, 1); !st.ok()) return st.error();

  // The split fit: 2 devices, each on half the threads, running at once.
  if (o.split && threads >= 2) {
    constexpr int kDevices = 2;
    const int per_device = threads / kDevices;
    sim::DeviceSpec split = measured;
    split.description = "this machine split over " + std::to_string(kDevices) + " CPU devices of " +
                        std::to_string(per_device) + " thread(s), running at once";
    omp_set_num_threads(per_device);
    const double linear = measure_linear_gflops();
    omp_set_num_threads(threads);
    split.peak_flops = {linear * 1e9 * kDevices,
                        fmt("measured on this machine by `shardline simulate`: Shardline's linear on 2048^3 on "
                            "%.0f thread(s), %.1f GFLOP/s, times the devices",
                            per_device, linear)};
    auto s_small = concurrent_decode_runs(o, o.small_batch, per_device, kDevices);
    if (!s_small) return s_small.error();
    auto s_large = concurrent_decode_runs(o, o.large_batch, per_device, kDevices);
    if (!s_large) return s_large.error();
    if (Status st = fit_terms(split, *config, o, *s_small, *s_large, kDevices); !st.ok()) return st.error();
    d.split = std::make_shared<const sim::DeviceSpec>(std::move(split));
    d.split_devices = kDevices;
  }
  return d;
}

}  // namespace shardline::bench
