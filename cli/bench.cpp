// `shardline bench`: offline throughput benchmark with same-run hardware limits.
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bench/gpu_throughput.hpp"
#include "sim/calibration/parallel.hpp"
#include "bench/seesaw.hpp"
#include "bench/shift.hpp"
#include "bench/sidp.hpp"
#include "bench/throughput.hpp"
#include "engine/group/parallel_config.hpp"
#include "cli/commands.hpp"
#include "cli/engine_flags.hpp"

namespace shardline::cli {

namespace {

struct BenchArgs {
  std::string model_dir;
  std::string shape_dir;
  EngineFlags engine;
  bench::ThroughputOptions options;
  std::string guided_json_file;  ///< --guided-json: a JSON schema file
  std::vector<std::string> parallel;  ///< --parallel, one config each
  std::string token_budget = "both";
  std::string weight_sharing = "none";
  bench::SidpBenchOptions sidp;
  std::string sidp_tables = "capacity,crossover,e2e,peak";
  std::string sidp_batches = "1,2,4,8,16,32,64,128";
  std::string sidp_output_range = "16:512";
  std::string peak_shifting = "on";
  bench::ShiftBenchOptions shift;
  std::string shift_long = "8x1024/16", shift_short = "24x64/256";
  std::string shift_sweep = "1,2,4,8,16,32,64,128,256,512,1024,2048";
  std::string seesaw;  ///< --seesaw CP:CD ("" = off)
  std::string seesaw_ratios = "2048/64,1024/256,256/256,128/1024";
  std::string seesaw_policy_ratios = "1024/256";
  int seesaw_requests = 16;
  std::string host_kv_bytes;  ///< "" = --swap-space
  int seesaw_min_prefill_prompts = 1;
  std::string seesaw_copy_ratios = "1024/256";
  std::string seesaw_kv_copy = "async";
  std::string host_link_gbps = "0", host_link_latency_us = "0";
};

/// "1,2,4" -> {1, 2, 4}; a bad item -> nullopt.
std::optional<std::vector<int>> parse_int_list(const std::string& text) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    try {
      std::size_t used = 0;
      const std::string part = text.substr(pos, comma - pos);
      const int v = std::stoi(part, &used);
      if (used != part.size() || v <= 0) return std::nullopt;
      out.push_back(v);
    } catch (...) {
      return std::nullopt;
    }
    pos = comma + 1;
  }
  return out;
}

/// A report's table on stderr and its JSON line on stdout; exit code 0, or 1
/// with the error.
template <class Report>
int print_report(const Result<Report>& rep) {
  if (!rep) {
    std::cerr << "error: " << rep.error().to_string() << "\n";
    return 1;
  }
  std::cerr << rep->to_table();
  std::cout << rep->to_json() << std::endl;
  return 0;
}

int run_parallel(BenchArgs& a, const engine::EngineOptions& eo) {
  sim::calibration::ParallelBenchOptions po;
  po.engine = eo;
  po.num_prompts = a.options.num_prompts;
  po.input_len = a.options.input_len;
  po.output_len = a.options.output_len;
  po.max_batch = a.options.max_batch;
  for (const std::string& text : a.parallel) {
    auto pc = engine::parse_parallel_config(text);
    if (!pc) {
      std::cerr << "error: " << pc.error().to_string() << "\n";
      return 2;
    }
    po.configs.push_back(*pc);
  }
  if (a.token_budget != "both") po.token_budgets = {a.token_budget};
  return print_report(sim::calibration::run_parallel_bench(po));
}

