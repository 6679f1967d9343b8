// A SiDP group whose ranks are processes (engine/sidp/sidp_process.hpp): rank 0
// is this test's SidpGroup, ranks 1.. are `shardline shard serve
// --weight-sharing sidp` child processes. Weight regions are read with
// one-sided gets and CaS rows travel over real sockets between processes,
// and the outputs are the reference greedy ids with logits bit-identical
// (memcmp) to one device, in WaS, in CaS and when the orchestrator's
// directive switches the mode back and forth mid-generation:
//  - stories260K (5 layers) at dp = 2 and 3 (two child processes);
//  - a dummy Qwen3 shape (qwen3-0.6b, 5 layers) at dp = 2.
// Also: a rank whose model differs from rank 0's is refused with the field
// named, and a second generate on the same group (a second round) works.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/sidp/sidp_group.hpp"
#include "tests/support/process.hpp"
#include "tests/support/sidp_golden.hpp"
#include "tests/support/dummy_qwen3.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_sidp_process_golden_test {

using model::sidp::SidpMode;
using testing_support::Child;
using testing_support::kShardline;
using testing_support::kStoriesDir;


EngineOptions stories_options() {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 7;  // chunked prefill
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  return o;
}

EngineOptions qwen3_options() { return testing_support::dummy_qwen3_options(); }

/// The child's flags for the same engine config as `o` (its own engine).
std::vector<std::string> engine_args(const EngineOptions& o) {
  std::vector<std::string> a = {"--model",         o.model_dir,
                                "--block-size",    std::to_string(o.block_size),
                                "--kv-cache-bytes", std::to_string(o.kv_cache_bytes),
                                "--max-num-seqs",  std::to_string(o.max_num_seqs),
                                "--max-num-batched-tokens", std::to_string(o.max_num_batched_tokens),
                                "--threads",       "1"};
  if (o.max_model_len > 0) a.insert(a.end(), {"--max-model-len", std::to_string(o.max_model_len)});
  if (o.load_format == model::LoadFormat::dummy) a.insert(a.end(), {"--load-format", "dummy"});
  if (o.num_layers_override > 0) a.insert(a.end(), {"--num-layers", std::to_string(o.num_layers_override)});
  return a;
}

class SidpProcessGolden : public testing_support::TempDirTest {
 protected:
  /// `shard serve --weight-sharing sidp` as rank `rank` of `dp`.
  std::unique_ptr<Child> rank_process(const EngineOptions& o, int dp, int rank, const std::string& master,
                                      const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {kShardline, "shard", "serve", "--weight-sharing", "sidp", "--parallel",
                                     "dp=" + std::to_string(dp), "--rank", std::to_string(rank), "--group-master",
                                     master, "--timeout-ms", "30000"};
    for (const std::string& s : engine_args(o)) argv.push_back(s);
    for (const std::string& s : extra) argv.push_back(s);
    return std::make_unique<Child>(argv, path("rank" + std::to_string(rank) + ".log"));
  }

