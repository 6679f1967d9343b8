// Failures of a SiDP group whose ranks are processes (engine/sidp/sidp_process.hpp):
//  - a rank process killed mid-generation (WaS and CaS) makes rank 0's
//    generate fail with an error naming it, well within the communicator
//    timeout (its sockets close), instead of hanging;
//  - a rank whose rank 0 is killed mid-generation notices and exits with an
//    error instead of waiting forever.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/sidp/sidp_group.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_sidp_process_fault_test {

using model::sidp::SidpMode;
using testing_support::Child;
using testing_support::kShardline;
using testing_support::kStoriesDir;

using Clock = std::chrono::steady_clock;

class SidpProcessFault : public testing_support::TempDirTest {
 protected:
  std::unique_ptr<Child> rank1(const std::string& master) {
    return std::make_unique<Child>(
        std::vector<std::string>{kShardline, "shard", "serve", "--weight-sharing", "sidp", "--parallel", "dp=2",
                                 "--rank", "1", "--group-master", master, "--model", kStoriesDir, "--threads", "1",
                                 "--kv-cache-bytes", std::to_string(32u << 20), "--timeout-ms", "20000"},
        path("rank1.log"));
  }
};

EngineOptions options() {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.kv_cache_bytes = 32u << 20;
  o.num_threads = 1;
  return o;
}

std::vector<std::vector<std::int32_t>> many_prompts() {
  std::vector<std::vector<std::int32_t>> out;
  const auto base = testing_support::stories_prompt_ids();
  for (int i = 0; i < 16; ++i) out.push_back(base[static_cast<std::size_t>(i) % base.size()]);
  return out;
}

TEST_F(SidpProcessFault, KilledRankFailsRankZerosGenerateNamingItWithoutHanging) {
  for (SidpMode mode : {SidpMode::was, SidpMode::cas}) {
    SCOPED_TRACE(model::sidp::mode_name(mode));
    const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
    auto child = rank1(master);
    SidpOptions so;
    so.dp = 2;
    so.initial_mode = mode;
    so.owner_wait = std::chrono::milliseconds(20'000);
    so.comm_timeout = std::chrono::milliseconds(20'000);
    so.processes = TcpGroupOptions{master, "", std::chrono::milliseconds(20'000)};
    auto group = SidpGroup::create(options(), so);
    ASSERT_TRUE(group.ok()) << group.error().to_string() << "\n" << child->log();
    sampling::SamplingParams params;
    params.temperature = 0.0f;
    params.max_tokens = 200;
    params.ignore_eos = true;
    std::atomic<int> rank1_steps{0};
    Clock::time_point killed_at{};
    auto got = generate_sidp(**group, many_prompts(), params, 1, [&](int rank, int num_seqs) {
      if (rank == 1 && num_seqs > 0 && ++rank1_steps == 10) {
        killed_at = Clock::now();
        child->kill(SIGKILL);
      }
    });
    ASSERT_FALSE(got.ok()) << "generate succeeded although rank 1 was killed";
    ASSERT_GE(rank1_steps.load(), 10);
    const double after_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
    EXPECT_LT(after_s, 10.0) << "rank 0 took " << after_s << " s to notice (timeouts are 20 s)";
    EXPECT_EQ(got.error().code, ErrorCode::io) << got.error().to_string();
    EXPECT_NE(got.error().message.find("rank 1"), std::string::npos) << got.error().to_string();
    EXPECT_EQ(child->wait(), 128 + SIGKILL);
  }
}

TEST_F(SidpProcessFault, RankExitsWithAnErrorWhenRankZeroIsKilled) {
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  auto child = rank1(master);
  std::vector<std::string> argv = {kShardline, "generate", "--model", kStoriesDir, "--parallel", "dp=2",
                                   "--weight-sharing", "sidp", "--sidp-mode", "was", "--group-master", master,
                                   "--threads", "1", "--kv-cache-bytes", std::to_string(32u << 20),
                                   "--max-tokens", "400", "--ignore-eos", "--temperature", "0"};
  // Enough work that it cannot finish in the 300 ms before the kill, even on
  // a fast machine: with 16 prompts rank 0 once ended the job (and shut rank
  // 1 down cleanly) before the kill landed.
  for (int i = 0; i < 128; ++i) argv.insert(argv.end(), {"--prompt", "Once upon a time " + std::to_string(i)});
  Child rank0(argv, path("rank0.log"));
  const std::string log = child->wait_for_log("ready", std::chrono::seconds(20));
  ASSERT_NE(log.find("ready"), std::string::npos) << log << "\nrank 0:\n" << rank0.log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // mid-generation
  ASSERT_FALSE(rank0.exited()) << "generation ended too soon to test:\n" << rank0.log();
  const auto killed_at = Clock::now();
  rank0.kill(SIGKILL);
  const int code = child->wait_or_kill(std::chrono::seconds(15));
  const double after_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  EXPECT_EQ(code, 1) << "rank 1 did not exit with an error after rank 0 died (" << after_s << " s):\n" << child->log();
  // Its step's get or CaS exchange, or its control channel, names the dead rank 0.
  const std::string l = child->log();
  EXPECT_TRUE(l.find("rank 0 is dead") != std::string::npos || l.find("rank 0 went away") != std::string::npos) << l;
}

}  // namespace
}  // namespace shardline::engine
