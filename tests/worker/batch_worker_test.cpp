// BatchWorker: input lines in, output lines out, over the shipped
// stories260K model. The reference greedy outputs, seeded choices, the
// determinism a crash-retry relies on (a line's result does not depend on
// what else runs, in which order, or on which worker), per-line errors,
// job cancellation and status counts.

#include "worker/batch_worker.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvstore/kv_targets.hpp"
#include "tests/support/kv_host_tier.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::worker {
namespace worker_batch_worker_test {

using testing_support::kStoriesDir;

constexpr int kMaxTokens = 48;

/// A small KV cache: 2 MiB is about 100 blocks of 16 tokens (stories260K
/// keeps 1,280 bytes of K and V per token in f32).
BatchWorker make_worker(const std::string& name = "cpu0", std::uint64_t kv_cache_bytes = 2u << 20) {
  engine::EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = kv_cache_bytes;
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 256;
  o.num_threads = 1;
  o.check_integrity = true;
  auto e = engine::build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  auto w = BatchWorker::create(std::move(e).value(), name);
  EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.error().to_string());
  return std::move(w).value();
}

BatchRequest line(std::uint64_t job, std::uint64_t index, std::string prompt, float temperature = 0.0f,
                  int max_tokens = kMaxTokens) {
  BatchRequest r;
  r.job_id = job;
  r.line_index = index;
  r.custom_id = "job" + std::to_string(job) + "-line" + std::to_string(index);
  r.prompt = std::move(prompt);
  r.params.temperature = temperature;
  r.params.max_tokens = max_tokens;
  r.return_token_ids = true;
  return r;
}

BatchRequest seeded(BatchRequest r, std::uint64_t seed) {
  r.params.seed = seed;
  r.params.has_seed = true;
  return r;
}

using Key = std::pair<std::uint64_t, std::uint64_t>;

/// Steps until the worker is idle; results by (job, line). Fails on a
/// duplicate result or an engine error.
std::map<Key, BatchResult> run_all(BatchWorker& w, int max_steps = 100000) {
  std::map<Key, BatchResult> out;
  for (int i = 0; i < max_steps && w.has_work(); ++i) {
    auto r = w.step();
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    if (!r.ok()) break;
    for (BatchResult& res : r.value()) {
      const Key k{res.job_id, res.line_index};
      EXPECT_EQ(out.count(k), 0u) << "second result for job " << k.first << " line " << k.second;
      out[k] = std::move(res);
    }
  }
  EXPECT_FALSE(w.has_work());
  return out;
}

void expect_same(const BatchResult& a, const BatchResult& b) {
  EXPECT_EQ(a.job_id, b.job_id);
  EXPECT_EQ(a.line_index, b.line_index);
  EXPECT_EQ(a.custom_id, b.custom_id);
  EXPECT_EQ(a.ok, b.ok);
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(a.completion_tokens, b.completion_tokens);
  EXPECT_EQ(a.error_code, b.error_code);
  EXPECT_EQ(a.error_message, b.error_message);
  ASSERT_EQ(a.choices.size(), b.choices.size());
  for (std::size_t i = 0; i < a.choices.size(); ++i) {
    EXPECT_EQ(a.choices[i].index, b.choices[i].index);
    EXPECT_EQ(a.choices[i].text, b.choices[i].text) << "choice " << i;
    EXPECT_EQ(a.choices[i].finish_reason, b.choices[i].finish_reason);
    EXPECT_EQ(a.choices[i].token_ids, b.choices[i].token_ids) << "choice " << i;
  }
}

