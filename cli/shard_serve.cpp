// `shardline shard serve`: one rank (> 0) of a group whose ranks are
// processes joined over TCP:
//  - an engine group (tp / pp / sp): rank 0 is the engine inside
//    `shardline run` or `shardline node start` given `--group-master`;
//  - a SiDP group (`--weight-sharing sidp --parallel dp=N`): rank 0 is
//    `shardline generate --weight-sharing sidp --group-master` (or any
//    engine::SidpGroup made with SidpOptions::processes).
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.hpp"
#include "cli/engine_flags.hpp"
#include "cli/group_flags.hpp"
#include "engine/group/parallel_config.hpp"
#include "engine/sidp/sidp_process.hpp"
#include "engine/group/tcp_group.hpp"

namespace shardline::cli {

namespace {

struct ShardServeArgs {
  std::string model_dir;
  EngineFlags engine;
  std::string parallel;
  int rank = 1;
  GroupFlags group;
  std::string weight_sharing = "none";
  bool shift = false;  ///< --shift: also hold this rank's shard of the shift config (as rank 0)
  std::string parallel_decode;               ///< --parallel-decode: Seesaw's cd (as rank 0)
  std::string reshard_weights = "resident";  ///< --reshard-weights (as rank 0)
};

int run_sidp_serve(const ShardServeArgs& a, const engine::ParallelConfig& pc, const engine::TcpGroupOptions& tcp) {
  if (pc.dp < 2 || pc.group_size() != 1) {
    std::cerr << "error: --weight-sharing sidp needs --parallel dp=N (N >= 2, one device per rank), got "
              << pc.to_string() << "\n";
    return 2;
  }
  if (a.rank < 1 || a.rank >= pc.dp) {
    std::cerr << "error: --rank must be in [1, " << pc.dp << ") for a SiDP group of dp=" << pc.dp << "\n";
    return 2;
  }
  auto eo = to_engine_options(a.engine, a.model_dir);
  if (!eo) {
    std::cerr << "error: " << eo.error().to_string() << "\n";
    return 2;
  }
  std::cerr << "shard serve: sidp rank " << a.rank << " of dp=" << pc.dp << ", joining " << tcp.master << "\n";
  Status st = engine::serve_sidp_rank(*eo, pc.dp, a.rank, tcp, [](const std::string& line) {
    std::cerr << "shard serve: " << line << "\n";
  });
  if (!st) {
    std::cerr << "error: " << st.error().to_string() << "\n";
    return 1;
  }
  std::cerr << "shard serve: sidp rank " << a.rank << " stopped by rank 0\n";
  return 0;
}

int run_shard_serve(const ShardServeArgs& a) {
  auto pc = engine::parse_parallel_config(a.parallel);
  if (!pc) {
    std::cerr << "error: " << pc.error().to_string() << "\n";
    return 2;
  }
  auto tcp_made = to_tcp_group_options(a.group);
  if (!tcp_made) {
    std::cerr << "error: " << tcp_made.error().to_string() << "\n";
    return 2;
  }
  const engine::TcpGroupOptions& tcp = *tcp_made;
  if (a.weight_sharing == "sidp") {
    if (a.shift || !a.parallel_decode.empty()) {
      std::cerr << "error: --shift and --parallel-decode serve a rank of an engine group (tp, pp and / or sp > 1), "
                   "not a SiDP group\n";
      return 2;
    }
    return run_sidp_serve(a, *pc, tcp);
  }
  if (pc->dp != 1) {
    std::cerr << "error: --parallel of one engine group has dp=1 (got " << pc->to_string() << ")\n";
    return 2;
  }
  std::optional<engine::SeesawGroupOptions> seesaw;
  if (!a.parallel_decode.empty()) {
    auto cd = engine::parse_parallel_config(a.parallel_decode);
    auto weights = engine::parse_reshard_weights(a.reshard_weights);
    if (!cd || !weights) {
      std::cerr << "error: " << (!cd ? "--parallel-decode: " + cd.error().message : weights.error().to_string())
                << "\n";
      return 2;
    }
    if (*cd != *pc) seesaw = engine::SeesawGroupOptions{*cd, *weights};
  } else if (a.reshard_weights != "resident") {
    std::cerr << "error: --reshard-weights is Seesaw's: it needs --parallel-decode\n";
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
  std::cerr << "shard serve: rank " << a.rank << " of " << pc->to_string() << (a.shift ? " with --shift" : "")
            << (seesaw ? " with decode config " + seesaw->decode.to_string() + " (" +
                             engine::to_string(seesaw->weights) + " weights)"
                       : std::string())
            << ", joining " << tcp.master << "\n";
  Status st = engine::serve_tcp_group_rank(shared, *pc, a.rank, eo->num_threads, tcp, a.shift, seesaw);
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
      "serve", "Serve one rank (> 0) of an engine group or a SiDP group over TCP until rank 0 stops the group");
  cmd->add_option("--model", a->model_dir, "Model folder (the same as rank 0's)")->required();
  add_engine_flags(*cmd, a->engine);
  cmd->add_option("--parallel", a->parallel,
                  "The group's config, the same as rank 0's: tp=2 (an engine group, dp=1), or dp=N with "
                  "--weight-sharing sidp")
      ->required();
  cmd->add_option("--rank", a->rank, "This process's rank in the group: [1, tp*pp*sp), or [1, N) for SiDP")
      ->capture_default_str();
  cmd->add_option("--weight-sharing", a->weight_sharing,
                  "sidp: serve one rank of a SiDP group (its layer owner and its own engine; the SiDP settings come "
                  "from rank 0)")
      ->check(CLI::IsMember({"none", "sidp"}))
      ->capture_default_str();
  cmd->add_flag("--shift", a->shift,
                "Shift Parallelism: also hold this rank's shard of the shift config (TP over the group's devices, "
                "sharing the KV cache); use it exactly when rank 0 runs with --shift (its threshold decides the steps)");
  cmd->add_option("--parallel-decode", a->parallel_decode,
                  "Seesaw: also hold this rank's shard of the decode config cd (the same tp, pp, sp as rank 0's "
                  "--parallel-decode; the group switches between --parallel and it)");
  cmd->add_option("--reshard-weights", a->reshard_weights,
                  "Seesaw with --parallel-decode: resident or reload, as rank 0's")
      ->capture_default_str();
  cmd->add_option("--group-master", a->group.master, "Rank 0's HOST:PORT (its --group-master)")->required();
  cmd->add_option("--group-key-file", a->group.key_file,
                  "Shared secret of the group (the same file as rank 0's --group-key-file)");
  cmd->add_option("--timeout-ms", a->group.timeout_ms, "Rendezvous and per-call timeout")->capture_default_str();
  cmd->callback([&run, a] { run = [a] { return run_shard_serve(*a); }; });
}

}  // namespace shardline::cli
