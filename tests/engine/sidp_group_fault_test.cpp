// SiDP failures in-process (seed 002): killing a layer owner mid-job loses
// nothing (it is respawned, reloads its FFN weights, the ranks waiting on its
// layers resume, outputs bit-identical), in WaS and in CaS; a rank that dies
// fails the group's job within the communicator timeout instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/sidp/sidp_group.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_sidp_group_fault_test {

using namespace std::chrono_literals;
using model::sidp::SidpMode;

EngineOptions stories_options() {
  EngineOptions o;
  o.model_dir = testing_support::kStoriesDir;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 64;
  o.capture_logits = true;
  o.num_threads = 1;
  return o;
}

std::vector<std::vector<std::int32_t>> prompts() { return testing_support::stories_prompt_ids(); }

sampling::SamplingParams greedy(int max_tokens) {
  sampling::SamplingParams g;
  g.temperature = 0.0f;
  g.max_tokens = max_tokens;
  g.ignore_eos = true;
  return g;
}

std::vector<RequestOutput> reference(int max_tokens) {
  auto e = build_engine(stories_options());
  EXPECT_TRUE(e.ok());
  std::vector<LlmEngine*> engines = {e->engine.get()};
  auto out = generate_data_parallel(engines, prompts(), greedy(max_tokens));
  EXPECT_TRUE(out.ok());
  return out.ok() ? *out : std::vector<RequestOutput>{};
}

void expect_identical(const std::vector<RequestOutput>& got, const std::vector<RequestOutput>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i].token_ids, ref[i].token_ids) << "request " << i;
    ASSERT_EQ(got[i].logits.size(), ref[i].logits.size());
    for (std::size_t s = 0; s < ref[i].logits.size(); ++s)
      EXPECT_EQ(0, std::memcmp(got[i].logits[s].data(), ref[i].logits[s].data(), ref[i].logits[s].size() * 4))
          << "request " << i << " step " << s;
  }
}

class SidpOwnerKill : public testing::TestWithParam<SidpMode> {};

TEST_P(SidpOwnerKill, KilledOwnerIsRespawnedAndTheOutputIsBitIdentical) {
  const int max_tokens = 96;
  const auto ref = reference(max_tokens);
  SidpOptions so;
  so.initial_mode = GetParam();
  auto group = SidpGroup::create(stories_options(), so);
  ASSERT_TRUE(group.ok()) << group.error().to_string();
  SidpGroup& g = **group;
  std::atomic<int> rank0_steps{0};
  std::atomic<bool> killed{false};
  std::thread killer([&] {
    while (rank0_steps.load() < 5) std::this_thread::sleep_for(1ms);
    g.kill_owner(1);  // layers 1 and 3 are gone
    killed = true;
    std::this_thread::sleep_for(100ms);  // the supervisor's restart delay
    ASSERT_TRUE(g.respawn_owner(1).ok());
  });
  auto out = generate_sidp(g, prompts(), greedy(max_tokens), 1,
                           [&](int rank, int) { if (rank == 0) ++rank0_steps; });
  killer.join();
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  EXPECT_TRUE(killed.load());
  EXPECT_EQ(g.owner(1).loads(), 2u) << "the owner was not reloaded";
  expect_identical(*out, ref);
}

INSTANTIATE_TEST_SUITE_P(Modes, SidpOwnerKill, testing::Values(SidpMode::was, SidpMode::cas),
                         [](const auto& info) { return std::string(model::sidp::mode_name(info.param)); });

TEST(SidpRankDeath, ADeadRankFailsTheJobWithinTheTimeoutInsteadOfHanging) {
  for (SidpMode mode : {SidpMode::was, SidpMode::cas}) {
    SidpOptions so;
    so.initial_mode = mode;
    so.comm_timeout = 500ms;
    so.owner_wait = 500ms;
    auto group = SidpGroup::create(stories_options(), so);
    ASSERT_TRUE(group.ok()) << group.error().to_string();
    SidpGroup& g = **group;
    std::atomic<int> steps{0};
    std::thread killer([&] {
      while (steps.load() < 3) std::this_thread::sleep_for(1ms);
      g.mark_rank_dead(1);  // rank 1 crashed: its communicators are gone
    });
    const auto t0 = std::chrono::steady_clock::now();
    auto out = generate_sidp(g, prompts(), greedy(400), 1, [&](int, int) { ++steps; });
    killer.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(out.ok()) << model::sidp::mode_name(mode);
    EXPECT_EQ(out.error().code, ErrorCode::io) << out.error().to_string();
    EXPECT_LT(s, 60.0) << model::sidp::mode_name(mode);
  }
}

}  // namespace
}  // namespace shardline::engine
