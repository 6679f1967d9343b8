// Seesaw's phases (seed 000 §4.2) in the engine: pure prefill and pure decode
// phases with a host KV buffer between them, the transitions picked by the
// phase policy (engine/policies/seesaw_policy.hpp). Every sequence's KV
// leaves the device when its prefill ends (and at a transition) and comes
// back by a restore; none is recomputed unless the host buffer is full.
// Under budgets so small that every sequence crosses a transition and a
// restore, on one device and on an in-process pp=2 group (whose pipeline a
// transition drains), every schedule gives the single-device mixed run's
// tokens and logits bit for bit, and the stories260K reference ids.
//
// With two parallel configs (§4.1, dynamic re-sharding: prefill under cp,
// decode under cd over the same devices), every prefill step runs in cp
// and every decode step in cd, the KV re-sharded on its way through the
// host buffer. Pairs without TP are bit-identical to one device; with TP
// in cd the prompt's logits are (cp has no TP) and the rest is within the
// TP tolerance, with the reference ids.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/seesaw/seesaw_phases.hpp"
#include "engine/group/parallel_executor.hpp"
#include "tests/support/dummy_qwen3.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_seesaw_golden_test {

using testing_support::kStoriesDir;

constexpr std::uint64_t kBytesPerToken = 5 * 2 * 4 * 8 * 4;  // stories260K: layers * K,V * KV heads * hd * f32

EngineOptions tiny_options() {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 4;
  o.max_model_len = 64;
  o.kv_cache_bytes = 32 * 4 * kBytesPerToken;  // 32 blocks of 4 tokens: two sequences' worth
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 16;
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  return o;
}

struct SeesawRun {
  std::vector<RequestOutput> outputs;
  SeesawStats seesaw;
  KvIoStats kv;
  std::uint64_t cp_steps = 0, cd_steps = 0;  ///< an engine group's steps in each config (0 on one device)
  bool cp_packed = true, cd_packed = true;    ///< rank 0's shards hold packed weights at the end
  std::vector<std::size_t> weight_bytes_per_rank;  ///< packed bytes per rank at the end
  /// Rank 0's two caches: the same memory, of the larger layout's size.
  bool kv_memory_shared = false;
  std::size_t kv_memory_bytes = 0, cp_kv_bytes = 0, cd_kv_bytes = 0;
};

Result<SeesawRun> run(EngineOptions o, const std::vector<std::vector<std::int32_t>>& prompts, int max_tokens = 48,
                      std::optional<KvMoverStats>* mover = nullptr, std::uint64_t* link_bytes = nullptr) {
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = max_tokens;
  greedy.ignore_eos = true;  // (the stories260K references end by length too)
  Result<EngineInstance> e = build_engine(o);
  if (!e.ok()) return std::move(e).error();
  std::vector<LlmEngine*> engines = {e->engine.get()};
  auto out = generate_data_parallel(engines, prompts, greedy);
  if (!out.ok()) return std::move(out).error();
  SeesawRun r;
  r.outputs = std::move(out).value();
  r.seesaw = seesaw_stats_of(*e->engine);
  r.kv = e->engine->kv_io().stats();
  if (mover != nullptr) *mover = e->engine->kv_mover_stats();
  if (auto* group = e->executor_as<InProcEngineGroup>(); group != nullptr && link_bytes != nullptr)
    *link_bytes = group->link() ? group->link()->reserved_bytes() : 0;
  if (auto* group = e->executor_as<InProcEngineGroup>(); group != nullptr) {
    r.cp_steps = group->executor().num_steps_in(model::StepConfig::prefill);
    r.cd_steps = group->executor().num_steps_in(model::StepConfig::decode);
    r.cp_packed = group->executor().runner().weights_packed();
    if (auto* cd = group->executor().decode_runner(); cd != nullptr) {
      model::ShardRunner& cp = group->executor().runner();
      r.cd_packed = cd->weights_packed();
      r.kv_memory_shared = cd->kv_cache_view().data == cp.kv_cache_view().data &&
                           cd->kv_memory_bytes() == cp.kv_memory_bytes();
      r.kv_memory_bytes = cp.kv_memory_bytes();
      r.cp_kv_bytes = cp.kv_cache_bytes();
      r.cd_kv_bytes = cd->kv_cache_bytes();
    }
    r.weight_bytes_per_rank = group->packed_weight_bytes_per_rank();
  }
  return r;
}

using testing_support::bit_identical;
using testing_support::max_logit_diff;

