// Seesaw (seed 000 §4.1-4.2, §5.2) on engine groups over TCP (ranks as
// threads here; as processes in tests/cli/cli_e2e_test.cpp): every rank
// holds its shard of cp and of cd, rank 0 switches the group between them,
// and the KV of every sequence leaves the devices into rank 0's host KV
// buffer and comes back re-sharded through the ranks' own gathers and
// scatters (engine/group/group_kv.hpp). Under budgets so small that every
// sequence crosses a transition and a swap, a TCP pair gives the in-process
// pair's tokens and logits bit for bit (the same sums in the same order)
// and the stories260K reference ids, with synchronous and asynchronous
// copies; a rank started with another decode config is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/seesaw/seesaw_phases.hpp"
#include "engine/group/group_kv.hpp"
#include "engine/group/tcp_group.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_tcp_group_seesaw_golden_test {

constexpr std::uint64_t kBytesPerToken = 5 * 2 * 4 * 8 * 4;  // stories260K: layers * K,V * KV heads * hd * f32

/// Seesaw from cp to cd with the budgets of tests/engine/seesaw_golden_test.cpp:
/// 32 blocks of 4 tokens per device, a host buffer of one max_model_len sequence.
EngineOptions pair_options(const ParallelConfig& cp, const ParallelConfig& cd, bool async_kv) {
  EngineOptions o;
  o.model_dir = testing_support::kStoriesDir;
  o.block_size = 4;
  o.max_model_len = 64;
  o.kv_cache_bytes = 32 * 4 * kBytesPerToken;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 16;
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  o.parallel = cp;
  o.parallel_decode = cd;
  o.preemption_mode = PreemptionMode::swap;
  o.seesaw = SeesawPolicyOptions{SeesawSchedule::transition_minimizing};
  o.seesaw_async_kv = async_kv;
  o.swap_space_bytes = 64 * kBytesPerToken;
  return o;
}

struct Run {
  std::vector<RequestOutput> outputs;
  SeesawStats seesaw;
  KvIoStats kv;
  std::uint64_t cp_steps = 0, cd_steps = 0;
  std::uint64_t remote_kv_bytes = 0;  ///< bytes of KV parts that crossed TCP (0 in one process)
  double last_reshard_ms = 0;         ///< the slowest rank's weight re-sharding at the last switch
};

Result<Run> run(EngineInstance& e, const std::vector<std::vector<std::int32_t>>& prompts) {
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 48;
  greedy.ignore_eos = true;
  std::vector<LlmEngine*> engines = {e.engine.get()};
  auto out = generate_data_parallel(engines, prompts, greedy);
  if (!out.ok()) return std::move(out).error();
  Run r;
  r.outputs = std::move(out).value();
  r.seesaw = seesaw_stats_of(*e.engine);
  r.kv = e.engine->kv_io().stats();
  ParallelExecutor* exec = e.executor_as<ParallelExecutor>();
  if (exec == nullptr)
    if (auto* group = e.executor_as<InProcEngineGroup>(); group != nullptr) exec = &group->executor();
  if (exec != nullptr) {
    r.cp_steps = exec->num_steps_in(model::StepConfig::prefill);
    r.cd_steps = exec->num_steps_in(model::StepConfig::decode);
    r.last_reshard_ms = exec->last_reshard_ms();
    if (auto* copier = dynamic_cast<GroupKvCopier*>(exec->kv_copier()); copier != nullptr)
      r.remote_kv_bytes = copier->remote_bytes();
  }
  return r;
}

/// pair_options as rank 0 of a TCP group at `master`.
EngineOptions tcp_options(const ParallelConfig& cp, const ParallelConfig& cd, bool async_kv, const std::string& master) {
  EngineOptions o = pair_options(cp, cd, async_kv);
  o.group_master = master;
  o.group_key = "secret";
  o.group_timeout_ms = 20000;
  return o;
}

std::vector<std::vector<std::int32_t>> twelve_prompts(const std::vector<testing_support::StoriesCase>& cases) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (int k = 0; k < 4; ++k)
    for (const auto& c : cases) prompts.push_back(c.prompt_ids);
  return prompts;
}

/// Starts ranks 1.. of a TCP group serving cp with `cd` (threads standing in for processes).
std::vector<std::future<Status>> start_ranks(const ParallelConfig& cp, std::optional<SeesawGroupOptions> seesaw,
                                             const std::string& master) {
  std::vector<std::future<Status>> ranks;
  for (int r = 1; r < cp.group_size(); ++r)
    ranks.push_back(std::async(std::launch::async, [=] {
      return serve_tcp_group_rank(testing_support::stories_weights(), cp, r, 1,
                                  {master, "secret", std::chrono::milliseconds(20000)}, false, seesaw);
    }));
  return ranks;
}

