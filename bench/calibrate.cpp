#include "bench/calibrate.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "bench/hardware.hpp"
#include "bench/throughput.hpp"
#include "engine/kv_budget.hpp"
#include "model/config.hpp"
#include "orchestrator/cost_model.hpp"

namespace shardline::bench {
namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

/// One measured decode run at `batch` sequences.
struct DecodeRun {
  double model_step_ms = 0;     ///< median model time of pure-decode steps at full batch
  double overhead_ms = 0;       ///< the engine's own time per step
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
  if (r->num_steps > 0) d.overhead_ms = std::max(0.0, (r->elapsed_s - r->model_s) * 1e3 / r->num_steps);
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
  d.memory_bw_efficiency = {1.0, "uncalibrated: the bandwidth is already a measured rate"};
  d.step_overhead_ms = {0.0, "uncalibrated (run `shardline simulate --calibrate`)"};
  return d;
}

Result<sim::DeviceSpec> calibrate_cpu_device(const CalibrateOptions& o) {
  if (o.small_batch < 1 || o.large_batch <= o.small_batch || o.input_len < 1 || o.output_len < 2)
    return make_error(ErrorCode::invalid_argument,
                      "calibrate: need 1 <= small batch < large batch, input_len >= 1, output_len >= 2");
  auto config = model::load_model_config(o.shape_dir);
  if (!config) return config.error();
  const int threads = o.num_threads > 0 ? o.num_threads : omp_get_num_procs();
  sim::DeviceSpec d = measure_cpu_device(threads);
  auto small = decode_run(o, o.small_batch, threads);
  if (!small) return small.error();
  auto large = decode_run(o, o.large_batch, threads);
  if (!large) return large.error();

  // The cost model's raw times (efficiency 1) at those batches, at the
  // median context of the full-batch decode steps.
  orchestrator::HardwareSpec hw;
  hw.flops_per_s = d.peak_flops.value;
  hw.memory_bw_bytes_per_s = d.memory_bw_bytes_per_s.value;
  hw.comm_bw_bytes_per_s = d.intra_node_bw_bytes_per_s.value;
  hw.comm_latency_s = d.intra_node_latency_s.value;
  orchestrator::ElementSizes sizes{4, 4, 4};
  auto model = orchestrator::CostModel::create(orchestrator::ModelShape::from_config(*config), sizes, hw);
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
  const double t_comp_large = rl->compute_ms;
  const double bw_eff = small->model_step_ms > 0 ? std::min(1.0, t_mem_small / small->model_step_ms) : 1.0;
  const double gemm_eff = large->model_step_ms > 0 ? std::min(1.0, t_comp_large / large->model_step_ms) : 1.0;
  const double overhead = 0.5 * (small->overhead_ms + large->overhead_ms);
  const std::string shape = o.shape_dir;
  d.memory_bw_efficiency = {
      bw_eff, fmt("fitted: decode at batch %.0f on ", o.small_batch) + shape +
                  fmt(" took %.3f ms per step; weights + KV at triad bandwidth take %.3f ms", small->model_step_ms,
                      t_mem_small)};
  d.gemm_efficiency = {
      gemm_eff, fmt("fitted: decode at batch %.0f on ", o.large_batch) + shape +
                    fmt(" took %.3f ms per step; its FLOPs at peak_flops take %.3f ms", large->model_step_ms,
                        t_comp_large)};
  d.step_overhead_ms = {overhead, fmt("fitted: the engine's own time per step (scheduling, sampling) in those runs: "
                                      "%.3f ms at batch %.0f, ",
                                      small->overhead_ms, o.small_batch) +
                                      fmt("%.3f ms at batch %.0f", large->overhead_ms, o.large_batch)};
  return d;
}

}  // namespace shardline::bench
