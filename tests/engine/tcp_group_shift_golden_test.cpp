// Shift Parallelism (seed 001 §3.3, Alg. 3) on engine groups over TCP
// (ranks as threads here; as processes in tests/actors/parallel_tcp_e2e_test.cpp):
// sp=2 and sp=2,tp=2 on stories260K with a threshold that runs the chunked
// prefill steps in the base config and the small decode steps in the shift
// config give the reference greedy ids and logits bit-identical to the same
// group in one process (the TCP shift group sums in the same §3.3.1 rank
// order as the in-process one); steps ran in both configs and switched.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "engine/group/engine_builder.hpp"
#include "engine/group/tcp_group.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_tcp_group_shift_golden_test {

EngineOptions stories_shift(const ParallelConfig& pc) {
  EngineOptions o;
  o.model_dir = testing_support::kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 7;  // 7-token prefill chunks (base), then decode steps of the running count
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  o.parallel = pc;
  o.shift = ShiftOptions{ShiftPolicyOptions{3, 0.25}};  // shift at <= 3 tokens, back above 3
  return o;
}

TEST(TcpGroupShift, ShiftGroupOverTcpMatchesTheInProcessGroupAndTheReference) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::stories_prompt_ids();
  sampling::SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 48;
  for (const ParallelConfig& pc : {ParallelConfig{1, 1, 2, 1}, ParallelConfig{2, 1, 2, 1}}) {
    SCOPED_TRACE(pc.to_string());
    auto inproc = build_engine(stories_shift(pc));
    ASSERT_TRUE(inproc.ok()) << inproc.error().to_string();
    auto want = inproc.value().engine->generate(prompts, greedy);
    ASSERT_TRUE(want.ok()) << want.error().to_string();

    const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
    std::vector<std::future<Status>> ranks;
    for (int r = 1; r < pc.group_size(); ++r)
      ranks.push_back(std::async(std::launch::async, [&, r] {
        return serve_tcp_group_rank(testing_support::stories_weights(), pc, r, 1,
                                    {master, "secret", std::chrono::milliseconds(20000)}, /*shift=*/true);
      }));
    EngineOptions o = stories_shift(pc);
    o.group_master = master;
    o.group_key = "secret";
    o.group_timeout_ms = 20000;
    auto tcp = build_engine(o);
    ASSERT_TRUE(tcp.ok()) << tcp.error().to_string();
    auto got = tcp.value().engine->generate(prompts, greedy);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    ASSERT_EQ(got.value().size(), cases.size());
    for (std::size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(got.value()[i].token_ids, cases[i].generated_ids) << "reference ids, case " << i;
      ASSERT_EQ(got.value()[i].logits.size(), want.value()[i].logits.size());
      for (std::size_t s = 0; s < want.value()[i].logits.size(); ++s)
        ASSERT_EQ(0, std::memcmp(got.value()[i].logits[s].data(), want.value()[i].logits[s].data(),
                                 want.value()[i].logits[s].size() * sizeof(float)))
            << "case " << i << " step " << s << ": TCP and in-process shift groups sum in the same order";
    }
    auto* exec = tcp.value().executor_as<ParallelExecutor>();
    ASSERT_NE(exec, nullptr);
    ASSERT_TRUE(exec->has_shift());
    const ShiftStats st = exec->shift_stats();
    std::printf("  %-20s base/shift steps %llu/%llu, %llu switches\n", pc.to_string().c_str(),
                static_cast<unsigned long long>(st.base_steps), static_cast<unsigned long long>(st.shift_steps),
                static_cast<unsigned long long>(st.switches));
    EXPECT_GT(st.base_steps, 0u);
    EXPECT_GT(st.shift_steps, 0u);
    EXPECT_GE(st.switches, 1u);
    tcp = make_error(ErrorCode::internal, "drop");  // destroys the engine: shuts the group down
    for (auto& f : ranks) {
      Status rs = f.get();
      EXPECT_TRUE(rs.ok()) << rs.error().to_string();
    }
  }
}

}  // namespace
}  // namespace shardline::engine
