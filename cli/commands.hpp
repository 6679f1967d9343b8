#pragma once
/// \file
/// The `shardline` subcommands. Each registers its flags on a CLI11 app and
/// returns the process exit code when run (0 ok, 1 runtime error, 2 usage).

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "common/result.hpp"

namespace shardline::cli {

/// Adds a subcommand; `run` is set to the function to call when it is chosen.
void add_tokenize_command(CLI::App& app, std::function<int()>& run);
void add_generate_command(CLI::App& app, std::function<int()>& run);
void add_bench_command(CLI::App& app, std::function<int()>& run);
/// `simulate`: the engine on a described cluster (sim/simulator.hpp).
void add_simulate_command(CLI::App& app, std::function<int()>& run);
/// `plan`: every strategy ranked by simulated throughput (sim/planner.hpp).
void add_plan_command(CLI::App& app, std::function<int()>& run);
/// `shard serve`: a rank of a multi-process (TCP) engine group.
void add_shard_commands(CLI::App& app, std::function<int()>& run);
/// cluster init, node start, job submit/status, actor list/kill, run.
void add_cluster_commands(CLI::App& app, std::function<int()>& run);

/// The `--log-level` given on the command line ("" when none: info, or for
/// `run` with its progress bar warn, and error with --quiet).
[[nodiscard]] const std::string& user_log_level();

/// Prints "error: <e>" on stderr and returns `code`, the command's exit
/// status (1: a runtime error).
int fail(const Error& e, int code = 1);

}  // namespace shardline::cli
