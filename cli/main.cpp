// `shardline`: command-line entry point. See README.md and docs/cli.md.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <iostream>

#include "cli/commands.hpp"

namespace {
std::string g_log_level;  // the --log-level flag, "" when not given
}  // namespace

const std::string& shardline::cli::user_log_level() { return g_log_level; }

int shardline::cli::fail(const Error& e, int code) {
  std::cerr << "error: " << e.to_string() << "\n";
  return code;
}

int main(int argc, char** argv) {
  // Logs go to stderr: stdout carries results (generate, tokenize, job ids, JSON).
  spdlog::set_default_logger(spdlog::stderr_color_mt("shardline"));
  CLI::App app{"Shardline: offline, throughput-first LLM inference"};
  app.require_subcommand(1);
  // Given before or after the subcommand (fallthrough).
  app.fallthrough();
  app.add_option("--log-level", g_log_level,
                 "Log lines at this level and above: trace, debug, info, warn, error, off (default info; `run` with "
                 "its progress bar: warn, with --quiet: error)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  std::function<int()> run;
  shardline::cli::add_generate_command(app, run);
  shardline::cli::add_tokenize_command(app, run);
  shardline::cli::add_bench_command(app, run);
  shardline::cli::add_simulate_command(app, run);
  shardline::cli::add_plan_command(app, run);
  shardline::cli::add_shard_commands(app, run);
  shardline::cli::add_cluster_commands(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help is exit 0; every usage error is 2 (docs/cli.md), not CLI11's
    // own codes (106, 109, ...).
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (!g_log_level.empty()) spdlog::set_level(spdlog::level::from_str(g_log_level));
  return run ? run() : 2;
}