TEST(BatchWorker, ReferenceGreedyPrompts) {
  const auto ref = testing_support::load_stories_reference();
  ASSERT_EQ(ref.size(), 3u);
  BatchWorker w = make_worker();
  for (std::size_t i = 0; i < ref.size(); ++i) w.submit(line(1, i, ref[i].prompt));
  // The same prompts again, given as token ids (BOS included), in job 2.
  for (std::size_t i = 0; i < ref.size(); ++i) {
    BatchRequest r = line(2, i, "");
    r.prompt_token_ids = ref[i].prompt_ids;
    w.submit(std::move(r));
  }
  const auto out = run_all(w);
  ASSERT_EQ(out.size(), 2 * ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    SCOPED_TRACE(ref[i].prompt);
    const BatchResult& r = out.at({1, i});
    ASSERT_TRUE(r.ok) << r.error_code << ": " << r.error_message;
    EXPECT_EQ(r.custom_id, "job1-line" + std::to_string(i));
    ASSERT_EQ(r.choices.size(), 1u);
    EXPECT_EQ(r.choices[0].index, 0);
    EXPECT_EQ(r.choices[0].token_ids, ref[i].generated_ids);
    EXPECT_EQ(ref[i].prompt + r.choices[0].text, ref[i].full_text);
    EXPECT_EQ(r.choices[0].finish_reason, "length");
    EXPECT_EQ(r.prompt_tokens, static_cast<int>(ref[i].prompt_ids.size()));
    EXPECT_EQ(r.completion_tokens, kMaxTokens);

    const BatchResult& by_ids = out.at({2, i});
    ASSERT_TRUE(by_ids.ok);
    EXPECT_EQ(by_ids.choices[0].token_ids, ref[i].generated_ids);
    EXPECT_EQ(by_ids.choices[0].text, r.choices[0].text);
    EXPECT_EQ(by_ids.prompt_tokens, r.prompt_tokens);
  }
}

TEST(BatchWorker, TokenIdsOnlyWhenAsked) {
  BatchWorker w = make_worker();
  BatchRequest r = line(1, 0, "Once upon a time", 0.0f, 8);
  r.return_token_ids = false;
  w.submit(r);
  const auto out = run_all(w);
  const BatchResult& res = out.at({1, 0});
  ASSERT_TRUE(res.ok);
  EXPECT_TRUE(res.choices[0].token_ids.empty());
  EXPECT_FALSE(res.choices[0].text.empty());
  EXPECT_EQ(res.completion_tokens, 8);
}

TEST(BatchWorker, SeededChoicesDifferAndReproduce) {
  auto run = [](std::uint64_t job) {
    BatchWorker w = make_worker();
    BatchRequest r = seeded(line(job, 5, "Once upon a time", 1.0f), 1234);
    r.n = 3;
    w.submit(r);
    auto out = run_all(w);
    return out.at({job, 5});
  };
  const BatchResult a = run(1);
  ASSERT_TRUE(a.ok);
  ASSERT_EQ(a.choices.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.choices[static_cast<std::size_t>(i)].index, i);
  EXPECT_NE(a.choices[0].token_ids, a.choices[1].token_ids);
  EXPECT_NE(a.choices[0].token_ids, a.choices[2].token_ids);
  EXPECT_NE(a.choices[1].token_ids, a.choices[2].token_ids);
  EXPECT_EQ(a.prompt_tokens, 5);  // counted once, not per choice
  int sum = 0;
  for (const BatchChoice& c : a.choices) sum += static_cast<int>(c.token_ids.size());
  EXPECT_EQ(a.completion_tokens, sum);

  // Same line on a fresh worker: identical.
  expect_same(a, run(1));

  // Choice i samples with seed + i: choice 1 of seed 1234 is choice 0 of seed 1235.
  BatchWorker w = make_worker();
  w.submit(seeded(line(1, 5, "Once upon a time", 1.0f), 1235));
  const auto single = run_all(w);
  EXPECT_EQ(single.at({1, 5}).choices[0].token_ids, a.choices[1].token_ids);
  EXPECT_EQ(single.at({1, 5}).choices[0].text, a.choices[1].text);
}