/// tiny_options with Seesaw's phases from cp to cd under `schedule`, and a
/// host KV buffer of one max_model_len sequence (the least).
EngineOptions pair_options(const ParallelConfig& cp, const ParallelConfig& cd, PreemptionMode mode,
                           SeesawSchedule schedule = SeesawSchedule::transition_minimizing) {
  EngineOptions o = tiny_options();
  o.parallel = cp;
  o.parallel_decode = cd;
  o.preemption_mode = mode;
  o.seesaw = SeesawPolicyOptions{schedule};
  o.swap_space_bytes = 64 * kBytesPerToken;
  return o;
}

/// Every request of a run of twelve_prompts generated its reference ids.
void expect_reference_ids(const SeesawRun& got, const std::vector<testing_support::StoriesCase>& cases) {
  ASSERT_EQ(got.outputs.size(), 4 * cases.size());
  for (std::size_t i = 0; i < got.outputs.size(); ++i)
    EXPECT_EQ(got.outputs[i].token_ids, cases[i % cases.size()].generated_ids) << "request " << i;
}

std::vector<std::vector<std::int32_t>> twelve_prompts(const std::vector<testing_support::StoriesCase>& cases) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (int k = 0; k < 4; ++k)
    for (const auto& c : cases) prompts.push_back(c.prompt_ids);
  return prompts;
}

TEST(Seesaw, EverySchedulePhasesTheSameTokensAsContinuousBatching) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = twelve_prompts(cases);
  const std::size_t n = prompts.size();

  auto mixed = run(tiny_options(), prompts);  // today's scheduler on one device
  ASSERT_TRUE(mixed.ok()) << mixed.error().to_string();
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(mixed->outputs[i].token_ids, cases[i % cases.size()].generated_ids);

  for (const ParallelConfig& pc : {ParallelConfig{}, ParallelConfig{1, 2, 1, 1}}) {
    for (const SeesawSchedule schedule : {SeesawSchedule::transition_minimizing, SeesawSchedule::prefill_prioritizing,
                                          SeesawSchedule::decode_prioritizing}) {
      for (const PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
        const std::string what = pc.to_string() + " " + to_string(schedule) + " " + preemption_mode_name(mode);
        SCOPED_TRACE(what);
        EngineOptions o = tiny_options();
        o.parallel = pc;
        o.preemption_mode = mode;
        o.seesaw = SeesawPolicyOptions{schedule};
        o.swap_space_bytes = 64 * kBytesPerToken;  // the host KV buffer: one max_model_len sequence, the least
        auto got = run(o, prompts);
        ASSERT_TRUE(got.ok()) << got.error().to_string();
        ASSERT_EQ(got->outputs.size(), n);
        for (std::size_t i = 0; i < n; ++i) {
          EXPECT_EQ(got->outputs[i].request_id, i);
          EXPECT_EQ(got->outputs[i].token_ids, cases[i % cases.size()].generated_ids) << "request " << i;
        }
        EXPECT_TRUE(bit_identical(got->outputs, mixed->outputs)) << "tokens or logits differ from the mixed run";
        const SeesawStats& s = got->seesaw;
        std::printf("  %-44s transitions %llu, steps prefill %llu / decode %llu, offloads %llu, onboards %llu, "
                    "host peak %lld tokens, offload fallbacks %llu\n",
                    what.c_str(), static_cast<unsigned long long>(s.transitions),
                    static_cast<unsigned long long>(s.prefill_steps), static_cast<unsigned long long>(s.decode_steps),
                    static_cast<unsigned long long>(s.offloads), static_cast<unsigned long long>(got->kv.onboards),
                    s.host_peak_tokens, static_cast<unsigned long long>(got->kv.offload_fallbacks));
        EXPECT_GE(s.transitions, 3u);
        // Prefill admits only what the host buffer can take beside the
        // sequences about to be offloaded: no offload falls back to
        // recomputation (2-7 did when they were not counted).
        EXPECT_EQ(got->kv.offload_fallbacks, 0u);
        EXPECT_GE(s.offloads, n);          // every sequence left the device at least once
        EXPECT_GE(got->kv.onboards, n);    // ... and came back by a restore
        EXPECT_GT(s.prefill_steps, 0u);
        EXPECT_GT(s.decode_steps, 0u);
        EXPECT_LE(s.host_peak_tokens, 64);
        EXPECT_EQ(got->kv.swap_space_bytes_used, 0u);  // nothing left behind
      }
    }
  }
}

