#include "cli/group_flags.hpp"

#include <fstream>
#include <iterator>

#include "comm/address.hpp"

namespace shardline::cli {

void add_group_flags(CLI::App& cmd, GroupFlags& f, const std::string& master_help) {
  cmd.add_option("--group-master", f.master, master_help);
  cmd.add_option("--group-key-file", f.key_file,
                 "Shared secret the TCP group's ranks must all know (e.g. the cluster key file)");
  cmd.add_option("--group-timeout-ms", f.timeout_ms,
                 "How long the ranks wait for each other to join, and for any peer in a step")
      ->capture_default_str();
}

Result<engine::TcpGroupOptions> to_tcp_group_options(const GroupFlags& f) {
  if (f.master.empty()) {
    if (!f.key_file.empty()) return make_error(ErrorCode::invalid_argument, "--group-key-file needs --group-master");
    return make_error(ErrorCode::invalid_argument, "--group-master is required here");
  }
  if (auto hp = comm::parse_host_port(f.master); !hp) return hp.error();
  if (f.timeout_ms < 1) return make_error(ErrorCode::invalid_argument, "--group-timeout-ms must be >= 1");
  engine::TcpGroupOptions o;
  o.master = f.master;
  o.timeout = std::chrono::milliseconds(f.timeout_ms);
  if (!f.key_file.empty()) {
    std::ifstream in(f.key_file, std::ios::binary);
    if (!in) return make_error(ErrorCode::not_found, "cannot read --group-key-file " + f.key_file);
    o.key.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return o;
}

}  // namespace shardline::cli
