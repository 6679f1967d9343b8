#pragma once
// npm packages for tests that use a real JavaScript client or parser (the
// official `openai` SDK, Prometheus' PromQL parser): installed once per build
// folder under BUILD/<folder>, as CI installs them (the npm registry is
// reachable there).
#include <filesystem>
#include <string>

#include "tests/support/process.hpp"

namespace shardline::testing_support {

/// Installs `packages` (npm specs, space-separated) into BUILD/`folder`
/// unless `probe` (a path under its node_modules/) already exists; returns
/// the folder, whose node_modules/ a script copied there imports from. ""
/// with `why` set when node or npm is missing ("... is not installed": the
/// caller skips) or the install failed (the caller fails).
inline std::string npm_install(const std::string& folder, const std::string& packages, const std::string& probe,
                               std::string* why) {
  if (run_command("command -v node && command -v npm").exit_code != 0) {
    *why = "node or npm is not installed";
    return "";
  }
  const std::string dir = std::string(SHARDLINE_BINARY_DIR) + "/" + folder;
  if (!std::filesystem::exists(dir + "/node_modules/" + probe)) {
    std::filesystem::create_directories(dir);
    const auto r = run_command("cd " + dir + " && (test -f package.json || echo '{\"private\": true}' > package.json)"
                               " && npm install --no-audit --no-fund --loglevel=error " + packages);
    if (r.exit_code != 0) {
      *why = "npm install " + packages + " failed: " + r.out;
      return "";
    }
  }
  return dir;
}

}  // namespace shardline::testing_support