TEST(Seesaw, PrefillRunsInCpAndDecodeInCdWithTheKvReshardedThroughTheHost) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = twelve_prompts(cases);
  const std::size_t n = prompts.size();
  auto single = run(tiny_options(), prompts);
  ASSERT_TRUE(single.ok()) << single.error().to_string();

  struct Pair {
    ParallelConfig cp, cd;  // {tp, pp, sp, dp}
    bool bitwise;           // no TP in either: bit-identical to one device
  };
  const Pair pairs[] = {
      {{1, 2, 1, 1}, {1, 1, 2, 1}, true},   // pp=2 -> sp=2
      {{1, 1, 2, 1}, {1, 2, 1, 1}, true},   // sp=2 -> pp=2
      {{1, 2, 1, 1}, {2, 1, 1, 1}, false},  // pp=2 -> tp=2 (the paper's pair)
      {{1, 4, 1, 1}, {4, 1, 1, 1}, false},  // pp=4 -> tp=4
      {{1, 4, 1, 1}, {2, 2, 1, 1}, false},  // pp=4 -> tp=2,pp=2 (pipelined decode)
  };
  std::map<PreemptionMode, std::uint64_t> decode_steps_tp4;
  for (const Pair& p : pairs) {
    for (const PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
      const std::string what = p.cp.to_string() + " -> " + p.cd.to_string() + " " + preemption_mode_name(mode);
      SCOPED_TRACE(what);
      auto got = run(pair_options(p.cp, p.cd, mode), prompts);
      ASSERT_TRUE(got.ok()) << got.error().to_string();
      expect_reference_ids(*got, cases);
      const float d = max_logit_diff(got->outputs, single->outputs);
      if (p.bitwise) {
        EXPECT_TRUE(bit_identical(got->outputs, single->outputs)) << "differs from one device";
      } else {
        EXPECT_LE(d, 1e-4f);
        // The first token is sampled at the end of the prefill, under cp (no TP).
        for (std::size_t i = 0; i < n; ++i)
          EXPECT_EQ(std::memcmp(got->outputs[i].logits[0].data(), single->outputs[i].logits[0].data(),
                                got->outputs[i].logits[0].size() * sizeof(float)),
                    0)
              << "request " << i << ": the prefill logits differ from one device";
      }
      const SeesawStats& s = got->seesaw;
      std::printf("  %-40s max |logit - single| %.3g, transitions %llu, steps cp %llu / cd %llu, switch %.2f ms, "
                  "offload fallbacks %llu\n",
                  what.c_str(), static_cast<double>(d), static_cast<unsigned long long>(s.transitions),
                  static_cast<unsigned long long>(got->cp_steps), static_cast<unsigned long long>(got->cd_steps),
                  s.switch_ms, static_cast<unsigned long long>(got->kv.offload_fallbacks));
      EXPECT_GE(s.transitions, 3u);
      EXPECT_EQ(got->kv.offload_fallbacks, 0u);
      // One KV memory per device, of the larger layout's size (stories260K
      // rank 0: pp=2 caches 3 layers x 4 heads, tp=2 and sp=2 5 x 2).
      EXPECT_TRUE(got->kv_memory_shared);
      EXPECT_EQ(got->kv_memory_bytes, std::max(got->cp_kv_bytes, got->cd_kv_bytes));
      EXPECT_NE(got->cp_kv_bytes, got->cd_kv_bytes);
      // Every prefill micro-batch ran in cp, every decode one in cd.
      EXPECT_EQ(got->cp_steps, s.prefill_steps);
      EXPECT_EQ(got->cd_steps, s.decode_steps);
      EXPECT_GT(got->cd_steps, 0u);
      EXPECT_GE(got->kv.onboards, n);
      EXPECT_EQ(got->kv.swap_space_bytes_used, 0u);
      // Pipelined decode (§5.1): a cd with pp = 2 splits each decode batch
      // in two micro-batches, so pp=4 -> tp=2,pp=2 runs about twice the
      // decode steps of pp=4 -> tp=4.
      if (p.cd == ParallelConfig{2, 2, 1, 1}) {
        ASSERT_TRUE(decode_steps_tp4.count(mode)) << "tp=4 runs before";
        EXPECT_GE(static_cast<double>(got->cd_steps), 1.4 * static_cast<double>(decode_steps_tp4[mode]));
      } else if (p.cd.tp == 4) {
        decode_steps_tp4[mode] = got->cd_steps;
      }
    }
  }
}