int run_sidp(BenchArgs& a, const engine::EngineOptions& eo) {
  bench::SidpBenchOptions& so = a.sidp;
  so.engine = eo;
  if (a.parallel.size() > 1) {
    std::cerr << "error: --weight-sharing sidp takes one --parallel dp=N\n";
    return 2;
  }
  if (!a.parallel.empty()) {
    auto pc = engine::parse_parallel_config(a.parallel.front());
    if (!pc || pc->group_size() != 1) {
      std::cerr << "error: --weight-sharing sidp needs --parallel dp=N (each rank one device)\n";
      return 2;
    }
    so.dp = pc->dp;
  }
  so.tables.clear();
  for (std::size_t pos = 0; pos <= a.sidp_tables.size();) {
    const std::size_t comma = std::min(a.sidp_tables.find(',', pos), a.sidp_tables.size());
    so.tables.push_back(a.sidp_tables.substr(pos, comma - pos));
    pos = comma + 1;
  }
  auto batches = parse_int_list(a.sidp_batches);
  if (!batches) {
    std::cerr << "error: --sidp-batches wants positive integers like 1,2,4\n";
    return 2;
  }
  so.batches = *batches;
  const std::size_t colon = a.sidp_output_range.find(':');
  auto lo = parse_int_list(a.sidp_output_range.substr(0, colon));
  auto hi = colon == std::string::npos ? std::nullopt : parse_int_list(a.sidp_output_range.substr(colon + 1));
  if (!lo || !hi || lo->size() != 1 || hi->size() != 1 || lo->front() > hi->front()) {
    std::cerr << "error: --sidp-output-range wants MIN:MAX, e.g. 16:512\n";
    return 2;
  }
  so.e2e_min_output = lo->front();
  so.e2e_max_output = hi->front();
  so.e2e_prompts = a.options.num_prompts;
  so.e2e_input_len = a.options.input_len;
  so.context_len = a.options.input_len;
  so.device_memory_bytes = eo.device_memory_bytes;
  return print_report(bench::run_sidp_bench(so));
}

int run_shift(BenchArgs& a, const engine::EngineOptions& eo) {
  bench::ShiftBenchOptions& so = a.shift;
  if (a.parallel.size() != 1) {
    std::cerr << "error: --shift takes one --parallel sp=N or sp=N,tp=M (the base config)\n";
    return 2;
  }
  auto pc = engine::parse_parallel_config(a.parallel.front());
  if (!pc) {
    std::cerr << "error: " << pc.error().to_string() << "\n";
    return 2;
  }
  so.engine = eo;
  so.engine.parallel = *pc;
  so.engine.shift.reset();
  so.threshold = a.engine.shift_threshold == "auto" ? -1 : eo.shift->policy.threshold;
  so.hysteresis = a.engine.shift_hysteresis;
  so.max_batch = a.options.max_batch;
  for (const auto& [text, cls] : {std::pair<const std::string*, bench::RequestClass*>{&a.shift_long, &so.long_requests},
                                  {&a.shift_short, &so.short_requests}}) {
    auto c = bench::parse_request_class(*text);
    if (!c) {
      std::cerr << "error: " << c.error().to_string() << "\n";
      return 2;
    }
    *cls = *c;
  }
  so.sweep_tokens.clear();
  if (!a.shift_sweep.empty()) {
    auto list = parse_int_list(a.shift_sweep);
    if (!list) {
      std::cerr << "error: --shift-sweep wants positive integers like 1,2,4 (or \"\" to skip)\n";
      return 2;
    }
    so.sweep_tokens = *list;
  }
  return print_report(bench::run_shift_bench(so));
}

