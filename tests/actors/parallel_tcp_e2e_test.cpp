// A whole job through `shardline run --parallel tp=2` (and pp=2) whose
// engine group spans two processes over TCP: rank 0 in the run's worker,
// rank 1 a `shardline shard serve` process. The output is byte-identical to
// the same config with both ranks in one process (the TCP backend sums in the
// same rank order as the in-process one) and to one device on these lines
// (see parallel_e2e_test.cpp for why); the shard process stops when the run
// ends. A shard with the wrong key never joins and the run fails with a
// clear error instead of hanging.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/demo_prompts.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_parallel_tcp_e2e_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

class ParallelTcpE2e : public testing_support::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    testing_support::write_demo_prompts(path("in.jsonl"), 24, [](int i, nlohmann::json& body) {
      body["max_tokens"] = 32;
      body["temperature"] = i % 2 == 0 ? 0.0 : 0.8;
    });
    std::ofstream(path("key")) << "group secret";
    std::ofstream(path("wrong")) << "another secret";
  }

  testing_support::CommandResult run(const std::string& output, const std::string& flags) {
    return run_command(kShardline + " run --log-level info --model " + testing_support::kStoriesDir + " --input " + path("in.jsonl") +
                       " --output " + path(output) + " --max-batch 8 --quiet " + flags);
  }

  Child shard(const std::string& parallel, const std::string& master, const std::string& key,
              const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {kShardline,  "shard", "serve",  "--model", testing_support::kStoriesDir,
                                     "--parallel", parallel, "--rank", "1",       "--group-master",
                                     master,       "--group-key-file", path(key), "--threads", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Child(argv, path("shard.log"));
  }
};

TEST_F(ParallelTcpE2e, JobOverTwoProcessesMatchesOneProcess) {
  for (const std::string parallel : {"tp=2", "pp=2"}) {
    SCOPED_TRACE(parallel);
    const auto local = run("local-" + parallel + ".jsonl", "--parallel " + parallel);
    ASSERT_EQ(local.exit_code, 0) << local.out;
    const auto single = run("single-" + parallel + ".jsonl", "");
    ASSERT_EQ(single.exit_code, 0) << single.out;

    const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
    Child rank1 = shard(parallel, master, "key");  // may start before or after rank 0
    ASSERT_TRUE(rank1.started());
    const auto r = run("tcp-" + parallel + ".jsonl",
                       "--parallel " + parallel + " --group-master " + master + " --group-key-file " + path("key"));
    ASSERT_EQ(r.exit_code, 0) << r.out << "\nshard:\n" << rank1.log();
    const std::string got = read_file(path("tcp-" + parallel + ".jsonl"));
    EXPECT_EQ(std::count(got.begin(), got.end(), '\n'), 24);
    EXPECT_TRUE(testing_support::same_output(got, read_file(path("local-" + parallel + ".jsonl")))) << "TCP group differs from in-process group";
    EXPECT_TRUE(testing_support::same_output(got, read_file(path("single-" + parallel + ".jsonl")))) << "differs from one device";
    // The shard process ends with the run (rank 0 stopped or closed the group).
    EXPECT_NE(rank1.wait_or_kill(std::chrono::seconds(30)), -1) << "shard serve did not stop:\n" << rank1.log();
    EXPECT_NE(rank1.log().find("shard serve: rank 1 of tp="), std::string::npos) << rank1.log();
  }
}

// Shift Parallelism over two processes: `run --parallel sp=2 --shift` as
// rank 0 and `shard serve --shift` as rank 1; the prefill steps of 8 prompts
// run as sp=2, the decode steps of at most 8 sequences as tp=2 over the same
// KV cache. Greedy lines: byte-identical to one device (TP' logits within
// 1e-4; engine-level checks of the modes and logits are in
// tests/engine/tcp_group_shift_golden_test.cpp).
TEST_F(ParallelTcpE2e, JobWithShiftOverTwoProcessesMatchesOneDevice) {
  testing_support::write_demo_prompts(path("in.jsonl"), 24, [](int, nlohmann::json& body) {
    body["max_tokens"] = 32;
    body["temperature"] = 0.0;
    body.erase("seed");
  });
  const auto single = run("single.jsonl", "");
  ASSERT_EQ(single.exit_code, 0) << single.out;
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  Child rank1 = shard("sp=2", master, "key", {"--shift"});
  ASSERT_TRUE(rank1.started());
  const auto r = run("tcp-shift.jsonl", "--parallel sp=2 --shift --shift-threshold 8 --group-master " + master +
                                            " --group-key-file " + path("key"));
  ASSERT_EQ(r.exit_code, 0) << r.out << "\nshard:\n" << rank1.log();
  const std::string got = read_file(path("tcp-shift.jsonl"));
  EXPECT_EQ(std::count(got.begin(), got.end(), '\n'), 24);
  EXPECT_TRUE(testing_support::same_output(got, read_file(path("single.jsonl")))) << "the TCP shift group differs from one device";
  EXPECT_NE(rank1.wait_or_kill(std::chrono::seconds(30)), -1) << "shard serve did not stop:\n" << rank1.log();
  EXPECT_NE(rank1.log().find("shard serve: rank 1 of tp=1,pp=1,sp=2,dp=1 with --shift"), std::string::npos)
      << rank1.log();
}

