// The systemd units of deploy/systemd: `systemd-analyze verify` finds nothing
// to say about them (skipped where systemd-analyze is missing), each has
// Restart=on-failure, the example env files set only variables the units
// define, and their ExecStart lines, expanded the way systemd expands them,
// start a node and a node that joins it (the flags are real flags, and the
// joined node's workers register), both stopping cleanly on SIGTERM.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace deploy_systemd_units_e2e_test {

namespace fs = std::filesystem;
using testing_support::Child;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

using SystemdUnits = testing_support::TempDirTest;

const std::string kUnits = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/systemd/";

/// A unit's [Service] settings that matter here: its Environment= defaults
/// (in order) and its ExecStart (continuation lines joined).
struct Unit {
  std::map<std::string, std::string> env;
  std::string exec_start;
  std::vector<std::string> settings;  ///< every "Key=value" line
};

Unit parse_unit(const std::string& path) {
  Unit u;
  std::istringstream in(read_file(path));
  std::string line, logical;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\\') {
      logical += line.substr(0, line.size() - 1);
      continue;
    }
    logical += line;
    if (!logical.empty() && logical[0] != '#' && logical[0] != '[' && logical.find('=') != std::string::npos) {
      u.settings.push_back(logical);
      const std::string key = logical.substr(0, logical.find('='));
      const std::string value = logical.substr(logical.find('=') + 1);
      if (key == "Environment") u.env[value.substr(0, value.find('='))] = value.substr(value.find('=') + 1);
      if (key == "ExecStart") u.exec_start = value;
    }
    logical.clear();
  }
  return u;
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

/// ExecStart as systemd runs it: %i is the instance; "${X}" is X's value as
/// one argument, a word "$X" is X's value split on whitespace (none when
/// empty). `overrides` play the EnvironmentFile.
std::vector<std::string> expand(const Unit& u, const std::map<std::string, std::string>& overrides,
                                const std::string& instance) {
  std::map<std::string, std::string> env = u.env;
  for (const auto& [k, v] : overrides) env[k] = v;
  for (auto& [k, v] : env) v = std::regex_replace(v, std::regex("%i"), instance);
  std::vector<std::string> argv;
  for (std::string word : split_words(std::regex_replace(u.exec_start, std::regex("%i"), instance))) {
    if (word.size() > 1 && word[0] == '$' && word[1] != '{') {
      for (auto& w : split_words(env[word.substr(1)])) argv.push_back(w);
      continue;
    }
    std::smatch m;
    while (std::regex_search(word, m, std::regex("\\$\\{([A-Z_]+)\\}"))) word = m.prefix().str() + env[m[1]] + m.suffix().str();
    argv.push_back(word);
  }
  return argv;
}

TEST_F(SystemdUnits, SystemdAnalyzeVerifyFindsNothing) {
  if (run_command("command -v systemd-analyze").exit_code != 0) GTEST_SKIP() << "systemd-analyze is not installed";
  // The units name the installed binary; here it is the one just built.
  for (const char* name : {"shardline-node.service", "shardline-join@.service"}) {
    std::string text = read_file(kUnits + name);
    ASSERT_NE(text.find("/usr/local/bin/shardline "), std::string::npos) << name;
    text = std::regex_replace(text, std::regex("/usr/local/bin/shardline "), kShardline + " ");
    std::ofstream(path(name)) << text;
  }
  fs::create_symlink(path("shardline-join@.service"), path("shardline-join@node1.service"));
  const auto r = run_command("cd " + dir_.string() +
                             " && systemd-analyze verify ./shardline-node.service ./shardline-join@node1.service");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  // Warnings (an unknown key, a bad value) do not change the exit code.
  EXPECT_EQ(r.out.find("shardline"), std::string::npos) << r.out;
}

TEST_F(SystemdUnits, RestartOnFailureAndExampleEnvFilesMatchTheUnits) {
  for (const auto& [unit, example] : std::vector<std::pair<std::string, std::string>>{
           {"shardline-node.service", "node.env.example"}, {"shardline-join@.service", "join.env.example"}}) {
    const Unit u = parse_unit(kUnits + unit);
    EXPECT_NE(std::find(u.settings.begin(), u.settings.end(), "Restart=on-failure"), u.settings.end()) << unit;
    EXPECT_NE(u.exec_start.find("--data-dir ${SHARDLINE_DATA_DIR}"), std::string::npos) << unit;
    std::istringstream in(read_file(kUnits + example));
    int keys = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      const std::string key = line.substr(0, line.find('='));
      EXPECT_EQ(u.env.count(key), 1u) << example << " sets " << key << ", which " << unit << " does not use";
      ++keys;
    }
    EXPECT_EQ(keys, static_cast<int>(u.env.size())) << example << " should list every setting of " << unit;
  }
}

TEST_F(SystemdUnits, TheirCommandLinesStartANodeAndANodeThatJoinsIt) {
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  std::ofstream(path("api.keys")) << "sk-unit-test\n";
  std::map<std::string, std::string> common{{"SHARDLINE_MODEL", testing_support::kStoriesDir},
                                            {"SHARDLINE_KEY_FILE", path("cluster.key")},
                                            {"SHARDLINE_METRICS", "127.0.0.1:0"},
                                            {"SHARDLINE_HTTP", "127.0.0.1:0"},
                                            {"SHARDLINE_API_KEY_FILE", path("api.keys")},
                                            {"SHARDLINE_ARGS", "--threads 1 --max-batch 4"}};
  auto node_env = common;
  node_env["SHARDLINE_LISTEN"] = "127.0.0.1:0";
  node_env["SHARDLINE_DATA_DIR"] = path("node0");
  std::vector<std::string> argv = expand(parse_unit(kUnits + "shardline-node.service"), node_env, "");
  ASSERT_EQ(argv.at(0), "/usr/local/bin/shardline");
  argv[0] = kShardline;
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--max-batch"), argv.end()) << "SHARDLINE_ARGS were not split";
  Child node(argv, path("node0.log"));
  const std::string log = node.wait_for_log("http api on port", std::chrono::seconds(60));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"))) << log;
  const std::string addr = "127.0.0.1:" + m[1].str();

  auto join_env = common;
  join_env["SHARDLINE_JOIN"] = addr;
  argv = expand(parse_unit(kUnits + "shardline-join@.service"), join_env, "node1");
  argv[0] = kShardline;
  EXPECT_NE(std::find(argv.begin(), argv.end(), "node1"), argv.end()) << "%i is the node's name";
  // Its data dir defaults to /var/lib/shardline/%i; here a temp folder.
  join_env["SHARDLINE_DATA_DIR"] = path("node1");
  argv = expand(parse_unit(kUnits + "shardline-join@.service"), join_env, "node1");
  argv[0] = kShardline;
  Child joined(argv, path("node1.log"));
  std::string actors;
  for (int i = 0; i < 300; ++i) {
    actors = run_command(kShardline + " actor list --node " + addr + " --key-file " + path("cluster.key")).out;
    if (actors.find("node1/cpu:0") != std::string::npos && actors.find("node0/cpu:0") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(actors.find("node1/cpu:0"), std::string::npos) << actors << joined.log();
  EXPECT_NE(actors.find("node0/cpu:0"), std::string::npos) << actors << node.log();
  for (Child* c : {&joined, &node}) {
    c->kill(SIGTERM);  // the units' KillSignal
    EXPECT_EQ(c->wait_or_kill(std::chrono::seconds(30)), 0) << c->log();
  }
}

}  // namespace
}  // namespace shardline