// With swap-only KV moves a pair gives the same bits under every schedule
// and both weight modes: prefill is cp's, decode cd's, whatever the phases'
// boundaries (batch invariance), and reload repacks the same bytes. The KV
// copies are synchronous: the sequences recomputed after a swap that did
// not fit the host buffer must be the same ones in every run (see
// TheAsynchronousPipelineGivesTheSynchronousBits).
TEST(Seesaw, EveryScheduleAndWeightModeGivesThePairsSameBits) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = twelve_prompts(cases);
  const std::pair<ParallelConfig, ParallelConfig> pairs[] = {{{1, 2, 1, 1}, {2, 1, 1, 1}},
                                                             {{1, 4, 1, 1}, {2, 2, 1, 1}}};
  for (const auto& [cp, cd] : pairs) {
    std::optional<SeesawRun> first;
    std::vector<std::size_t> resident_bytes;
    for (const ReshardWeights weights : {ReshardWeights::resident, ReshardWeights::reload}) {
      for (const SeesawSchedule schedule : {SeesawSchedule::transition_minimizing, SeesawSchedule::prefill_prioritizing,
                                            SeesawSchedule::decode_prioritizing}) {
        const std::string what =
            cp.to_string() + " -> " + cd.to_string() + " " + to_string(weights) + " " + to_string(schedule);
        SCOPED_TRACE(what);
        EngineOptions o = pair_options(cp, cd, PreemptionMode::swap, schedule);
        o.reshard_weights = weights;
        o.seesaw_async_kv = false;
        auto got = run(o, prompts);
        ASSERT_TRUE(got.ok()) << got.error().to_string();
        expect_reference_ids(*got, cases);
        EXPECT_GE(got->seesaw.transitions, 3u);
        if (!first) {
          first = std::move(got).value();
          resident_bytes = first->weight_bytes_per_rank;
          continue;
        }
        EXPECT_TRUE(bit_identical(got->outputs, first->outputs)) << "differs from resident transition-minimizing";
        if (weights == ReshardWeights::resident) {
          EXPECT_TRUE(got->cp_packed && got->cd_packed);
        } else {
          // Only the active config's shard is packed; every rank holds less.
          EXPECT_NE(got->cp_packed, got->cd_packed);
          ASSERT_EQ(got->weight_bytes_per_rank.size(), resident_bytes.size());
          for (std::size_t r = 0; r < resident_bytes.size(); ++r)
            EXPECT_LT(got->weight_bytes_per_rank[r], resident_bytes[r]) << "rank " << r;
        }
      }
    }
  }
}