TEST(BatchWorker, UnseededChoicesDeriveFromJobLineChoice) {
  auto run = [](std::uint64_t job, std::uint64_t index, int extra_before) {
    BatchWorker w = make_worker();
    // Lines submitted before shift the engine's internal request ids.
    for (int i = 0; i < extra_before; ++i) w.submit(line(99, static_cast<std::uint64_t>(i), "The cat", 1.0f, 4));
    BatchRequest r = line(job, index, "Once upon a time", 1.0f);
    r.n = 2;
    w.submit(r);
    auto out = run_all(w);
    return out.at({job, index});
  };
  const BatchResult a = run(3, 7, 0);
  ASSERT_TRUE(a.ok);
  ASSERT_EQ(a.choices.size(), 2u);
  EXPECT_NE(a.choices[0].token_ids, a.choices[1].token_ids);
  expect_same(a, run(3, 7, 5));  // engine request ids differ: same result
  const BatchResult other_line = run(3, 8, 0);
  const BatchResult other_job = run(4, 7, 0);
  EXPECT_NE(other_line.choices[0].token_ids, a.choices[0].token_ids);
  EXPECT_NE(other_job.choices[0].token_ids, a.choices[0].token_ids);

  // The SplitMix64 chain mix_seed(mix_seed(mix_seed("Shardlin", job), line), choice),
  // pinned to values of an independent Python implementation: every worker
  // kind must derive these same seeds, or a line retried elsewhere would
  // sample other tokens.
  EXPECT_EQ(BatchWorker::derive_choice_seed(3, 7, 0), 0x4b4cd0b74ea59154ull);
  EXPECT_EQ(BatchWorker::derive_choice_seed(3, 7, 1), 0xd998535e4a7644fbull);
  EXPECT_EQ(BatchWorker::derive_choice_seed(7, 3, 0), 0xe2bd1dc52d3bffdeull);
  EXPECT_EQ(BatchWorker::derive_choice_seed(0, 0, 0), 0x20c03a0da7d7c0c7ull);
  EXPECT_NE(BatchWorker::derive_choice_seed(3, 7, 0), BatchWorker::derive_choice_seed(3, 7, 1));
  EXPECT_NE(BatchWorker::derive_choice_seed(3, 7, 0), BatchWorker::derive_choice_seed(7, 3, 0));
}

TEST(BatchWorker, LineResultIndependentOfOtherLinesAndOrder) {
  // Target lines: greedy, seeded n=2 with top_p, unseeded n=2.
  std::vector<BatchRequest> targets;
  targets.push_back(line(7, 3, "Once upon a time"));
  {
    BatchRequest r = seeded(line(7, 4, "Tom had a red ball", 0.9f), 77);
    r.params.top_p = 0.9f;
    r.n = 2;
    targets.push_back(r);
  }
  {
    BatchRequest r = line(8, 0, "The little bird sang a song", 0.8f, 40);
    r.params.top_k = 20;
    r.n = 2;
    targets.push_back(r);
  }

  // Alone, each on its own fresh worker.
  std::vector<BatchResult> alone;
  for (const BatchRequest& t : targets) {
    BatchWorker w = make_worker("alone");
    w.submit(t);
    auto out = run_all(w);
    ASSERT_EQ(out.size(), 1u);
    alone.push_back(out.begin()->second);
    ASSERT_TRUE(alone.back().ok);
  }

  // Among 50 other lines (other jobs, prompts, lengths, params), shuffled,
  // the targets in the middle, on a worker whose small cache forces preemption.
  const char* starts[] = {"The cat", "A big dog ran to the", "Sam and Mia went to the park and", "One day",
                          "There was a boy who liked to play with his red car in the",
                          "Lily wanted to bake a cake for her mom"};
  std::vector<BatchRequest> all;
  for (int i = 0; i < 50; ++i) {
    BatchRequest r = line(100 + static_cast<std::uint64_t>(i % 3), static_cast<std::uint64_t>(i), starts[i % 6],
                          i % 4 == 0 ? 0.0f : 0.7f + 0.05f * static_cast<float>(i % 5), 16 + i % 40);
    if (i % 2 == 0) r = seeded(std::move(r), 5000 + static_cast<std::uint64_t>(i));
    r.n = 1 + i % 3;
    r.params.repetition_penalty = i % 7 == 0 ? 1.1f : 1.0f;
    all.push_back(r);
  }
  std::mt19937 rng(2024);
  std::shuffle(all.begin(), all.end(), rng);
  all.insert(all.begin() + 20, targets[2]);
  all.insert(all.begin() + 11, targets[0]);
  all.insert(all.begin() + 37, targets[1]);

  BatchWorker busy = make_worker("busy", 40u * 16u * 1280u);  // 40 blocks
  // Submit in two waves, the second after the first is running.
  for (std::size_t i = 0; i < 30; ++i) busy.submit(all[i]);
  std::map<Key, BatchResult> out;
  for (int s = 0; s < 5; ++s) {
    auto r = busy.step();
    ASSERT_TRUE(r.ok());
    for (BatchResult& res : r.value()) out[{res.job_id, res.line_index}] = std::move(res);
  }
  for (std::size_t i = 30; i < all.size(); ++i) busy.submit(all[i]);
  for (auto& [k, v] : run_all(busy)) out[k] = std::move(v);
  ASSERT_EQ(out.size(), all.size());
  EXPECT_GT(busy.status().num_preemptions, 0u)
      << "the cache (" << busy.status().kv_blocks_total << " blocks) was meant to force preemption";

  for (std::size_t i = 0; i < targets.size(); ++i) {
    SCOPED_TRACE("target " + std::to_string(i));
    expect_same(alone[i], out.at({targets[i].job_id, targets[i].line_index}));
  }
}

