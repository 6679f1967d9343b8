#include "cli/sidp_flags.hpp"

#include <spdlog/spdlog.h>

#include "sim/calibration/hardware.hpp"
#include "common/dtype.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/sidp_memory.hpp"
#include "model/config.hpp"
#include "sim/cost_model.hpp"

namespace shardline::cli {

void add_sidp_flags(CLI::App& cmd, SidpFlags& f) {
  cmd.add_option("--weight-sharing", f.weight_sharing,
                 "sidp: the --parallel dp=N workers (CPU devices; GPUs with --devices cuda: on run and node start) "
                 "share the FFN weights, each layer on one device's layer owner (SiDP, docs/sidp.md); none: each "
                 "worker holds the whole model")
      ->check(CLI::IsMember({"none", "sidp"}))
      ->capture_default_str();
  cmd.add_option("--sidp-ownership", f.ownership, "Which device owns each FFN layer: balanced (layer l on l mod N) "
                                                  "or a plan, one owner per layer, e.g. 0,1,0,1")
      ->capture_default_str();
  cmd.add_option("--sidp-cache-slots", f.cache_slots, "WaS cache slots per device (raised to what the order needs)")
      ->capture_default_str();
  cmd.add_option("--sidp-peak-shifting", f.peak_shifting, "Per-rank shifted WaS prefetch order (§4.2)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--sidp-mode", f.mode,
                 "auto: start in WaS, the orchestrator switches to CaS in the tail; was / cas: stay in one mode")
      ->check(CLI::IsMember({"auto", "was", "cas"}))
      ->capture_default_str();
  cmd.add_option("--sidp-switch-batch", f.switch_batch,
                 "b*: switch to CaS when the group's running sequences stay below it (0 = from the cost model)")
      ->capture_default_str();
  cmd.add_option("--sidp-hysteresis", f.hysteresis, "h: switch back to WaS above b*(1+h)")->capture_default_str();
  cmd.add_option("--sidp-min-dwell", f.min_dwell_s,
                 "Seconds below b* before switching to CaS, and the least time between two switches")
      ->capture_default_str();
  cmd.add_option("--link-gbps", f.link_gbps,
                 "Emulated device link (GB/s per rank) that weight gets and CaS sends are paced to, like NVLink "
                 "(0 = off: a get costs a memcpy)")
      ->capture_default_str();
  cmd.add_option("--link-latency-us", f.link_latency_us, "Emulated link latency per transfer, us")
      ->capture_default_str();
}

namespace {

/// b* on the group's effective batch: dp x the cost model's per-rank b*.
Result<long long> cost_model_switch_batch(const engine::EngineOptions& engine, const engine::SidpOptions& so) {
  auto config = model::load_model_config(engine.model_dir);
  if (!config) return std::move(config).error();
  const int dp = so.dp;
  const int threads = std::max(1, engine.num_threads) * dp;
  const double membw_gbs = sim::calibration::measure_triad_bandwidth_gbs(threads, 64L << 20, 3);
  double gemm_gflops = sim::calibration::measure_linear_gflops(512, 2, engine.dtype);  // the weights' compute
  double weight_bytes = static_cast<double>(dtype_size(engine.dtype));
  if (engine.keep_quantized || engine.quantization) {
    // Weights kept in their own formats: a quantized FFN is priced at its
    // regions' bytes (what WaS moves) and its kernel's GEMM rate. Reading
    // them needs the weights: the ones given, else a load of the model
    // that is dropped here (the rank loads its own).
    std::shared_ptr<const model::ModelWeights> weights = engine.weights;
    if (!weights) {
      auto loaded = engine::load_weights(engine);
      if (!loaded) return std::move(loaded).error();
      weights = *loaded;
    }
    auto ffn = engine::sidp_ffn_format(*weights);
    if (!ffn) return std::move(ffn).error();
    if (ffn->quant_type) {
      weight_bytes = ffn->region_bytes_per_weight;
      gemm_gflops = sim::calibration::measure_quant_linear_gflops(*ffn->quant_type);
    }
  }
  // Without emulation a weight get is a memcpy on the shared bus.
  const double link_gbs = so.link.gbps > 0 ? so.link.gbps : membw_gbs / dp;
  const auto link = sim::LinkSpec::from_gbps(link_gbs, so.link.latency_us);
  auto cost = sim::CostModel::for_sidp_rank(*config, weight_bytes, engine.kv_cache_dtype, membw_gbs * 1e9,
                                            gemm_gflops * 1e9, dp, link);
  if (!cost) return std::move(cost).error();
  auto point = cost->sidp_switch_batch_overlapped(link, dp);
  if (!point) return std::move(point).error();
  const long long group = point->switch_batch * dp;
  spdlog::info("sidp: b* = {} per rank (cost model: fetch {:.3f} ms per layer at {:.1f} GB/s, a layer's forward {:.3f} ms; "
               "measured {:.1f} GB/s, {:.0f} GFLOP/s over {} ranks, weights at {:.3f} bytes each{}); the group switches below {} "
               "running sequences",
               point->switch_batch, point->fetch_ms, link_gbs, point->layer_ms, membw_gbs, gemm_gflops, dp,
               weight_bytes, point->capped ? ", capped" : "", group);
  return group;
}

}  // namespace

Result<engine::SidpOptions> to_sidp_options(const SidpFlags& f, const engine::ParallelConfig& parallel) {
  if (parallel.dp < 2 || parallel.group_size() != 1)
    return make_error(ErrorCode::invalid_argument,
                      "--weight-sharing sidp needs --parallel dp=N with N >= 2 (each rank one CPU device), got " +
                          parallel.to_string());
  if (f.cache_slots < 1)
    return make_error(ErrorCode::invalid_argument, "--sidp-cache-slots must be >= 1, got " + std::to_string(f.cache_slots));
  if (f.link_gbps < 0 || f.link_latency_us < 0)
    return make_error(ErrorCode::invalid_argument, "--link-gbps and --link-latency-us must be >= 0");
  engine::SidpOptions so;
  so.dp = parallel.dp;
  so.ownership = f.ownership;
  so.cache_slots = f.cache_slots;
  so.peak_shifting = f.peak_shifting == "on";
  so.link = comm::LinkSpec{f.link_gbps, f.link_latency_us};
  return so;
}

Result<engine::SidpModePolicyOptions> to_sidp_policy(const SidpFlags& f, const engine::EngineOptions& engine,
                                                     const engine::SidpOptions& so) {
  engine::SidpModePolicyOptions po;
  auto setting = engine::parse_sidp_mode_setting(f.mode);
  if (!setting) return make_error(ErrorCode::invalid_argument, "--sidp-mode: " + setting.error().message);
  po.setting = *setting;
  po.hysteresis = f.hysteresis;
  po.min_dwell_s = f.min_dwell_s;
  po.num_ranks = so.dp;
  po.switch_batch = f.switch_batch;
  if (f.switch_batch < 0)
    return make_error(ErrorCode::invalid_argument, "--sidp-switch-batch must be >= 0, got " + std::to_string(f.switch_batch));
  if (po.setting == engine::SidpModeSetting::automatic && f.switch_batch == 0) {
    auto b = cost_model_switch_batch(engine, so);
    if (!b) return make_error(ErrorCode::invalid_argument, "--sidp-switch-batch from the cost model: " + b.error().message);
    po.switch_batch = *b;
  }
  if (Status st = po.validate(); !st) return st.error();
  return po;
}

Status apply_sidp_flags(const SidpFlags& f, actors::NodeOptions& o) {
  if (f.weight_sharing != "sidp") {
    if (f.weight_sharing != "none")
      return make_error(ErrorCode::invalid_argument, "--weight-sharing is none or sidp, got " + f.weight_sharing);
    return Status::ok_status();
  }
  auto so = to_sidp_options(f, o.parallel);
  if (!so) return so.error();
  auto po = to_sidp_policy(f, o.engine, *so);
  if (!po) return po.error();
  o.sidp = *so;
  o.sidp_policy = *po;
  return Status::ok_status();
}

}  // namespace shardline::cli