int run_seesaw(BenchArgs& a, const engine::EngineOptions& eo) {
  const auto usage = [](const std::string& m) {
    std::cerr << "error: " << m << "\n";
    return 2;
  };
  if (!a.parallel.empty()) return usage("--seesaw takes both configs as CP:CD (e.g. pp=2:tp=2), not --parallel");
  if (a.engine.shift || a.weight_sharing != "none") return usage("--seesaw does not go with --shift or --weight-sharing");
  bench::SeesawBenchOptions so;
  auto pair = bench::parse_seesaw_pair(a.seesaw);
  if (!pair) return usage(pair.error().to_string());
  so.cp = pair->first;
  so.cd = pair->second;
  so.engine = eo;
  auto weights = engine::parse_reshard_weights(a.engine.reshard_weights);
  if (!weights) return usage(weights.error().message);
  so.engine.reshard_weights = *weights;
  if (!a.host_kv_bytes.empty()) {
    auto bytes = parse_byte_size(a.host_kv_bytes);
    if (!bytes) return usage("--host-kv-bytes: " + bytes.error().message);
    so.engine.swap_space_bytes = *bytes;  // the host KV buffer is the engine's swap space
  }
  for (const auto& [flag, text, out] :
       {std::tuple{"--seesaw-ratios", &a.seesaw_ratios, &so.ratios},
        std::tuple{"--seesaw-policy-ratios", &a.seesaw_policy_ratios, &so.schedule_ratios},
        std::tuple{"--seesaw-copy-ratios", &a.seesaw_copy_ratios, &so.copy_ratios}}) {
    auto ratios = bench::parse_seesaw_ratios(*text);
    if (!ratios) return usage(std::string(flag) + ": " + ratios.error().message);
    *out = *ratios;
  }
  if (so.ratios.empty()) return usage("--seesaw-ratios: give at least one INPUT/OUTPUT ratio");
  auto async = parse_seesaw_kv_copy(a.seesaw_kv_copy);
  if (!async) return usage(async.error().message);
  so.engine.seesaw_async_kv = *async;
  auto link = parse_host_link(a.host_link_gbps, a.host_link_latency_us);
  if (!link) return usage(link.error().message);
  so.engine.host_link = *link;
  // SiDP's link flags: the interconnect between each group's devices.
  if (a.sidp.link.gbps > 0) {
    if (Status st = comm::validate(a.sidp.link); !st) return usage("--link-gbps / --link-latency-us: " + st.error().message);
    so.engine.group_link = a.sidp.link;
  }
  so.num_requests = a.seesaw_requests;
  so.repeats = a.shift.repeats;
  so.seesaw.min_prefill_prompts = a.seesaw_min_prefill_prompts;
  if (Status st = so.seesaw.validate(); !st) return usage("--seesaw-min-prefill-prompts: " + st.error().message);
  return print_report(bench::run_seesaw_bench(so));
}