TEST(BatchWorker, ErrorResultsComeBackWhileOtherLinesRun) {
  BatchWorker w = make_worker();
  const int max_len = w.engine().config().max_model_len;
  ASSERT_EQ(max_len, 512);  // stories260K max_position_embeddings

  w.submit(line(1, 0, "Once upon a time"));
  BatchRequest too_long = line(1, 1, "Once upon a time", 0.0f, 600);
  w.submit(too_long);
  w.submit(line(1, 2, ""));  // no prompt
  BatchRequest bad_id = line(1, 3, "");
  bad_id.prompt_token_ids = {1, 403, 4096};
  w.submit(bad_id);
  BatchRequest bad_n = line(1, 4, "Once upon a time");
  bad_n.n = 0;
  w.submit(bad_n);
  BatchRequest bad_param = line(1, 5, "Once upon a time");
  bad_param.params.top_p = 1.5f;
  w.submit(bad_param);
  // Exactly at the limit is fine: 5 prompt tokens + 507 = 512.
  BatchRequest at_limit = line(1, 6, "Once upon a time", 0.0f, max_len - 5);
  at_limit.params.ignore_eos = true;
  w.submit(at_limit);
  w.submit(line(1, 7, "Once upon a time", 0.0f, max_len - 4));

  EXPECT_EQ(w.status().num_ready, 6);
  auto first = w.step();
  ASSERT_TRUE(first.ok());
  std::map<Key, BatchResult> errors;
  for (BatchResult& r : first.value()) {
    EXPECT_FALSE(r.ok) << "line " << r.line_index << " finished in one step";
    errors[{r.job_id, r.line_index}] = std::move(r);
  }
  ASSERT_EQ(errors.size(), 6u);
  EXPECT_TRUE(w.has_work());  // lines 0 and 6 still running

  const BatchResult& e1 = errors.at({1, 1});
  EXPECT_EQ(e1.error_code, "context_length_exceeded");
  EXPECT_EQ(e1.custom_id, "job1-line1");
  EXPECT_EQ(e1.error_message,
            "This model's maximum context length is 512 tokens. However, you requested 605 tokens "
            "(5 in the messages, 600 in the completion). Please reduce the length of the messages or completion.");
  EXPECT_EQ(errors.at({1, 2}).error_code, "missing_prompt");
  EXPECT_EQ(errors.at({1, 3}).error_code, "invalid_parameter");
  EXPECT_NE(errors.at({1, 3}).error_message.find("4096"), std::string::npos) << errors.at({1, 3}).error_message;
  EXPECT_EQ(errors.at({1, 4}).error_code, "invalid_parameter");
  EXPECT_EQ(errors.at({1, 5}).error_code, "invalid_parameter");
  EXPECT_NE(errors.at({1, 5}).error_message.find("top_p"), std::string::npos) << errors.at({1, 5}).error_message;
  const BatchResult& e7 = errors.at({1, 7});
  EXPECT_EQ(e7.error_code, "context_length_exceeded");
  EXPECT_NE(e7.error_message.find("requested 513 tokens (5 in the messages, 508 in the completion)"),
            std::string::npos)
      << e7.error_message;
  for (const auto& [k, r] : errors) {
    EXPECT_TRUE(r.choices.empty());
    EXPECT_EQ(r.prompt_tokens, 0);
  }

  const auto rest = run_all(w);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_TRUE(rest.at({1, 0}).ok);
  EXPECT_EQ(rest.at({1, 0}).completion_tokens, kMaxTokens);
  const BatchResult& full = rest.at({1, 6});
  ASSERT_TRUE(full.ok);
  EXPECT_EQ(full.prompt_tokens + full.completion_tokens, max_len);  // ran to the context limit
  EXPECT_EQ(full.choices[0].finish_reason, "length");
  EXPECT_EQ(w.status().lines_failed, 6u);
  EXPECT_EQ(w.status().lines_done, 2u);
}

