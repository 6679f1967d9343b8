// Engine groups over TCP (ranks as threads here; as processes in the e2e
// test): same tokens and logits as the in-process group, setup mismatches
// refused with a clear error, a wrong key refused.
#include "engine/group/tcp_group.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <thread>

#include "engine/group/engine_builder.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_tcp_group_test {

EngineOptions stories(ParallelConfig pc) {
  EngineOptions o;
  o.model_dir = testing_support::kStoriesDir;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 16;
  o.capture_logits = true;
  o.parallel = pc;
  o.num_threads = 1;
  return o;
}

std::shared_ptr<const model::ModelWeights> stories_weights() {
  return std::make_shared<const model::ModelWeights>(model::load_model(testing_support::kStoriesDir, {}).value());
}

// HOST:PORT parsing itself is tested in tests/comm/address_test.cpp.
TEST(TcpGroup, BadMasterAddressIsRefusedBeforeConnecting) {
  const ParallelConfig pc{2, 1, 1, 1};
  for (const std::string master : {"nohost", ":80", "h:70000", "h:8x"}) {
    auto g = connect_tcp_group(pc, 0, {master, "", std::chrono::milliseconds(1000)});
    ASSERT_FALSE(g.ok()) << master;
    EXPECT_EQ(g.error().code, ErrorCode::invalid_argument) << master;
    EXPECT_NE(g.error().message.find("'" + master + "'"), std::string::npos) << g.error().message;
  }
  auto g = connect_tcp_group(pc, 1, {"127.0.0.1:0", "", std::chrono::milliseconds(1000)});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(g.error().message.find("needs rank 0's port"), std::string::npos) << g.error().message;
}

TEST(TcpGroup, EveryConfigMatchesTheInProcessGroup) {
  const auto cases = testing_support::load_stories_reference();
  std::vector<std::vector<std::int32_t>> prompts;
  for (const auto& c : cases) prompts.push_back(c.prompt_ids);
  sampling::SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 24;
  for (ParallelConfig pc : {ParallelConfig{2, 1, 1, 1}, ParallelConfig{1, 2, 1, 1}, ParallelConfig{1, 1, 2, 1},
                            ParallelConfig{2, 1, 2, 1}}) {
    SCOPED_TRACE(pc.to_string());
    auto inproc = build_engine(stories(pc));
    ASSERT_TRUE(inproc.ok());
    auto want = inproc.value().engine->generate(prompts, greedy);
    ASSERT_TRUE(want.ok());

    const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
    std::vector<std::future<Status>> ranks;
    for (int r = 1; r < pc.group_size(); ++r)
      ranks.push_back(std::async(std::launch::async, [&, r] {
        return serve_tcp_group_rank(stories_weights(), pc, r, 1, {master, "secret", std::chrono::milliseconds(20000)});
      }));
    EngineOptions o = stories(pc);
    o.group_master = master;
    o.group_key = "secret";
    o.group_timeout_ms = 20000;
    auto tcp = build_engine(o);
    ASSERT_TRUE(tcp.ok()) << tcp.error().to_string();
    auto got = tcp.value().engine->generate(prompts, greedy);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got.value()[i].token_ids, want.value()[i].token_ids);
      ASSERT_EQ(got.value()[i].logits.size(), want.value()[i].logits.size());
      for (std::size_t s = 0; s < want.value()[i].logits.size(); ++s)
        EXPECT_EQ(0, std::memcmp(got.value()[i].logits[s].data(), want.value()[i].logits[s].data(),
                                 want.value()[i].logits[s].size() * sizeof(float)))
            << "TCP and in-process groups sum in the same rank order: bit-identical";
    }
    tcp = make_error(ErrorCode::internal, "drop");  // destroys the engine: shuts the group down
    for (auto& f : ranks) {
      Status st = f.get();
      EXPECT_TRUE(st.ok()) << st.error().to_string();
    }
  }
}