  static SidpOptions process_options(int dp, SidpMode mode, const std::string& master) {
    SidpOptions so;
    so.dp = dp;
    so.initial_mode = mode;
    so.processes = TcpGroupOptions{master, "", std::chrono::milliseconds(30'000)};
    return so;
  }

  static std::string fresh_master() {
    return "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  }
};

using testing_support::expect_bit_identical;
using testing_support::run_single;
using testing_support::scripted_switches;
using Drive = testing_support::SidpDrive;
using testing_support::drive_name;

/// Every rank (remote ones as of their last `done`) ran the drive's modes.
void expect_modes_ran(SidpGroup& g, Drive drive, const std::string& what) {
  std::vector<model::sidp::SidpFfnStats> stats;
  for (int r = 0; r < g.dp(); ++r) stats.push_back(g.ffn_stats(r));
  testing_support::expect_modes_ran(stats, drive, what);
}

TEST_F(SidpProcessGolden, Stories260KOverProcessesIsBitIdenticalToOneDevice) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::stories_prompt_ids();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 48;
  auto single = run_single(stories_options(), prompts, greedy);
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  for (const auto& [dp, drive] : {std::pair{2, Drive::was}, std::pair{2, Drive::cas}, std::pair{3, Drive::switching}}) {
    const std::string what = std::string("processes dp=") + std::to_string(dp) + " " + drive_name(drive);
    SCOPED_TRACE(what);
    const std::string master = fresh_master();
    std::vector<std::unique_ptr<Child>> children;
    for (int r = 1; r < dp; ++r) children.push_back(rank_process(stories_options(), dp, r, master));
    {
      auto group = SidpGroup::create(stories_options(),
                                     process_options(dp, drive == Drive::cas ? SidpMode::cas : SidpMode::was, master));
      ASSERT_TRUE(group.ok()) << group.error().to_string() << "\n" << children[0]->log();
      SidpGroup& g = **group;
      ASSERT_TRUE(g.local(0));
      for (int r = 1; r < dp; ++r) ASSERT_FALSE(g.local(r));
      std::atomic<int> steps{0};
      SidpStepObserver observer;
      if (drive == Drive::switching) observer = scripted_switches(g, steps);
      auto got = generate_sidp(g, prompts, greedy, 1, observer);
      ASSERT_TRUE(got.ok()) << got.error().to_string() << "\n" << children[0]->log();
      for (std::size_t i = 0; i < cases.size(); ++i) {
        EXPECT_EQ(got->at(i).token_ids, cases[i].generated_ids) << " case " << i;
      }
      expect_bit_identical(*got, *single, what);
      expect_modes_ran(g, drive, what);
      // Rank 0's own sockets and each child's carried the group's data.
      EXPECT_GT(g.weights_comm(0).bytes_sent() + g.compute_comm(0).bytes_sent(), 0u);
      for (int r = 1; r < dp; ++r) {
        EXPECT_GT(g.remote()->bytes_sent(r), 0u) << "rank " << r << " sent nothing";
        EXPECT_GT(g.weight_bytes(r), 0u);
        EXPECT_GT(g.remote()->num_kv_blocks(r), 0);
      }
      if (dp == 2 && drive == Drive::was) {
        // A second round on the same processes.
        auto again = generate_sidp(g, prompts, greedy, 1);
        ASSERT_TRUE(again.ok()) << again.error().to_string();
        expect_bit_identical(*again, *single, what + " second round");
      }
    }  // the group sends `shutdown`: every child returns 0
    for (auto& c : children) {
      EXPECT_EQ(c->wait_or_kill(std::chrono::seconds(30)), 0) << c->log();
      EXPECT_NE(c->log().find("stopped by rank 0"), std::string::npos) << c->log();
    }
  }
}

TEST_F(SidpProcessGolden, DummyQwen3OverTwoProcessesIsBitIdenticalToOneDevice) {
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::dummy_qwen3_prompts();
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;
  auto single = run_single(qwen3_options(), prompts, greedy);
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  for (Drive drive : {Drive::was, Drive::switching}) {
    const std::string what = std::string("qwen3 processes dp=2 ") + drive_name(drive);
    SCOPED_TRACE(what);
    const std::string master = fresh_master();
    auto child = rank_process(qwen3_options(), 2, 1, master);
    {
      auto group = SidpGroup::create(qwen3_options(), process_options(2, SidpMode::was, master));
      ASSERT_TRUE(group.ok()) << group.error().to_string() << "\n" << child->log();
      std::atomic<int> steps{0};
      SidpStepObserver observer;
      if (drive == Drive::switching) observer = scripted_switches(**group, steps);
      auto got = generate_sidp(**group, prompts, greedy, 1, observer);
      ASSERT_TRUE(got.ok()) << got.error().to_string() << "\n" << child->log();
      expect_bit_identical(*got, *single, what);
      expect_modes_ran(**group, drive, what);
    }
    EXPECT_EQ(child->wait_or_kill(std::chrono::seconds(30)), 0) << child->log();
  }
}

// A rank started with another model depth is refused before any step: rank
// 0's create fails naming the field, and the child exits with it.
TEST_F(SidpProcessGolden, RankWithAnotherModelIsRefusedWithTheFieldNamed) {
  const std::string master = fresh_master();
  auto child = rank_process(stories_options(), 2, 1, master, {"--num-layers", "3"});
  auto group = SidpGroup::create(stories_options(), process_options(2, SidpMode::was, master));
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.error().message.find("num_hidden_layers is 3 here but 5 on rank 0"), std::string::npos)
      << group.error().to_string();
  EXPECT_EQ(child->wait_or_kill(std::chrono::seconds(30)), 1) << child->log();
  EXPECT_NE(child->log().find("num_hidden_layers"), std::string::npos) << child->log();
}

}  // namespace
}  // namespace shardline::engine