TEST(BatchWorker, MegabytePromptRefusedFromItsLengthBeforeTokenizing) {
  BatchWorker w = make_worker();
  ASSERT_EQ(w.engine().config().max_model_len, 512);
  std::string huge;
  while (huge.size() < (4u << 20)) huge += "Once upon a time, there was a little girl named Lily. ";
  w.submit(line(1, 0, huge, 0.0f, 16));
  // Just over the pre-check size but short enough to fit is tokenized and runs.
  std::string fits(BatchWorker::kPrecheckPromptBytes + 10, ' ');
  fits += "Once upon a time";
  w.submit(line(1, 1, fits, 0.0f, 4));
  // Short and too long: tokenized, vLLM's exact count.
  w.submit(line(1, 2, "Once upon a time", 0.0f, 600));
  const auto out = run_all(w);
  ASSERT_EQ(out.size(), 3u);
  const BatchResult& refused = out.at({1, 0});
  EXPECT_EQ(refused.error_code, "context_length_exceeded");
  // "at least": the count came from the bound, not from tokenizing 4 MiB.
  EXPECT_NE(refused.error_message.find("However, you requested at least "), std::string::npos)
      << refused.error_message;
  EXPECT_NE(refused.error_message.find(" in the messages, 16 in the completion)"), std::string::npos)
      << refused.error_message;
  EXPECT_TRUE(out.at({1, 1}).ok) << out.at({1, 1}).error_message;
  EXPECT_EQ(out.at({1, 2}).error_code, "context_length_exceeded");
  EXPECT_EQ(out.at({1, 2}).error_message.find("at least"), std::string::npos) << out.at({1, 2}).error_message;
}

TEST(BatchWorker, ErrorResultsWithoutStepping) {
  BatchWorker w = make_worker();
  w.submit(line(1, 0, ""));
  w.submit(line(1, 1, "Once upon a time", 0.0f, 4));
  auto ready = w.take_finished();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].error_code, "missing_prompt");
  EXPECT_EQ(w.status().steps_done, 0u);
  EXPECT_TRUE(w.take_finished().empty());
  const auto out = run_all(w);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out.at({1, 1}).ok);
}

TEST(BatchWorker, DuplicateSubmitYieldsOneResult) {
  BatchWorker w = make_worker();
  w.submit(line(1, 0, "Once upon a time", 0.0f, 8));
  w.submit(line(1, 0, "Once upon a time", 0.0f, 8));
  w.submit(line(1, 1, ""));
  w.submit(line(1, 1, ""));
  EXPECT_EQ(w.status().num_waiting, 1);
  const auto out = run_all(w);  // fails on a second result for a line
  EXPECT_EQ(out.size(), 2u);
  // Once returned, the same line may be run again (a retry after a lost result).
  w.submit(line(1, 0, "Once upon a time", 0.0f, 8));
  const auto again = run_all(w);
  ASSERT_EQ(again.size(), 1u);
  expect_same(out.at({1, 0}), again.at({1, 0}));
}