TEST(TcpGroupSeesaw, PairsOverTcpGiveTheInProcessBitsAndTheReference) {
  const auto cases = testing_support::load_stories_reference();
  const auto prompts = twelve_prompts(cases);
  struct Pair {
    ParallelConfig cp, cd;  // {tp, pp, sp, dp}
  };
  const Pair pairs[] = {
      {{1, 2, 1, 1}, {2, 1, 1, 1}},  // pp=2 -> tp=2 (the paper's pair)
      {{1, 1, 2, 1}, {1, 2, 1, 1}},  // sp=2 -> pp=2
      {{1, 4, 1, 1}, {2, 2, 1, 1}},  // pp=4 -> tp=2,pp=2 (pipelined decode)
  };
  for (const Pair& p : pairs) {
    for (const bool async_kv : {false, true}) {
      const std::string what =
          p.cp.to_string() + " -> " + p.cd.to_string() + (async_kv ? " async copies" : " sync copies");
      SCOPED_TRACE(what);
      auto inproc = build_engine(pair_options(p.cp, p.cd, async_kv));
      ASSERT_TRUE(inproc.ok()) << inproc.error().to_string();
      auto want = run(*inproc, prompts);
      ASSERT_TRUE(want.ok()) << want.error().to_string();

      const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
      auto ranks = start_ranks(p.cp, SeesawGroupOptions{p.cd, ReshardWeights::resident}, master);
      auto tcp = build_engine(tcp_options(p.cp, p.cd, async_kv, master));
      ASSERT_TRUE(tcp.ok()) << tcp.error().to_string();
      auto got = run(*tcp, prompts);
      ASSERT_TRUE(got.ok()) << got.error().to_string();
      ASSERT_EQ(got->outputs.size(), prompts.size());
      for (std::size_t i = 0; i < got->outputs.size(); ++i)
        EXPECT_EQ(got->outputs[i].token_ids, cases[i % cases.size()].generated_ids) << "reference ids, request " << i;
      if (!async_kv) {
        // Synchronous copies make the same swap-or-recompute choices in
        // both groups, so the bits are the in-process pair's.
        EXPECT_TRUE(testing_support::bit_identical(got->outputs, want->outputs))
            << "the TCP pair differs from the in-process pair";
      } else {
        EXPECT_LE(testing_support::max_logit_diff(got->outputs, want->outputs), 1e-4f);
      }
      std::printf("  %-44s transitions %llu, steps cp %llu / cd %llu, onboards %llu, swap-ins %llu, "
                  "KV over TCP %.1f KiB\n",
                  what.c_str(), static_cast<unsigned long long>(got->seesaw.transitions),
                  static_cast<unsigned long long>(got->cp_steps), static_cast<unsigned long long>(got->cd_steps),
                  static_cast<unsigned long long>(got->kv.onboards),
                  static_cast<unsigned long long>(got->kv.swap_ins), got->remote_kv_bytes / 1024.0);
      EXPECT_GE(got->seesaw.transitions, 3u);
      EXPECT_EQ(got->cp_steps, got->seesaw.prefill_steps);
      EXPECT_EQ(got->cd_steps, got->seesaw.decode_steps);
      EXPECT_GT(got->cd_steps, 0u);
      EXPECT_GE(got->kv.onboards, prompts.size()) << "every sequence came back from the host buffer";
      EXPECT_EQ(got->kv.offload_fallbacks, 0u);
      EXPECT_EQ(got->kv.swap_space_bytes_used, 0u);
      // Every onboard wrote the other ranks' shares over TCP: at least half
      // of each sequence's KV (rank 0 holds at most half under cd).
      EXPECT_GE(got->remote_kv_bytes, got->kv.onboarded_bytes / 2);
      EXPECT_EQ(want->remote_kv_bytes, 0u) << "an in-process group copies through its views";
      tcp = make_error(ErrorCode::internal, "drop");  // destroys the engine: shuts the group down
      for (auto& f : ranks) {
        Status rs = f.get();
        EXPECT_TRUE(rs.ok()) << rs.error().to_string();
      }
    }
  }
}

TEST(TcpGroupSeesaw, ReloadedWeightsGiveTheResidentBits) {
  const auto cases = testing_support::load_stories_reference();
  const auto prompts = twelve_prompts(cases);
  const ParallelConfig cp{1, 2, 1, 1}, cd{2, 1, 1, 1};
  auto inproc = build_engine(pair_options(cp, cd, false));
  ASSERT_TRUE(inproc.ok()) << inproc.error().to_string();
  auto want = run(*inproc, prompts);
  ASSERT_TRUE(want.ok()) << want.error().to_string();
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  auto ranks = start_ranks(cp, SeesawGroupOptions{cd, ReshardWeights::reload}, master);
  EngineOptions o = tcp_options(cp, cd, false, master);
  o.reshard_weights = ReshardWeights::reload;
  auto tcp = build_engine(o);
  ASSERT_TRUE(tcp.ok()) << tcp.error().to_string();
  auto got = run(*tcp, prompts);
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_TRUE(testing_support::bit_identical(got->outputs, want->outputs));
  EXPECT_GT(got->last_reshard_ms, 0.0) << "reload repacks weights at every switch";
  tcp = make_error(ErrorCode::internal, "drop");
  for (auto& f : ranks) {
    Status rs = f.get();
    EXPECT_TRUE(rs.ok()) << rs.error().to_string();
  }
}

TEST(TcpGroupSeesaw, ARankWithAnotherDecodeConfigIsRefused) {
  const ParallelConfig cp{1, 2, 1, 1}, cd{2, 1, 1, 1};
  for (const bool rank_has_cd : {false, true}) {
    SCOPED_TRACE(rank_has_cd ? "rank: sp=2 as cd" : "rank: no cd");
    const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
    auto ranks = start_ranks(
        cp, rank_has_cd ? std::optional(SeesawGroupOptions{{1, 1, 2, 1}, ReshardWeights::resident}) : std::nullopt,
        master);
    auto tcp = build_engine(tcp_options(cp, cd, false, master));  // rank 0 sends the setup; the rank checks it
    Status rs = ranks[0].get();
    ASSERT_FALSE(rs.ok());
    EXPECT_EQ(rs.error().code, ErrorCode::mismatch);
    EXPECT_NE(rs.error().message.find("Seesaw's decode config is " +
                                      std::string(rank_has_cd ? "tp=1,pp=1,sp=2,dp=1" : "none") +
                                      " here but tp=2,pp=1,sp=1,dp=1 on rank 0"),
              std::string::npos)
        << rs.error().message;
  }
}

}  // namespace
}  // namespace shardline::engine
