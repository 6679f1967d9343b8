// `shardline`: command-line entry point. See README.md and docs/cli.md.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <iostream>

#include "cli/commands.hpp"

int main(int argc, char** argv) {
  // Logs go to stderr: stdout carries results (generate, tokenize, job ids, JSON).
  spdlog::set_default_logger(spdlog::stderr_color_mt("shardline"));
  CLI::App app{"Shardline: offline, throughput-first LLM inference"};
  app.require_subcommand(1);
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
    return app.exit(e);
  }
  return run ? run() : 2;
}