TEST(BatchWorker, CancelJobDropsOnlyThatJob) {
  BatchWorker w = make_worker();
  for (std::uint64_t i = 0; i < 6; ++i) {
    BatchRequest a = line(1, i, "Once upon a time", 0.8f);
    a.n = 2;
    w.submit(a);
    w.submit(line(2, i, "Tom had a red ball", 0.8f, 24));
  }
  w.submit(line(1, 6, ""));  // a queued error result of job 1: dropped too
  for (int s = 0; s < 3; ++s) {
    auto r = w.step();
    ASSERT_TRUE(r.ok());
    for (const BatchResult& res : r.value()) EXPECT_FALSE(res.ok && res.job_id == 1);
  }
  EXPECT_EQ(w.cancel_job(1), 6u);  // the error result was taken by the first step
  EXPECT_EQ(w.cancel_job(1), 0u);
  EXPECT_EQ(w.cancel_job(42), 0u);
  EXPECT_EQ(w.status().num_lines, 6);

  const auto out = run_all(w);
  ASSERT_EQ(out.size(), 6u);
  for (const auto& [k, r] : out) {
    EXPECT_EQ(k.first, 2u);
    EXPECT_TRUE(r.ok);
  }
  const WorkerStatusSnapshot st = w.status();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.num_running + st.num_waiting, 0);

  // A ready (not yet taken) error result of a cancelled job is dropped.
  w.submit(line(3, 0, ""));
  w.submit(line(4, 0, ""));
  EXPECT_EQ(w.cancel_job(3), 1u);
  const auto ready = w.take_finished();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].job_id, 4u);
}

TEST(BatchWorker, CancelledResultsMatchUncancelledRun) {
  // Cancelling one job mid-flight does not change another job's results.
  auto run = [](bool with_cancel) {
    BatchWorker w = make_worker();
    for (std::uint64_t i = 0; i < 8; ++i) {
      w.submit(line(1, i, "Once upon a time", 0.8f));
      w.submit(line(2, i, "Sam and Mia went to the park", 0.9f, 30));
    }
    std::map<Key, BatchResult> out;
    if (with_cancel) {
      for (int s = 0; s < 4; ++s) {
        auto r = w.step();
        EXPECT_TRUE(r.ok());
        for (BatchResult& res : r.value()) out[{res.job_id, res.line_index}] = std::move(res);
      }
      w.cancel_job(1);
    }
    for (auto& [k, v] : run_all(w)) out[k] = std::move(v);
    return out;
  };
  const auto plain = run(false);
  const auto cancelled = run(true);
  for (std::uint64_t i = 0; i < 8; ++i) expect_same(plain.at({2, i}), cancelled.at({2, i}));
  for (const auto& [k, r] : cancelled) EXPECT_EQ(k.first, 2u);
}