int run_bench(BenchArgs& a) {
  const std::string dir = a.model_dir.empty() ? a.shape_dir : a.model_dir;
  if (dir.empty() || (!a.model_dir.empty() && !a.shape_dir.empty())) {
    std::cerr << "error: give exactly one of --model or --shape\n";
    return 2;
  }
  if (!a.shape_dir.empty() && a.engine.load_format == "auto") a.engine.load_format = "dummy";
  auto eo = to_engine_options(a.engine, dir);
  if (!eo) {
    std::cerr << "error: " << eo.error().to_string() << "\n";
    return 2;
  }
  // Benchmarks repeat synthetic prompts: caching would skip the prefills they
  // measure. On only when --enable-prefix-caching is said.
  eo->enable_prefix_caching = a.engine.enable_prefix_caching && !a.engine.no_prefix_caching;
  eo->prefix_tier_bytes = a.engine.prefix_tier_mib << 20;
  if (!a.seesaw.empty()) return run_seesaw(a, *eo);
  if (a.weight_sharing == "sidp") return run_sidp(a, *eo);
  if (a.engine.shift) return run_shift(a, *eo);
  if (eo->device == model::DeviceKind::cuda && a.parallel.size() == 1) {
    // One engine group of ranks sharing the GPU (model::CudaShardGroup).
    auto pc = engine::parse_parallel_config(a.parallel.front());
    if (!pc) {
      std::cerr << "error: " << pc.error().to_string() << "\n";
      return 2;
    }
    eo->parallel = *pc;
    a.options.engine = *eo;
    return print_report(bench::run_gpu_throughput(a.options));
  }
  if (!a.parallel.empty()) return run_parallel(a, *eo);
  a.options.engine = *eo;
  if (eo->device == model::DeviceKind::cuda) return print_report(bench::run_gpu_throughput(a.options));
  if (!a.guided_json_file.empty()) {
    std::ifstream in(a.guided_json_file);
    if (!in) {
      std::cerr << "error: --guided-json: cannot read " << a.guided_json_file << "\n";
      return 2;
    }
    a.options.guided_json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto rep = bench::run_throughput(a.options);
  if (!rep) {
    std::cerr << "error: " << rep.error().to_string() << "\n";
    return 1;
  }
  std::cout << rep->to_json() << std::endl;
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Offline throughput benchmark; prints one JSON line (tokens/s, step times, roofline)");
  cmd->add_option("--model", a->model_dir, "Hugging Face model folder (real weights)");
  cmd->add_option("--shape", a->shape_dir,
                  "Folder with a config.json only; implies --load-format dummy");
  add_engine_flags(*cmd, a->engine);
  add_device_flag(*cmd, a->engine);
  cmd->add_option("--num-prompts", a->options.num_prompts, "Requests")->capture_default_str();
  cmd->add_option("--input-len", a->options.input_len, "Prompt tokens per request")->capture_default_str();
  cmd->add_option("--guided-json", a->guided_json_file,
                  "A JSON schema file: every request's output constrained to it (structured outputs; the "
                  "report adds the schema's compile time and the grammar masks' time per step)");
  cmd->add_option("--shared-prefix-len", a->options.shared_prefix_len,
                  "The first N prompt tokens are the same on every request (a system prompt; with "
                  "--enable-prefix-caching they are computed once; docs/prefix-caching.md)")
      ->capture_default_str();
  cmd->add_option("--few-shot", a->options.few_shot,
                  "Each prompt starts with K examples drawn (distinct, seeded) from a pool of --few-shot-pool, "
                  "--few-shot-len tokens each; the rest of --input-len is a random question (issue 42's "
                  "workload (b)). 0: none")
      ->capture_default_str();
  cmd->add_option("--few-shot-pool", a->options.few_shot_pool, "Examples in the --few-shot pool")
      ->capture_default_str();
  cmd->add_option("--few-shot-len", a->options.few_shot_len, "Tokens of each --few-shot example")
      ->capture_default_str();
  cmd->add_option("--n", a->options.n,
                  "Samples per prompt (temperature 0.8, a seed each); prompt tokens count once per prompt")
      ->capture_default_str();
  cmd->add_option("--prefix-order", a->options.prefix_order,
                  "Order the prompts run in: input, or sorted (prompts sharing a prefix together, as a "
                  "prefix-aware job scheduler hands them out; engine/policies/prefix_order.hpp)")
      ->capture_default_str();
  cmd->add_option("--output-len", a->options.output_len, "Generated tokens per request")
      ->capture_default_str();
  cmd->add_option("--max-batch", a->options.max_batch, "Running sequences at most")->capture_default_str();
  cmd->add_option("--kv-stream", a->options.kv_stream,
                  "Stream each step's KV to a KV-store actor: off, store, or replicated (and on to its ring "
                  "successor); bench/kv_streaming.hpp")
      ->capture_default_str();
  cmd->add_option("--kv-sync", a->options.kv_sync, "Sync policy of those stores: none, wal, fsync")
      ->capture_default_str();
  cmd->add_option("--parallel", a->parallel,
                  "Benchmark these parallel configs, e.g. --parallel single --parallel tp=2 --parallel pp=2 "
                  "(in-process CPU devices; prints a table on stderr and one JSON line); with --device cuda:N, one config: "
                  "the GPU benchmark of an engine group whose ranks share the GPU");
  cmd->add_option("--token-budget", a->token_budget,
                  "With --parallel, the policies for pp > 1 configs: fixed, throttle or both")
      ->check(CLI::IsMember({"fixed", "throttle", "both"}))
      ->capture_default_str();
  cmd->add_option("--weight-sharing", a->weight_sharing,
                  "sidp: benchmark SiDP weight sharing over --parallel dp=N in-process CPU devices (KV capacity, "
                  "decode step vs batch for plain DP / WaS / CaS, a long-tailed job, peak shifting; bench/sidp.hpp)")
      ->check(CLI::IsMember({"none", "sidp"}))
      ->capture_default_str();
  cmd->add_option("--sidp-tables", a->sidp_tables, "Which SiDP tables: capacity,crossover,e2e,peak")
      ->capture_default_str();
  cmd->add_option("--sidp-batches", a->sidp_batches, "Batch sizes per rank of the crossover table")
      ->capture_default_str();
  cmd->add_option("--sidp-output-range", a->sidp_output_range,
                  "MIN:MAX generated tokens of the long-tailed job (log-uniform)")
      ->capture_default_str();
  cmd->add_option("--sidp-cache-slots", a->sidp.cache_slots, "WaS cache slots per rank")->capture_default_str();
  cmd->add_option("--sidp-switch-batch", a->sidp.switch_batch,
                  "Group b* of the auto run (sum of running sequences); 0: the cost model's per-rank b* x dp")
      ->capture_default_str();
  cmd->add_option("--sidp-min-dwell", a->sidp.min_dwell_s, "Seconds below b* before switching to CaS")
      ->capture_default_str();
  cmd->add_option("--link-gbps", a->sidp.link.gbps,
                  "Emulated per-rank link bandwidth, GB/s. SiDP: 0 = --link-ratio x measured memory bandwidth / dp; "
                  "--seesaw: the link between each group's devices (pipeline sends, TP / SP collectives), 0 = unpaced")
      ->capture_default_str();
  cmd->add_option("--link-latency-us", a->sidp.link.latency_us, "Emulated link latency per transfer, us")
      ->capture_default_str();
  cmd->add_option("--link-ratio", a->sidp.link_ratio,
                  "Link / memory bandwidth when --link-gbps is 0 (H200: 900 / 4800 = 0.19)")
      ->capture_default_str();
  add_shift_flags(*cmd, a->engine);
  cmd->add_option("--shift-long", a->shift_long,
                  "With --shift: the long class of the mixed workload, COUNTxINPUT/OUTPUT")
      ->capture_default_str();
  cmd->add_option("--shift-short", a->shift_short, "With --shift: the short class, COUNTxINPUT/OUTPUT")
      ->capture_default_str();
  cmd->add_option("--arrival-rate", a->shift.arrival_rate,
                  "With --shift: Poisson arrivals of the mixed workload, requests/s (0: all at once)")
      ->capture_default_str();
  cmd->add_option("--shift-sweep", a->shift_sweep,
                  "With --shift: tokens per step of the crossover sweep (\"\" to skip)")
      ->capture_default_str();
  cmd->add_option("--shift-max-decode", a->shift.max_decode_sweep,
                  "With --shift: decode steps of the sweep up to this many sequences")
      ->capture_default_str();
  cmd->add_option("--seesaw", a->seesaw,
                  "Benchmark Seesaw CP:CD (e.g. pp=2:tp=2: prefill in pp=2, decode in tp=2) against static cd, cp "
                  "and dp on the same in-process CPU devices, and its three schedules (bench/seesaw.hpp)");
  cmd->add_option("--seesaw-ratios", a->seesaw_ratios,
                  "With --seesaw: INPUT/OUTPUT lengths of the configs table, one offline batch each")
      ->capture_default_str();
  cmd->add_option("--seesaw-policy-ratios", a->seesaw_policy_ratios,
                  "With --seesaw: the ratios of the schedules table (\"\" to skip it)")
      ->capture_default_str();
  cmd->add_option("--seesaw-requests", a->seesaw_requests, "With --seesaw: requests per ratio and run")
      ->capture_default_str();
  cmd->add_option("--host-kv-bytes", a->host_kv_bytes,
                  "With --seesaw: Seesaw's host KV buffer (bytes, or 512M, 4G ...; default: --swap-space)")
      ->type_name("SIZE");
  cmd->add_option("--reshard-weights", a->engine.reshard_weights,
                  "With --seesaw: resident (both shards packed on every rank) or reload (the inactive shard freed "
                  "and repacked at each transition)")
      ->capture_default_str();
  cmd->add_option("--seesaw-min-prefill-prompts", a->seesaw_min_prefill_prompts,
                  "With --seesaw, transition-minimizing: decode -> prefill needs this many waiting prompts while "
                  "decodes remain")
      ->capture_default_str();
  cmd->add_option("--seesaw-copy-ratios", a->seesaw_copy_ratios,
                  "With --seesaw: the ratios of the copies table, KV copies sync vs async (\"\" to skip it)")
      ->capture_default_str();
  cmd->add_option("--seesaw-kv-copy", a->seesaw_kv_copy,
                  "With --seesaw: async (a prefetcher thread, §5.2) or sync KV copies in the configs and schedules "
                  "tables")
      ->capture_default_str();
  cmd->add_option("--host-link-gbps", a->host_link_gbps,
                  "With --seesaw: pace the KV copies to an emulated host link (PCIe) of this many GB/s per device "
                  "(0: unpaced)")
      ->capture_default_str();
  cmd->add_option("--host-link-latency-us", a->host_link_latency_us,
                  "With --seesaw: the emulated host link's cost per copy, in microseconds")
      ->capture_default_str();
  cmd->add_option("--repeats", a->shift.repeats, "With --shift or --seesaw: runs of each config, alternating")
      ->capture_default_str();
  cmd->callback([&run, a] { run = [a] { return run_bench(*a); }; });
}

}  // namespace shardline::cli