TEST(TcpGroup, RankWithAnotherConfigIsRefusedByTheSetup) {
  const ParallelConfig pc{1, 2, 1, 1};
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  auto rank1 = std::async(std::launch::async, [&] {
    // Same group size (2), but it believes tp=2: the setup check refuses it.
    return serve_tcp_group_rank(stories_weights(), ParallelConfig{2, 1, 1, 1}, 1, 1,
                                {master, "", std::chrono::milliseconds(20000)});
  });
  EngineOptions o = stories(pc);
  o.group_master = master;
  o.group_timeout_ms = 20000;
  auto eng = build_engine(o);
  ASSERT_TRUE(eng.ok()) << eng.error().to_string();
  Status st = rank1.get();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::mismatch);
  EXPECT_NE(st.error().message.find("tp is 2 here but 1 on rank 0"), std::string::npos) << st.error().message;
  // Rank 0 then fails its first step within the timeout instead of hanging.
  auto out = eng.value().engine->generate({{1, 2, 3}}, sampling::SamplingParams{});
  EXPECT_FALSE(out.ok());
}

// Shift Parallelism: every rank must agree on --shift (the setup's shift
// word); a rank that differs fails with mismatch naming it, either way round.
TEST(TcpGroup, RankWithAnotherShiftSettingIsRefusedByTheSetup) {
  const ParallelConfig pc{1, 1, 2, 1};
  for (const bool rank0_shift : {true, false}) {
    SCOPED_TRACE(rank0_shift ? "rank 0 --shift" : "rank 1 --shift");
    const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
    auto rank1 = std::async(std::launch::async, [&] {
      return serve_tcp_group_rank(stories_weights(), pc, 1, 1, {master, "", std::chrono::milliseconds(20000)},
                                  /*shift=*/!rank0_shift);
    });
    EngineOptions o = stories(pc);
    o.group_master = master;
    o.group_timeout_ms = 5000;
    if (rank0_shift) o.shift = ShiftOptions{};
    auto eng = build_engine(o);
    ASSERT_TRUE(eng.ok()) << eng.error().to_string();
    // (On failure the engine goes first, so its shutdown ends a rank that did join.)
    ASSERT_EQ(rank1.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "rank 1 joined a group with another --shift";
    Status st = rank1.get();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::mismatch);
    const std::string want = rank0_shift ? "rank 1: --shift is off here but on on rank 0"
                                         : "rank 1: --shift is on here but off on rank 0";
    EXPECT_NE(st.error().message.find(want), std::string::npos) << st.error().message;
    auto out = eng.value().engine->generate({{1, 2, 3}}, sampling::SamplingParams{});
    EXPECT_FALSE(out.ok());
  }
}

// A shift config the group cannot run is refused before anyone connects.
TEST(TcpGroup, ShiftWithPipelineStagesIsRefusedBeforeConnecting) {
  const ParallelConfig pc{1, 2, 2, 1};
  const TcpGroupOptions tcp{"127.0.0.1:1", "", std::chrono::milliseconds(20000)};
  model::CpuRunnerOptions ro{64, 16, 1, DType::f32};
  auto exec = create_tcp_group_executor(stories_weights(), pc, ro, tcp, ShiftOptions{});
  ASSERT_FALSE(exec.ok());
  EXPECT_EQ(exec.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(exec.error().message.find("pp = 1"), std::string::npos) << exec.error().message;
  Status st = serve_tcp_group_rank(stories_weights(), pc, 1, 1, tcp, /*shift=*/true);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(st.error().message.find("pp = 1"), std::string::npos) << st.error().message;
}

TEST(TcpGroup, WrongKeyIsRefused) {
  const ParallelConfig pc{2, 1, 1, 1};
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  auto rank1 = std::async(std::launch::async, [&] {
    return serve_tcp_group_rank(stories_weights(), pc, 1, 1, {master, "wrong", std::chrono::milliseconds(3000)});
  });
  EngineOptions o = stories(pc);
  o.group_master = master;
  o.group_key = "right";
  o.group_timeout_ms = 3000;
  auto eng = build_engine(o);
  EXPECT_FALSE(eng.ok());
  Status st = rank1.get();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("key"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace shardline::engine