// The asynchronous pipeline (§5.2): the KV copies run on the prefetcher
// thread, a paced host link making each one last long enough that steps run
// meanwhile (offloads while the next prefill computes, onboards while the
// resident sequences decode), so the schedule differs from the synchronous
// copies' (other decode batches, other preemptions). Without TP the tokens
// and logits are the synchronous run's bit for bit whatever the schedule
// (batch invariance). With TP in cd they are too when nothing is
// recomputed: a device KV roomy enough for no preemption, only the tiny host
// buffer forcing the transitions. (A sequence recomputed in a prefill phase
// gets its generated tokens' KV from cp instead of cd, within the TP
// tolerance, and which ones are depends on when the copies land.) 48
// requests, so that the host buffer (64 tokens) fills several times.
TEST(Seesaw, TheAsynchronousPipelineGivesTheSynchronousBits) {
  const auto cases = testing_support::load_stories_reference();
  std::vector<std::vector<std::int32_t>> prompts;
  for (int k = 0; k < 4; ++k)
    for (const auto& p : twelve_prompts(cases)) prompts.push_back(p);
  auto single = run(tiny_options(), prompts);
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  struct Pair {
    ParallelConfig cp, cd;
    std::uint64_t kv_scale;  // device KV: x tiny_options' 32 blocks
  };
  const Pair pairs[] = {{{}, {}, 1},
                        {{1, 2, 1, 1}, {1, 1, 2, 1}, 1},   // pp=2 -> sp=2: no TP
                        {{1, 2, 1, 1}, {2, 1, 1, 1}, 8},   // pp=2 -> tp=2
                        {{1, 4, 1, 1}, {2, 2, 1, 1}, 8}};  // pp=4 -> tp=2,pp=2
  // 50 MB/s + 0.2 ms per copy: a 64-token sequence (80 KiB) takes ~1.8 ms on one device.
  const comm::LinkSpec link{0.05, 200};
  for (const auto& [cp, cd, kv_scale] : pairs) {
    for (const PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
      std::optional<SeesawRun> sync;
      for (const bool async : {false, true}) {
        const std::string what = cp.to_string() + " -> " + cd.to_string() + " " + preemption_mode_name(mode) +
                                 (async ? " async" : " sync");
        SCOPED_TRACE(what);
        EngineOptions o = pair_options(cp, cd, mode);
        if (cp == cd) o.parallel_decode.reset();
        o.kv_cache_bytes *= kv_scale;
        o.seesaw_async_kv = async;
        o.host_link = link;
        std::optional<KvMoverStats> mover;
        auto got = run(o, prompts, 48, &mover);
        ASSERT_TRUE(got.ok()) << got.error().to_string();
        ASSERT_TRUE(mover.has_value());
        ASSERT_EQ(got->outputs.size(), prompts.size());
        for (std::size_t i = 0; i < prompts.size(); ++i)
          EXPECT_EQ(got->outputs[i].token_ids, cases[i % cases.size()].generated_ids) << "request " << i;
        EXPECT_GE(got->seesaw.transitions, 3u);
        EXPECT_EQ(got->kv.offload_fallbacks, 0u);
        EXPECT_EQ(got->kv.swap_space_bytes_used, 0u);
        if (kv_scale > 1) {
          EXPECT_EQ(got->kv.swap_outs + got->kv.swap_fallbacks, 0u);  // no preemption
        }
        EXPECT_LE(max_logit_diff(got->outputs, single->outputs), 1e-4f);
        // Every offload and onboard went through the mover, and so did the
        // swap-ins of preempted decodes (their swap-outs stay synchronous).
        EXPECT_EQ(mover->num_transfers, got->kv.offloads + got->kv.onboards + got->kv.swap_ins);
        EXPECT_EQ(mover->bytes_to_host, got->kv.offloaded_bytes);
        EXPECT_EQ(mover->bytes_to_device, got->kv.onboarded_bytes + got->kv.swapped_in_bytes);
        std::printf("  %-44s transfers %llu, transfer %.1f ms, waited %.1f ms, hidden %.0f%%, drain %.1f ms\n",
                    what.c_str(), static_cast<unsigned long long>(mover->num_transfers), mover->transfer_ms,
                    mover->wait_ms, 100 * mover->hidden_share(), got->seesaw.drain_ms);
        if (!async) {
          EXPECT_EQ(mover->hidden_share(), 0.0);  // the caller ran every copy
          sync = std::move(got).value();
          continue;
        }
        EXPECT_TRUE(bit_identical(got->outputs, sync->outputs)) << "differs from the synchronous copies";
        // How much was hidden is timing (printed above; measured by bench
        // --seesaw's copies table, and bounded in kv_mover_test).
      }
    }
  }
}

// An emulated interconnect between the devices (EngineOptions::group_link:
// pipeline sends and TP collectives paced) makes steps slower, never
// different: pp=2 -> tp=2 with and without it, copies synchronous, are bit
// for bit the same.
TEST(Seesaw, AGroupLinkChangesNoBit) {
  const auto cases = testing_support::load_stories_reference();
  const std::vector<std::vector<std::int32_t>> prompts = twelve_prompts(cases);
  std::optional<SeesawRun> plain;
  for (const bool linked : {false, true}) {
    EngineOptions o = pair_options({1, 2, 1, 1}, {2, 1, 1, 1}, PreemptionMode::swap);
    o.seesaw_async_kv = false;
    if (linked) o.group_link = comm::LinkSpec{1.0, 5};
    std::uint64_t link_bytes = 0;
    auto got = run(o, prompts, 48, nullptr, &link_bytes);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    expect_reference_ids(*got, cases);
    if (!plain) {
      EXPECT_EQ(link_bytes, 0u);
      plain = std::move(got).value();
      continue;
    }
    // pp=2's activation sends and tp=2's all-reduces went over the link.
    EXPECT_GT(link_bytes, 0u);
    EXPECT_TRUE(bit_identical(got->outputs, plain->outputs)) << "the paced group differs";
    EXPECT_EQ(got->seesaw.transitions, plain->seesaw.transitions);
  }
  // Only an in-process group of several devices has a group link.
  EngineOptions one = tiny_options();
  one.group_link = comm::LinkSpec{1.0, 5};
  auto refused = build_engine(one);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(refused.error().message.find("in-process CPU engine group"), std::string::npos)
      << refused.error().message;
}

