// `shardline bench`: offline throughput benchmark with same-run hardware limits.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/gpu_throughput.hpp"
#include "bench/parallel.hpp"
#include "bench/throughput.hpp"
#include "engine/parallel_config.hpp"
#include "cli/commands.hpp"
#include "cli/engine_flags.hpp"

namespace shardline::cli {

namespace {

struct BenchArgs {
  std::string model_dir;
  std::string shape_dir;
  EngineFlags engine;
  bench::ThroughputOptions options;
  std::vector<std::string> parallel;  ///< --parallel, one config each
  std::string token_budget = "both";
};

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
  bench::ParallelBenchOptions po;
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
  return print_report(bench::run_parallel_bench(po));
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
  if (!a.parallel.empty()) return run_parallel(a, *eo);
  a.options.engine = *eo;
  if (eo->device == model::DeviceKind::cuda) return print_report(bench::run_gpu_throughput(a.options));
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
                  "(in-process CPU devices; prints a table on stderr and one JSON line)");
  cmd->add_option("--token-budget", a->token_budget,
                  "With --parallel, the policies for pp > 1 configs: fixed, throttle or both")
      ->check(CLI::IsMember({"fixed", "throttle", "both"}))
      ->capture_default_str();
  cmd->callback([&run, a] { run = [a] { return run_bench(*a); }; });
}

}  // namespace shardline::cli