TEST(BatchWorker, StatusCounts) {
  BatchWorker w = make_worker("cpu7");
  WorkerStatusSnapshot st = w.status();
  EXPECT_EQ(st.name, "cpu7");
  EXPECT_GT(st.kv_blocks_total, 0);
  EXPECT_EQ(st.block_size, 16);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.steps_done, 0u);
  EXPECT_FALSE(w.has_work());

  BatchRequest a = seeded(line(1, 0, "Once upon a time", 0.8f, 20), 9);
  a.n = 3;
  w.submit(a);
  w.submit(line(1, 1, "Tom had a red ball", 0.0f, 10));
  w.submit(line(1, 2, ""));
  st = w.status();
  EXPECT_EQ(st.num_waiting, 4);  // 3 choices + 1
  EXPECT_EQ(st.num_running, 0);
  EXPECT_EQ(st.num_lines, 2);
  EXPECT_EQ(st.num_ready, 1);
  EXPECT_TRUE(w.has_work());

  auto r = w.step();
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value().size(), 1u);  // the missing_prompt error
  st = w.status();
  EXPECT_EQ(st.steps_done, 1u);
  EXPECT_EQ(st.num_running, 4);
  EXPECT_EQ(st.num_waiting, 0);
  EXPECT_GT(st.kv_blocks_used, 0);
  EXPECT_EQ(st.lines_failed, 1u);
  EXPECT_EQ(st.num_ready, 0);

  std::uint64_t steps = 1;
  int completion = 0, prompt = 0;
  while (w.has_work()) {
    auto s = w.step();
    ASSERT_TRUE(s.ok());
    ++steps;
    for (const BatchResult& res : s.value()) {
      completion += res.completion_tokens;
      prompt += res.prompt_tokens * static_cast<int>(res.choices.size());
    }
  }
  st = w.status();
  EXPECT_EQ(st.steps_done, steps);
  EXPECT_EQ(st.lines_done, 2u);
  EXPECT_EQ(st.lines_failed, 1u);
  EXPECT_EQ(st.generated_tokens, static_cast<std::uint64_t>(completion));
  EXPECT_EQ(st.prompt_tokens, static_cast<std::uint64_t>(prompt));
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.num_running, 0);
  EXPECT_EQ(st.num_waiting, 0);
  EXPECT_EQ(st.num_lines, 0);
}

TEST(BatchWorker, DemoDatasetRunsToCompletion) {
  // deploy/demo/prompts.jsonl (KJV verse openings, see SOURCE.md): every line
  // is a valid completion request for stories260K and completes.
  std::ifstream in(std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/prompts.jsonl");
  ASSERT_TRUE(in.good());
  BatchWorker w = make_worker("demo", 8u << 20);
  std::string text;
  std::uint64_t index = 0;
  int greedy = 0;
  while (std::getline(in, text)) {
    const nlohmann::json j = nlohmann::json::parse(text);
    ASSERT_EQ(j.at("url"), "/v1/completions");
    const auto& body = j.at("body");
    ASSERT_EQ(body.at("model"), "stories260K");
    BatchRequest r = line(1, index++, body.at("prompt").get<std::string>(), body.at("temperature").get<float>(),
                          body.at("max_tokens").get<int>());
    r.custom_id = j.at("custom_id").get<std::string>();
    r = seeded(std::move(r), body.at("seed").get<std::uint64_t>());
    greedy += r.params.temperature == 0.0f ? 1 : 0;
    w.submit(std::move(r));
  }
  EXPECT_GE(index, 1000u);
  EXPECT_GT(greedy, 0);
  const auto out = run_all(w);
  ASSERT_EQ(out.size(), index);
  std::map<std::string, int> ids;
  for (const auto& [k, r] : out) {
    ASSERT_TRUE(r.ok) << r.custom_id << ": " << r.error_code << ": " << r.error_message;
    EXPECT_GT(r.completion_tokens, 0);
    ++ids[r.custom_id];
  }
  EXPECT_EQ(ids.size(), out.size());  // custom_ids are unique
}

}  // namespace
}  // namespace shardline::worker

namespace shardline::worker {
namespace worker_batch_worker_test {

// DéjàVu recovery at the worker level: a worker streams its KV to a store
// (a MemoryKvTarget behind a KvStreamer) and dies mid-job; a fresh worker
// resumes each line from the tokens and KV the store had (merged the way
// the KV store's fetch does), computes only the positions after them, and
// returns results byte-identical to an undisturbed run.
TEST(BatchWorker, ResumedLinesFromStreamedKvAreByteIdentical) {
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily wanted to", "One day"};
  auto make_lines = [&] {
    std::vector<BatchRequest> lines;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      BatchRequest r = seeded(line(3, i, prompts[i], 0.8f, 40), 900 + i);
      r.n = 2;
      lines.push_back(std::move(r));
    }
    return lines;
  };
  BatchWorker reference = make_worker("ref");
  for (auto& l : make_lines()) reference.submit(std::move(l));
  const auto want = run_all(reference);
  ASSERT_EQ(want.size(), prompts.size());