// Seesaw over two processes: `run --parallel pp=2 --parallel-decode tp=2`
// as rank 0 and `shard serve --parallel pp=2 --parallel-decode tp=2` as rank
// 1. Prefill phases run as pp=2, decode phases as tp=2 over the same two
// processes; each sequence's KV leaves both processes' caches into rank 0's
// host KV buffer (1 MiB: several transitions over 24 lines) and comes back
// re-sharded, each rank gathering and scattering its own share
// (engine/group/group_kv.hpp). The lines are one device's bytes, as in one
// process (tests/actors/parallel_e2e_test.cpp); a rank without the decode
// config is refused and the run fails clearly.
TEST_F(ParallelTcpE2e, JobWithSeesawOverTwoProcessesMatchesOneDevice) {
  const auto single = run("single.jsonl", "");
  ASSERT_EQ(single.exit_code, 0) << single.out;
  struct Case {
    std::string cp, cd, flags;
  };
  const Case cases[] = {{"pp=2", "tp=2", ""}, {"sp=2", "pp=2", " --reshard-weights reload --seesaw-kv-copy sync"}};
  int n = 0;
  for (const auto& [cp, cd, flags] : cases) {
    SCOPED_TRACE(cp + " -> " + cd + flags);
    const std::string out = "tcp-seesaw-" + std::to_string(n++) + ".jsonl";
    const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
    std::vector<std::string> extra = {"--parallel-decode", cd};
    if (flags.find("reload") != std::string::npos) extra.insert(extra.end(), {"--reshard-weights", "reload"});
    Child rank1 = shard(cp, master, "key", extra);
    ASSERT_TRUE(rank1.started());
    const auto r = run(out, "--parallel " + cp + " --parallel-decode " + cd + " --host-kv-bytes 1M" + flags +
                                " --group-master " + master + " --group-key-file " + path("key"));
    ASSERT_EQ(r.exit_code, 0) << r.out << "\nshard:\n" << rank1.log();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex("Seesaw: (\\d+) transitions"))) << r.out;
    EXPECT_GE(std::stoi(m[1].str()), 3) << r.out;
    ASSERT_TRUE(std::regex_search(r.out, m, std::regex("(\\d+) KV copies"))) << r.out;
    EXPECT_GE(std::stoi(m[1].str()), 48) << r.out;  // every line offloaded and onboarded
    const std::string got = read_file(path(out));
    EXPECT_EQ(std::count(got.begin(), got.end(), '\n'), 24);
    EXPECT_TRUE(testing_support::same_output(got, read_file(path("single.jsonl")))) << "the TCP Seesaw pair differs from one device";
    EXPECT_NE(rank1.wait_or_kill(std::chrono::seconds(30)), -1) << "shard serve did not stop:\n" << rank1.log();
    EXPECT_NE(rank1.log().find("with decode config "), std::string::npos) << rank1.log();
  }
  // A rank started without the decode config: it refuses rank 0's setup,
  // and the run fails instead of computing with half a group.
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  Child rank1 = shard("pp=2", master, "key");
  const auto r = run("refused.jsonl", "--parallel pp=2 --parallel-decode tp=2 --group-master " + master +
                                          " --group-key-file " + path("key") + " --group-timeout-ms 4000");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(rank1.wait_or_kill(std::chrono::seconds(30)), 0);
  EXPECT_NE(rank1.log().find("Seesaw's decode config is none here but tp=2,pp=1,sp=1,dp=1 on rank 0"),
            std::string::npos)
      << rank1.log();
}

TEST_F(ParallelTcpE2e, ShardWithTheWrongKeyIsRefusedAndTheRunFailsWithinTheTimeout) {
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  Child rank1 = shard("tp=2", master, "wrong");
  const auto r = run("out.jsonl", "--parallel tp=2 --group-master " + master + " --group-key-file " + path("key") +
                                      " --group-timeout-ms 4000");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("cannot start its engine"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: no worker could start its engine"), std::string::npos) << r.out;
  EXPECT_NE(rank1.wait_or_kill(std::chrono::seconds(30)), 0);
  EXPECT_NE(rank1.log().find("key"), std::string::npos) << rank1.log();
}

TEST_F(ParallelTcpE2e, GroupMasterNeedsOneGroupOfSeveralRanks) {
  const auto r = run("out.jsonl", "--parallel dp=2 --group-master 127.0.0.1:1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--group-master needs one engine group of several ranks"), std::string::npos) << r.out;
  const auto k = run("out.jsonl", "--group-key-file " + path("key"));
  EXPECT_EQ(k.exit_code, 2) << k.out;
  EXPECT_NE(k.out.find("--group-key-file needs --group-master"), std::string::npos) << k.out;
}

}  // namespace
}  // namespace shardline
