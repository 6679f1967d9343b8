#pragma once
/// \file
/// `--group-master`, `--group-key-file` and `--group-timeout-ms`: where the
/// ranks of a multi-process group (an engine group's shards, or a SiDP
/// group's ranks) meet over TCP, and the secret they share.

#include <CLI/CLI.hpp>

#include <string>

#include "common/result.hpp"
#include "engine/group/tcp_group.hpp"

namespace shardline::cli {

struct GroupFlags {
  std::string master;    ///< HOST:PORT of rank 0; "" = every rank in this process
  std::string key_file;  ///< the shared secret's file; "" = none
  int timeout_ms = 60'000;
};

/// Adds the three flags; `master_help` says what binds or joins the master.
void add_group_flags(CLI::App& cmd, GroupFlags& f, const std::string& master_help);

/// The TCP group options (the key read from its file). Errors:
/// invalid_argument (a bad HOST:PORT, a key file without a master, timeout
/// < 1), not_found (the key file cannot be read).
[[nodiscard]] Result<engine::TcpGroupOptions> to_tcp_group_options(const GroupFlags& f);

}  // namespace shardline::cli
