// `shardline shard serve`: one rank (> 0) of an engine group whose ranks are
// processes joined over TCP. Rank 0 is the engine inside `shardline run` or
// `shardline node start` given `--group-master HOST:PORT`.
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "cli/commands.hpp"
#include "cli/engine_flags.hpp"
#include "engine/parallel_config.hpp"
#include "engine/tcp_group.hpp"

namespace shardline::cli {

namespace {

struct ShardServeArgs {
  std::string model_dir;
  EngineFlags engine;
  std::string parallel;
  int rank = 1;
  std::string master;
  std::string key_file;
  int timeout_ms = 60'000;
};

int run_shard_serve(const ShardServeArgs& a) {
  auto pc = engine::parse_parallel_config(a.parallel);
  if (!pc) {
    std::cerr << "error: " << pc.error().to_string() << "\n";
    return 2;
  }
  if (pc->dp != 1) {
    std::cerr << "error: --parallel of one engine group has dp=1 (got " << pc->to_string() << ")\n";
    return 2;
  }
  auto eo = to_engine_options(a.engine, a.model_dir);
  if (!eo) {
    std::cerr << "error: " << eo.error().to_string() << "\n";
    return 2;
  }
  if (eo->device_memory_bytes > 0) {
    std::cerr << "error: --device-memory plans single-device engines; a TCP group rank is not planned\n";
    return 2;
  }
  engine::TcpGroupOptions tcp;
  tcp.master = a.master;
  tcp.timeout = std::chrono::milliseconds(a.timeout_ms);
  if (!a.key_file.empty()) {
    std::ifstream in(a.key_file, std::ios::binary);
    if (!in) {
      std::cerr << "error: cannot read --key-file " << a.key_file << "\n";
      return 2;
    }
    tcp.key.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  model::LoadOptions lo;
  lo.format = eo->load_format;
  lo.dtype = eo->dtype;
  lo.seed = eo->seed;
  lo.num_layers_override = eo->num_layers_override;
  auto weights = model::load_model(eo->model_dir, lo);
  if (!weights) {
    std::cerr << "error: " << weights.error().to_string() << "\n";
    return 1;
  }
  auto shared = std::make_shared<const model::ModelWeights>(std::move(weights).value());
  std::cerr << "shard serve: rank " << a.rank << " of " << pc->to_string() << ", joining " << a.master << "\n";
  Status st = engine::serve_tcp_group_rank(shared, *pc, a.rank, eo->num_threads, tcp);
  if (!st) {
    std::cerr << "error: " << st.error().to_string() << "\n";
    return 1;
  }
  std::cerr << "shard serve: rank " << a.rank << " stopped by rank 0\n";
  return 0;
}

}  // namespace

void add_shard_commands(CLI::App& app, std::function<int()>& run) {
  CLI::App* shard = app.add_subcommand("shard", "Ranks of multi-process engine groups");
  shard->require_subcommand(1);
  auto a = std::make_shared<ShardServeArgs>();
  CLI::App* cmd = shard->add_subcommand(
      "serve", "Serve one rank (> 0) of an engine group over TCP until rank 0 stops the group");
  cmd->add_option("--model", a->model_dir, "Model folder (the same as rank 0's)")->required();
  add_engine_flags(*cmd, a->engine);
  cmd->add_option("--parallel", a->parallel, "The group's config, e.g. tp=2 (dp=1); the same as rank 0's")
      ->required();
  cmd->add_option("--rank", a->rank, "This process's rank in the group, in [1, tp*pp*sp)")->capture_default_str();
  cmd->add_option("--group-master", a->master, "Rank 0's HOST:PORT (its --group-master)")->required();
  cmd->add_option("--group-key-file", a->key_file, "Shared secret of the group (the same file as rank 0's --group-key-file)");
  cmd->add_option("--timeout-ms", a->timeout_ms, "Rendezvous and per-call timeout")->capture_default_str();
  cmd->callback([&run, a] { run = [a] { return run_shard_serve(*a); }; });
}

}  // namespace shardline::cli