  // The worker that dies: 12 steps, with its streamed KV drained to the store.
  auto store = std::make_shared<kvstore::MemoryKvTarget>();
  std::mutex mu;
  std::map<std::uint64_t, std::vector<std::int32_t>> tokens;  // KV request key -> known tokens
  std::map<std::uint64_t, int> prompt_len;
  std::vector<kvstore::KvChunkKey> keys;
  {
    KvStreamer streamer(store, {}, [&](std::vector<QueuedIncrement> flushed) {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& inc : flushed) {
        auto& t = tokens[inc.key.request_id];
        t.resize(static_cast<std::size_t>(inc.key.range.token_begin));  // positions before it are known
        t.insert(t.end(), inc.token_ids.begin(), inc.token_ids.end());
        prompt_len[inc.key.request_id] = inc.num_prompt_tokens;
        keys.push_back(inc.key);
      }
    });
    BatchWorker doomed = make_worker("doomed");
    doomed.set_kv_streamer(&streamer);
    for (auto& l : make_lines()) doomed.submit(std::move(l));
    for (int i = 0; i < 12; ++i) {
      auto r = doomed.step();
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(r->empty()) << "nothing finishes this early";
    }
    ASSERT_TRUE(streamer.drain(std::chrono::seconds(10)));
    EXPECT_GT(doomed.status().kv_streamed_bytes, 0u);
  }  // the worker is gone; the store is not

  // What the store can restore per choice: its merged KV and tokens.
  const kvstore::KvModelShape shape = reference.engine().kv_io().shape();
  std::map<std::uint64_t, std::unique_ptr<testing_support::HostTier>> tiers;
  for (const auto& k : keys) {
    auto& tier = tiers[k.request_id];
    if (!tier) tier = std::make_unique<testing_support::HostTier>(shape);
    auto chunk = store->fetch(k);
    ASSERT_TRUE(chunk.ok());
    tier->merge(k.range, *chunk);
  }
  BatchWorker resumed = make_worker("resumed");
  std::uint64_t expected_restored = 0;
  for (auto& l : make_lines()) {
    l.resume.resize(2);
    for (int c = 0; c < 2; ++c) {
      const std::uint64_t key = kv_request_key(l.line_index, c);
      ASSERT_EQ(tiers.count(key), 1u);
      const int r = tiers[key]->covered;
      const auto& t = tokens[key];
      ChoiceResume& cr = l.resume[static_cast<std::size_t>(c)];
      cr.output_ids.assign(t.begin() + prompt_len[key], t.end());
      ASSERT_FALSE(cr.output_ids.empty());
      ASSERT_EQ(static_cast<int>(t.size()), r + 1) << "the store knows one token past its KV";
      cr.num_kv_tokens = r;
      cr.kv_chunk = tiers[key]->prefix(r);
      expected_restored += static_cast<std::uint64_t>(r);
    }
    resumed.submit(std::move(l));
  }
  const auto got = run_all(resumed);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, w] : want) {
    const BatchResult& g = got.at(k);
    ASSERT_EQ(g.choices.size(), w.choices.size());
    for (std::size_t c = 0; c < w.choices.size(); ++c) {
      EXPECT_EQ(g.choices[c].text, w.choices[c].text) << "line " << k.second << " choice " << c;
      EXPECT_EQ(g.choices[c].token_ids, w.choices[c].token_ids) << "line " << k.second << " choice " << c;
      EXPECT_EQ(g.choices[c].finish_reason, w.choices[c].finish_reason);
    }
    EXPECT_EQ(g.completion_tokens, w.completion_tokens);
  }
  EXPECT_EQ(resumed.status().kv_restored_tokens, expected_restored);
  EXPECT_EQ(resumed.status().kv_resume_fallbacks, 0u);
}

}  // namespace
}  // namespace shardline::worker