// A GQA model with q/k norms (dummy Qwen3, 16 heads over 8 KV heads, 5
// layers): the same ids as one device, logits within 1e-4, the prompt's
// logits bitwise (cp has no TP).
TEST(Seesaw, DummyQwen3PairsMatchOneDevice) {
  EngineOptions o = testing_support::dummy_qwen3_options();
  auto weights = load_weights(o);
  ASSERT_TRUE(weights.ok()) << weights.error().to_string();
  o.weights = *weights;
  const std::vector<std::vector<std::int32_t>> prompts = testing_support::dummy_qwen3_prompts();
  auto single = run(o, prompts, 12);
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  for (const auto& [cp, cd] : {std::pair{ParallelConfig{1, 2, 1, 1}, ParallelConfig{2, 1, 1, 1}},
                               std::pair{ParallelConfig{1, 4, 1, 1}, ParallelConfig{4, 1, 1, 1}}}) {
    SCOPED_TRACE(cp.to_string() + " -> " + cd.to_string());
    EngineOptions so = o;
    so.parallel = cp;
    so.parallel_decode = cd;
    so.seesaw = SeesawPolicyOptions{};
    so.swap_space_bytes = 10u << 20;  // 256 tokens of 5 layers x K,V x 8 heads x 128 x f32: one max_model_len
    auto got = run(so, prompts, 12);
    ASSERT_TRUE(got.ok()) << got.error().to_string();
    ASSERT_EQ(got->outputs.size(), prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got->outputs[i].token_ids, single->outputs[i].token_ids) << "request " << i;
      EXPECT_EQ(std::memcmp(got->outputs[i].logits[0].data(), single->outputs[i].logits[0].data(),
                            got->outputs[i].logits[0].size() * sizeof(float)),
                0)
          << "request " << i << ": the prefill logits differ from one device";
    }
    EXPECT_LE(max_logit_diff(got->outputs, single->outputs), 1e-4f);
    EXPECT_GE(got->seesaw.transitions, 1u);
    EXPECT_GT(got->cd_steps, 0u);
  }
}

TEST(Seesaw, ADecodeConfigThatCannotServeIsRefusedClearly) {
  const auto refused = [](EngineOptions o, ErrorCode code, const std::string& words) {
    SCOPED_TRACE(words);
    auto e = build_engine(o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().code, code);
    EXPECT_NE(e.error().message.find(words), std::string::npos) << e.error().message;
  };
  EngineOptions o = tiny_options();
  o.parallel = ParallelConfig{1, 2, 1, 1};
  o.parallel_decode = ParallelConfig{2, 1, 1, 1};
  o.swap_space_bytes = 64 * kBytesPerToken;
  refused(o, ErrorCode::invalid_argument, "needs Seesaw's phases");  // no --seesaw-policy
  o.seesaw = SeesawPolicyOptions{};
  o.parallel_decode = ParallelConfig{4, 1, 1, 1};
  refused(o, ErrorCode::invalid_argument, "must use the prefill config's 2 devices");
  o.parallel = ParallelConfig{1, 3, 1, 1};
  o.parallel_decode = ParallelConfig{3, 1, 1, 1};  // 8 heads do not split over 3 TP ranks
  refused(o, ErrorCode::invalid_argument, "the decode config tp=3,pp=1,sp=1,dp=1 cannot shard this model");
  o.parallel = ParallelConfig{1, 1, 2, 1};
  o.parallel_decode = ParallelConfig{2, 1, 1, 1};
  o.shift = ShiftOptions{};
  refused(o, ErrorCode::unsupported, "not with SiDP or --shift");
  o.shift.reset();
  o.parallel_decode = ParallelConfig{1, 1, 2, 1};  // cd = cp: one config, nothing to switch
  EXPECT_TRUE(build_engine(o).ok());
}

TEST(Seesaw, AHostBufferBelowOneSequenceIsRefused) {
  EngineOptions o = tiny_options();
  o.seesaw = SeesawPolicyOptions{};
  o.swap_space_bytes = 63 * kBytesPerToken;  // max_model_len is 64
  auto e = build_engine(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(e.error().message.find("cannot hold one max_model_len=64 sequence"), std::string::npos)
      << e.error().message;
  o.swap_space_bytes = 64 * kBytesPerToken;
  EXPECT_TRUE(build_engine(o).ok());
}

}  // namespace
}  // namespace shardline::engine
