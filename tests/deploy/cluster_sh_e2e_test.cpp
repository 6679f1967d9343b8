// deploy/cluster.sh: `--local 3` starts three nodes (one orchestrator, two
// joined), a job runs across them, one node is killed with SIGKILL
// mid-job (`cluster.sh kill`), and the job still completes with output
// byte-identical to `shardline run`; status reports the dead node and stop
// ends the others. The ssh mode runs through a stand-in `ssh`/`scp` on PATH
// that executes on this machine, so its remote command lines are run for
// real (quoting included) without an ssh server.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/demo_prompts.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace deploy_cluster_sh_e2e_test {

namespace fs = std::filesystem;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

using ClusterSh = testing_support::TempDirTest;

const std::string kScript = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/cluster.sh";

/// Stops the cluster when a test ends, passed or not (no node outlives it).
struct StopAtEnd {
  std::string cluster_sh;
  ~StopAtEnd() { (void)run_command(cluster_sh + " stop"); }
};

TEST_F(ClusterSh, ThreeLocalNodesFinishAJobWhenOneIsKilledMidJob) {
  const std::string cl = kScript + " --local 3 --dir " + path("cluster") + " --bin " + kShardline;
  const StopAtEnd stop_at_end{cl};
  const auto start = run_command(cl + " --model " + testing_support::kStoriesDir +
                                 " start -- --threads 1 --max-batch 4");
  ASSERT_EQ(start.exit_code, 0) << start.out;
  EXPECT_NE(start.out.find("node node2: joined"), std::string::npos) << start.out;
  const std::string addr = read_file(path("cluster/cluster.addr")).substr(0, read_file(path("cluster/cluster.addr")).find('\n'));
  const std::string client = " --node " + addr + " --key-file " + path("cluster/cluster.key");
  auto status = run_command(cl + " status");
  EXPECT_EQ(status.exit_code, 0) << status.out;
  for (const char* w : {"node0/cpu:0", "node1/cpu:0", "node2/cpu:0"})
    EXPECT_NE(status.out.find(w), std::string::npos) << status.out;

  // Long enough that the kill lands mid-job. 150 lines of 48 tokens once
  // finished within the time `cluster.sh kill` took in CI, and once all of
  // 400 did, in a clean-clone trial under ctest -j3 (three nodes run about
  // 1,300 such lines a second here). So each line asks for 400 tokens.
  constexpr int kLines = 400;
  ASSERT_EQ(testing_support::write_demo_prompts(path("in.jsonl"), kLines,
                                                [](int, nlohmann::json& body) { body["max_tokens"] = 400; }),
            kLines);
  const auto submit = run_command(kShardline + " job submit" + client + " --model " + testing_support::kStoriesDir +
                                  " --input " + path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_EQ(submit.exit_code, 0) << submit.out;
  nlohmann::json job;
  for (int i = 0; i < 3000; ++i) {
    job = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out)["jobs"][0];
    if (job["done"].get<int>() >= 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto kill = run_command(cl + " kill node2");
  ASSERT_EQ(kill.exit_code, 0) << kill.out;
  ASSERT_LT(nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out)["jobs"][0]["done"]
                .get<int>(),
            kLines)
      << "the job finished before the kill";
  for (int i = 0; i < 1200; ++i) {
    job = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out)["jobs"][0];
    if (job["state"] != "running" && job["state"] != "queued") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(job["state"], "done") << job.dump() << read_file(path("cluster/node0.log"));
  EXPECT_GT(job["requeued"].get<int>(), 0) << "node2 held no lines when it was killed: " << job.dump();
  status = run_command(cl + " status");
  EXPECT_EQ(status.exit_code, 1) << status.out;
  EXPECT_NE(status.out.find("node node2: down"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("node node1: running"), std::string::npos) << status.out;

  const auto run = run_command(kShardline + " run --quiet --threads 1 --model " + testing_support::kStoriesDir +
                               " --input " + path("in.jsonl") + " --output " + path("run.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_TRUE(testing_support::same_output(read_file(path("out.jsonl")), read_file(path("run.jsonl"))))
      << "the output differs from an uninterrupted run";

  const auto stop = run_command(cl + " stop");
  EXPECT_EQ(stop.exit_code, 0) << stop.out;
  EXPECT_NE(stop.out.find("node node0: stopped"), std::string::npos) << stop.out;
  EXPECT_FALSE(fs::exists(path("cluster/node0.pid")));
  status = run_command(cl + " status");
  EXPECT_NE(status.out.find("node node0: down"), std::string::npos) << status.out;
}

TEST_F(ClusterSh, SshModeRunsItsRemoteCommands) {
  // Stand-ins: `ssh [-o X] HOST CMD` logs HOST and runs CMD here; `scp`
  // copies (the "remote" path is on this machine).
  fs::create_directories(path("bin"));
  std::ofstream(path("bin/ssh")) << "#!/bin/bash\nwhile [[ $1 == -o ]]; do shift 2; done\necho \"$1\" >> "
                                 << path("ssh.log") << "\nshift\nexec bash -c \"$*\"\n";
  std::ofstream(path("bin/scp")) << "#!/bin/bash\nwhile [[ $1 == -* ]]; do [[ $1 == -o ]] && shift; shift; done\n"
                                    "[[ \"$1\" -ef \"${2#*:}\" ]] || cp \"$1\" \"${2#*:}\"\n";
  fs::permissions(path("bin/ssh"), fs::perms::owner_all);
  fs::permissions(path("bin/scp"), fs::perms::owner_all);
  std::ofstream(path("hosts")) << "# name host[:port] [flags]\n"
                                  "alpha 127.0.0.1:0 --threads 1\n"
                                  "\n"
                                  "beta localhost --threads 1 --max-batch 2  # a comment\n";
  const std::string cl = "PATH=" + path("bin") + ":$PATH " + kScript + " --hosts " + path("hosts") + " --dir '" +
                         path("remote dir") + "' --bin " + kShardline;
  const StopAtEnd stop_at_end{cl};
  const auto start = run_command(cl + " --model " + testing_support::kStoriesDir + " start");
  ASSERT_EQ(start.exit_code, 0) << start.out;
  const std::string ssh_log = read_file(path("ssh.log"));
  EXPECT_NE(ssh_log.find("127.0.0.1\n"), std::string::npos) << ssh_log;
  EXPECT_NE(ssh_log.find("localhost\n"), std::string::npos) << ssh_log;
  const auto status = run_command(cl + " status");
  EXPECT_EQ(status.exit_code, 0) << status.out;
  EXPECT_NE(status.out.find("alpha/cpu:0"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("beta/cpu:0"), std::string::npos) << status.out;
  const auto stop = run_command(cl + " stop");
  EXPECT_EQ(stop.exit_code, 0) << stop.out;
  EXPECT_NE(stop.out.find("node alpha: stopped"), std::string::npos) << stop.out;
}

TEST_F(ClusterSh, BadUsageIsAClearError) {
  auto r = run_command(kScript + " start");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("give --hosts FILE or --local N"), std::string::npos) << r.out;
  r = run_command(kScript + " --local x status");
  EXPECT_NE(r.out.find("--local needs a number"), std::string::npos) << r.out;
  r = run_command(kScript + " --local 2 --dir " + path("d") + " start");
  EXPECT_NE(r.out.find("start needs --model"), std::string::npos) << r.out;
  r = run_command(kScript + " --local 2 --dir " + path("d") + " kill node7");
  EXPECT_NE(r.out.find("no node named 'node7'"), std::string::npos) << r.out;
  r = run_command(kScript + " --hosts " + path("missing") + " status");
  EXPECT_NE(r.out.find("cannot read the hosts file"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardline
