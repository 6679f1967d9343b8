// Fault tests: kill -9 of the node at random points of a 200-request job,
// restart, and the finished output is byte-identical to a run without kills
// (every custom_id exactly once); `actor kill` of the worker mid-job (it
// holds unfinished lines, which are requeued) and the job still finishes with
// the same bytes, also when every line is under a grammar (structured
// outputs). A SIGTERM that the kernel hands to a thread other than
// the main one (a thread a library started before main()) still stops the
// node cleanly.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/actors/node_harness.hpp"
#include "tests/support/demo_prompts.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_node_fault_test {

namespace fs = std::filesystem;
using testing_support::Child;
using testing_support::expect_each_custom_id_once;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

class NodeFault : public testing_support::TempDirTest {
 protected:
  /// The first `n` requests of the demo set with `max_tokens` each (seeded
  /// sampling, every 10th line greedy, as in the demo set).
  /// `edit(i, body)` may change line i's request body further.
  void write_input(int n, int max_tokens, const std::function<void(int, nlohmann::json&)>& edit = nullptr) {
    testing_support::write_demo_prompts(path("in.jsonl"), n, [&](int i, nlohmann::json& body) {
      body["max_tokens"] = max_tokens;
      if (edit) edit(i, body);
    });
  }

  std::vector<std::string> run_args(const std::string& output, const std::string& data_dir) const {
    return {kShardline, "run", "--quiet", "--model", testing_support::kStoriesDir, "--input", path("in.jsonl"),
            "--output", output, "--data-dir", data_dir, "--max-batch", "32"};
  }

  /// The output of an uninterrupted run.
  std::string clean_output() {
    Child clean(run_args(path("clean.jsonl"), path("clean.data")), path("clean.log"));
    EXPECT_EQ(clean.wait(), 0) << clean.log();
    return read_file(path("clean.jsonl"));
  }

  /// Submits in.jsonl (`num_lines` lines) to a node, kills its worker with
  /// `actor kill` once a max batch of lines is done (so it holds lines it
  /// has not finished), and checks that the job finishes with the bytes of
  /// an uninterrupted run, each line once.
  void kill_the_worker_mid_job(int num_lines);

};

std::size_t count_lines(const std::string& file) {
  const std::string s = read_file(file);
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

TEST_F(NodeFault, KillNineAtRandomPointsThenRestartGivesIdenticalOutput) {
  write_input(200, 300);
  const std::string expected = clean_output();
  expect_each_custom_id_once(expected, 200);

  // Six kill points: one at a random moment of the start-up, then each time
  // the output has passed another 30 lines, plus a random 0-150 ms (so the
  // process dies between its commits, mid-write, or mid-step). Every restart
  // resumes from the durable state.
  std::mt19937 rng(20261121);
  std::uniform_int_distribution<int> startup_ms(50, 400), jitter_ms(0, 150);
  int kills = 0;
  for (std::size_t target : {std::size_t{0}, std::size_t{30}, std::size_t{60}, std::size_t{90}, std::size_t{120},
                             std::size_t{150}}) {
    Child run(run_args(path("out.jsonl"), path("data")), path("run.log"));
    if (target == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(startup_ms(rng)));
    } else {
      while (!run.exited() && count_lines(path("out.jsonl")) < target)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::milliseconds(jitter_ms(rng)));
    }
    ASSERT_FALSE(run.exited()) << "the job finished before kill point " << target << ": " << run.log();
    run.kill(SIGKILL);
    EXPECT_EQ(run.wait(), 128 + SIGKILL);
    ++kills;
  }
  EXPECT_EQ(kills, 6);
  EXPECT_LT(count_lines(path("out.jsonl")), 200u) << "the kills did not interrupt the job";
  // A torn tail may be on disk now; the restart truncates it and finishes.
  // Without --quiet, to see its warnings: a `run` has no workers on other
  // nodes, so it starts over its unfinished job without waiting for any.
  std::vector<std::string> args = run_args(path("out.jsonl"), path("data"));
  args.erase(std::find(args.begin(), args.end(), "--quiet"));
  Child last(args, path("last.log"));
  ASSERT_EQ(last.wait(), 0) << last.log();
  EXPECT_EQ(last.log().find("started over unfinished jobs"), std::string::npos) << last.log();
  const std::string got = read_file(path("out.jsonl"));
  expect_each_custom_id_once(got, 200);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after kills differs from the clean run";
}

TEST_F(NodeFault, ActorKillOfTheWorkerStillFinishesTheJob) {
  // Enough lines that the job is far from done when the kill lands, even
  // on a loaded machine where `actor kill` takes a while to start (with
  // 120 the rest of the job once finished before the kill landed).
  write_input(360, 120);
  kill_the_worker_mid_job(360);
}

// Structured outputs (issue 43): every line under a grammar (vLLM's guided
// JSON schema, regex and choice), the worker killed mid-job. Its unfinished lines go to the
// restarted worker, whose matchers replay what each line generated, and the
// output is the uninterrupted run's, byte for byte.
TEST_F(NodeFault, ActorKillOfTheWorkerMidLineKeepsConstrainedOutputs) {
  const nlohmann::json schema = {
      {"type", "object"},
      {"properties",
       {{"name", {{"type", "string"}, {"maxLength", 40}}},
        {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 120}}},
        {"mood", {{"enum", {"happy", "sad", "sleepy"}}}}}},
      {"required", {"name", "age", "mood"}},
      {"additionalProperties", false}};
  write_input(360, 120, [&](int i, nlohmann::json& body) {
    switch (i % 3) {
      case 0: body["guided_json"] = schema; break;
      case 1: body["guided_regex"] = "(The|A) [a-z]{1,12}( [a-z]{1,12}){2,10}\\."; break;
      default: body["guided_choice"] = {"happy", "sad", "very sleepy"};
    }
  });
  kill_the_worker_mid_job(360);
  // The grammars were applied: each choice line's text is one of its choices.
  int num_chosen = 0;
  std::istringstream out(read_file(path("out.jsonl")));
  for (std::string line; std::getline(out, line);) {
    const auto text = nlohmann::json::parse(line)["response"]["body"]["choices"][0]["text"].get<std::string>();
    num_chosen += text == "happy" || text == "sad" || text == "very sleepy" ? 1 : 0;
  }
  EXPECT_EQ(num_chosen, 120);
}

void NodeFault::kill_the_worker_mid_job(int num_lines) {
  const int kLines = num_lines;
  constexpr int kMaxBatch = 32;
  const std::string expected = clean_output();
  expect_each_custom_id_once(expected, kLines);
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--max-batch",
              std::to_string(kMaxBatch)},
             path("node.log"));
  const std::string log = node.wait_for_log("listening on", std::chrono::seconds(30));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"))) << log;
  const std::string client = " --node 127.0.0.1:" + m[1].str() + " --key-file " + path("cluster.key");
  ASSERT_EQ(run_command(kShardline + " job submit" + client + " --model " + testing_support::kStoriesDir +
                        " --input " + path("in.jsonl") + " --output " + path("out.jsonl"))
                .exit_code,
            0);
  // Wait for some progress, then kill the worker the way a crash would:
  // mid-job, so that it holds lines it has not finished.
  int done_before_kill = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    auto s = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out);
    done_before_kill = s["jobs"][0]["done"].get<int>();
    if (done_before_kill >= kMaxBatch) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(done_before_kill, kMaxBatch) << "no progress before the kill: " << node.log();
  ASSERT_LT(done_before_kill, kLines) << "the job finished before the kill";
  auto kill = run_command(kShardline + " actor kill node0/cpu:0" + client);
  ASSERT_EQ(kill.exit_code, 0) << kill.out;
  auto unknown = run_command(kShardline + " actor kill node0/cpu:9" + client);
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.out.find("no actor named"), std::string::npos) << unknown.out;

  nlohmann::json status;
  for (int i = 0; i < 600; ++i) {
    status = nlohmann::json::parse(run_command(kShardline + " job status 1 --json" + client).out);
    if (status["jobs"][0]["state"] == "done") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << node.log();
  EXPECT_NE(node.log().find("worker node0/cpu:0 died (exit_reason(kill)); restarting it"), std::string::npos)
      << node.log();
  // The kill landed while the worker held lines: the orchestrator requeued
  // them (at least one, at most its queue of 2 x max batch, and none that
  // were done before the kill).
  const std::string node_log = node.log();
  std::smatch requeued;
  const std::regex requeue_line("worker node0/cpu:0 died \\(exit_reason\\(kill\\)\\); (\\d+) lines requeued");
  ASSERT_TRUE(std::regex_search(node_log, requeued, requeue_line)) << node_log;
  const int n = std::stoi(requeued[1].str());
  RecordProperty("requeued", n);
  RecordProperty("done_before_kill", done_before_kill);
  EXPECT_GE(n, 1) << "the kill did not land mid-job (killed at " << done_before_kill << " lines done)";
  EXPECT_LE(n, 2 * kMaxBatch);
  EXPECT_LE(n, kLines - done_before_kill);
  const std::string got = read_file(path("out.jsonl"));
  expect_each_custom_id_once(got, kLines);
  EXPECT_TRUE(testing_support::same_output(got, expected)) << "output after the worker kill differs";
  node.kill(SIGTERM);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(20)), 0) << "node did not stop on SIGTERM: " << node.log();
}

/// The threads of `pid` other than its main thread that do not block
/// SIGTERM (their SigBlk in /proc/PID/task/TID/status lacks bit 15).
std::vector<int> threads_taking_sigterm(int pid) {
  std::vector<int> out;
  for (const auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    const int tid = std::stoi(task.path().filename().string());
    if (tid == pid) continue;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigBlk:", 0) != 0) continue;
      const unsigned long long blocked = std::stoull(line.substr(7), nullptr, 16);
      if ((blocked & (1ull << (SIGTERM - 1))) == 0) out.push_back(tid);
    }
  }
  return out;
}

TEST_F(NodeFault, SigtermTakenByAThreadOtherThanMainStillStopsTheNodeCleanly) {
  // OpenBLAS (pthread build) starts its thread pool in its library
  // constructor, before main() blocks the stop signals, so its threads take
  // them. Two BLAS threads make one such thread on any machine. A
  // process-directed SIGTERM may land on it; tgkill sends it there for sure.
  ASSERT_EQ(::setenv("OPENBLAS_NUM_THREADS", "2", 1), 0);
  ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + path("cluster.key")).exit_code, 0);
  Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", path("data"), "--model",
              testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--threads", "1"},
             path("node.log"));
  node.wait_for_log("listening on", std::chrono::seconds(30));
  const std::vector<int> foreign = threads_taking_sigterm(node.pid());
  ASSERT_FALSE(foreign.empty()) << "no thread but main takes SIGTERM: this test cannot reach its case";
  ASSERT_EQ(::syscall(SYS_tgkill, node.pid(), foreign.front(), SIGTERM), 0);
  EXPECT_EQ(node.wait_or_kill(std::chrono::seconds(30)), 0) << "the node did not stop cleanly: " << node.log();
  EXPECT_NE(node.log().find("signal 15, stopping"), std::string::npos) << node.log();
}

}  // namespace
}  // namespace shardline
